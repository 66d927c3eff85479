"""Compiled ground truth (opt-in: needs ``pip install -e '.[tracr]'``, which pulls jax).

Three RASP programs are compiled by tracr and converted to headlens GPTs; the conversion must give
tracr's outputs, the RASP graph's edges are the truth, and exact edge patching and discovery are
checked against it under mean and resample ablation. ``analyses/tracr_truth.py`` prints the figures.
"""

from __future__ import annotations

import pytest

pytest.importorskip("tracr", reason="tracr is not installed (opt-in: pip install -e '.[tracr]')")

import headlens
from headlens.circuits.tracr import edge_scores, programs, roc_auc


@pytest.fixture(scope="module")
def compiled():
    return {name: make() for name, make in programs().items()}


def test_the_rasp_graphs_name_the_edges_a_reader_of_the_programs_expects(compiled):
    ind = compiled["induction"].truth
    assert ("L1H0", "L2H0", "k") in ind  # the previous-token head feeds the induction head's key
    assert ("mlp0", "L1H0", "q") in ind  # indices - 1, computed by an MLP, is the previous-token query
    assert {("embed", "L2H0", "q"), ("embed", "L2H0", "v"), ("L2H0", "logits", "resid")} <= ind
    assert ("L1H0", "L2H0", "q") not in ind and ("L1H0", "L2H0", "v") not in ind
    rev = compiled["reverse"].truth
    assert {("mlp2", "L3H0", "q"), ("embed", "L3H0", "k"), ("embed", "L3H0", "v")} <= rev


def test_the_converted_model_is_tracr_s(compiled):
    """compile_program already ran 16 prompts through both; one more, by hand, for the reader."""
    c = compiled["reverse"]
    logits = c.model(c.model.to_tokens("abcd"))
    assert c.model.tokenizer.decode(logits[0, 1:5].argmax(-1)) == "dcba"
    assert c.model.cfg.d_attn != c.model.cfg.d_model and not c.model.is_causal


@pytest.mark.parametrize("method", ["mean", "resample"])
def test_every_edge_with_an_effect_is_a_true_edge_and_the_auc_beats_chance(compiled, method):
    for name, c in compiled.items():
        df = edge_scores(c, method, n_prompts=16)
        moved = df[df.effect.abs() > 1e-6]
        assert moved.true.all(), (name, moved[~moved.true])  # no false positive at any threshold
        assert roc_auc(df.effect.abs(), df.true) > 0.6, name
        # the misses are edges the ablation left untested (positions are the same in every prompt),
        # or reverse's length head, whose query and key select TRUE: their values cannot matter
        missed = df[df.true & (df.effect.abs() <= 1e-6)]
        assert (~missed.tested | (missed.receiver == "L0H0")).all(), (name, missed)


@pytest.mark.parametrize("method", ["mean", "resample"])
def test_discovery_finds_the_induction_programs_k_composition_and_nothing_false(compiled, method):
    c = compiled["induction"]
    df = headlens.circuit(c.model, metric="kl", method=method, prompts=c.prompts(16), n_prompts=16, n_boot=200)
    found = {(r.sender, r.receiver, r.input) for r in df.itertuples()}
    assert ("L1H0", "L2H0", "k") in found
    assert found <= c.truth
    assert df.attrs["verdict"] == "found" and df.attrs["faithfulness"] > 0.95


def test_classify_names_the_compiled_heads(compiled):
    """The induction program's heads are, by construction, a previous-token head and an induction head."""
    df = headlens.classify(compiled["induction"].model, n_prompts=16)
    labelled = {(int(r.layer), int(r.head), r.detector) for r in df[df.label].itertuples()}
    assert {(1, 0, "previous_token"), (2, 0, "induction")} <= labelled
    reverse = headlens.classify(compiled["reverse"].model, n_prompts=8)  # bidirectional, padded probes
    assert len(reverse) and reverse.score.notna().any()
