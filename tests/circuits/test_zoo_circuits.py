"""The zoo's circuits, as their cards state them (induction-2l is in test_edges.py and test_discovery.py)."""

from __future__ import annotations

import pytest
import torch

import headlens
from headlens.circuits.edges import significant_mask
from headlens.zoo import ZOO


def _zoo(name: str):
    if not (name in ZOO and ZOO[name].available):
        pytest.skip(f"zoo model {name}: weights not installed")
    torch.set_num_threads(min(2, torch.get_num_threads()))
    return headlens.load(name)


def test_llama_induction_previous_token_pair_feeds_every_induction_key():
    model = _zoo("llama-induction")
    df = headlens.circuit(model, receivers="L1H0,L1H1,L1H2,L1H3", senders="L0H0,L0H1,L0H2,L0H3", inputs="k",
                          n_prompts=16, n_control=3)
    sig = df[significant_mask(df)]
    for s in ("L0H0", "L0H1"):
        for r in ("L1H0", "L1H1", "L1H2", "L1H3"):
            row = sig[(sig.sender == s) & (sig.receiver == r)]
            assert len(row) == 1 and row.effect.iloc[0] > 0.3 and row.composition_z.iloc[0] > 5, (s, r)
    assert set(df.kv_head) == {0, 1}


def test_code_discovery_finds_its_induction_circuit():
    model = _zoo("code")
    df = headlens.circuit(model, metric="repeated_loss", n_prompts=16)
    assert {"L0H0", "L2H3"} <= set(df.attrs["roots"])
    assert ((df.sender == "L0H0") & (df.receiver == "L2H3") & (df.input == "k")).any()
    assert df.attrs["faithfulness"] > 0.7


def test_disagree_is_calibrated_on_the_models_own_pairs():
    """The rotation null alone flags almost every edge of a trained model (its weights sit far above it):
    `disagree` places each edge among the model's own head pairs, so it is rare, and it names the issue's
    case: induction-2l's L0H2 -> L1H1.k moves the loss by nats without standing out in the weights."""
    model = _zoo("induction-2l")
    df = headlens.circuit(model, receivers="L1H0,L1H1,L1H2,L1H3", senders="L0H0,L0H1,L0H2,L0H3", method="zero",
                          n_prompts=16, n_boot=200)
    by = {(r.sender, r.receiver, r.input): r.disagree for r in df.itertuples()}
    assert by["L0H2", "L1H1", "k"] and not by["L0H0", "L1H1", "k"] and not by["L0H0", "L1H1", "q"]
    assert (df.composition_z > 3).mean() > 0.5  # what the null alone would have flagged: most non-edges
    assert df.disagree.mean() < 0.25
