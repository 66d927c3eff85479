"""Edge patching on native models: the fast path equals the naive hook-per-edge reference, planted and zoo truths."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from headlens.circuits.api import circuit, setup
from headlens.circuits.edges import significant_mask
from headlens.circuits.engine import edge_values
from headlens.circuits.nodes import CircuitError, all_senders, make_edges, parse_nodes
from headlens.circuits.senders import METHODS
from headlens.testing import PLANTED_EDGES, PLANTED_ZERO_EDGES, planted_circuit_model
from tests.conftest import make_gpt

TOL = 1e-5


@pytest.mark.parametrize("method", METHODS)
def test_fast_equals_naive_on_a_gpt_with_layernorm_and_mlps(method):
    model = make_gpt(n_layers=3, init_range=0.2)  # far from uniform: edges move the metric
    s = setup(model, "repeated_loss", method, n_prompts=3, seed=1)
    recv = parse_nodes("L1H0,L2H3,logits", model)
    edges = make_edges(model, recv, None, "qkv")
    assert {e.sender.kind for e in edges} == {"embed", "head", "mlp"}
    fast = edge_values(model, s.task, ["repeated_loss", "first_half_loss"], edges, s.deltas, fast=True, max_tokens=500)
    naive = edge_values(model, s.task, ["repeated_loss", "first_half_loss"], edges, s.deltas, fast=False)
    diff = max(float(np.abs(fast[1][k] - naive[1][k]).max()) for k in naive[1])
    assert diff < TOL
    moved = sum(float(np.abs(naive[1][e, "repeated_loss"] - naive[0]["repeated_loss"]).max()) > 1e-3 for e in edges)
    assert moved > len(edges) // 2  # the patches do something: the comparison is not of two clean runs


def test_naive_reference_is_a_full_forward_with_only_that_input_changed():
    """A zero delta leaves the logits clean; a q edge into the last layer acts only where the delta is."""
    model = make_gpt(n_layers=2, init_range=0.2)
    s = setup(model, "repeated_loss", "zero", n_prompts=2)
    e = make_edges(model, parse_nodes("L1H2", model), parse_nodes("L0H1", model), "q")[0]
    d = s.deltas.delta(e.sender)
    from headlens.circuits.native import naive_logits

    with torch.no_grad():
        zero = naive_logits(model, s.task, e, torch.zeros_like(d))
        clean = model(s.task.tokens)
        d[:, 5:] = 0
        early = naive_logits(model, s.task, e, d)
    assert torch.allclose(zero, clean, atol=1e-6)  # the head's rows projected alone: rounding only
    assert torch.allclose(early[:, 5:], clean[:, 5:], atol=1e-5)  # last layer: a clean query reads clean keys
    assert not torch.allclose(early[:, :5], clean[:, :5], atol=1e-3)  # q edges act at the receiver's own positions


@pytest.mark.parametrize("method", ["mean", "resample", "zero"])
def test_planted_circuit_known_edges_and_known_zeros(method):
    model = planted_circuit_model()
    df = circuit(model, receivers="L1H0", inputs="qkv", method=method, n_prompts=8, n_control=3)
    sig = significant_mask(df)
    by = {(r.sender, r.receiver, r.input): (r.effect, s) for r, s in zip(df.itertuples(), sig, strict=True)}
    for edge in PLANTED_EDGES:
        assert by[edge][0] > 0.5 and by[edge][1], edge
    for edge in PLANTED_ZERO_EDGES:
        assert by[edge] == (0.0, False), edge
    assert set(df[sig].apply(lambda r: (r.sender, r.receiver, r.input), axis=1)) == set(PLANTED_EDGES)


def test_bad_names_and_order_are_refused():
    model = make_gpt()
    with pytest.raises(CircuitError, match="unknown node 'L1X0'"):
        circuit(model, receivers="L1X0")
    with pytest.raises(CircuitError, match="out of range"):
        circuit(model, receivers="L7H0")
    with pytest.raises(CircuitError, match="runs after"):
        circuit(model, receivers="L0H1", senders="L1H0")
    edges = make_edges(model, parse_nodes("L0H1,logits", model), parse_nodes("L1H0", model), "q")
    assert [e.name for e in edges] == ["L1H0->logits.resid"]  # fed where it can be, skipped where not
    with pytest.raises(CircuitError, match="attention-only"):
        circuit(make_gpt(attn_only=True, normalization="none"), receivers="L1H0", senders="mlp0")


def test_senders_cover_embed_heads_and_mlps_in_forward_order():
    model = make_gpt(n_layers=2)
    names = [n.name for n in all_senders(model)]
    assert names[:2] == ["embed", "L0H0"] and names[5] == "mlp0" and names[-1] == "mlp1"
    edges = make_edges(model, parse_nodes("L1H0", model), None, "k")
    assert [e.sender.name for e in edges] == ["embed", "L0H0", "L0H1", "L0H2", "L0H3", "mlp0"]


def test_same_seed_same_table():
    model = make_gpt()
    a = circuit(model, receivers="L1H1", method="resample", n_prompts=4, seed=3)
    b = circuit(model, receivers="L1H1", method="resample", n_prompts=4, seed=3)
    assert a.equals(b)


def test_induction_2l_circuit_matches_the_issue():
    """induction-2l (zero ablation): L0H0 -> L1H1.k about +3.47 nats, beating its control;
    L0H2 -> L1H1.k also large (the card's two-head circuit is incomplete)."""
    df = circuit("induction-2l", receivers="L1H1", inputs="qk", method="zero")
    row = df.set_index(["sender", "input"])
    assert row.loc[("L0H0", "k"), "effect"] == pytest.approx(3.47, abs=0.1)
    assert row.loc[("L0H0", "k"), "ci_low"] > row.loc[("L0H0", "k"), "control_ci_high"]
    assert row.loc[("L0H0", "q"), "effect"] > 2.0
    assert row.loc[("L0H2", "k"), "effect"] > 2.0
    assert list(df.columns[:15]) == ["model", "sender", "receiver", "kv_head", "input", "effect", "ci_low",
                                     "ci_high", "control", "control_ci_low", "control_ci_high", "composition",
                                     "composition_z", "disagree", "label"]


def test_head_labels_put_the_strongest_label_first():
    """A graph colours a head by its first label: the one with the larger lift, not the table's order."""
    import pandas as pd

    from headlens.circuits.api import head_labels

    table = pd.DataFrame({"layer": [1, 1, 0], "head": [1, 1, 0], "detector": ["first_token", "induction", "sink"],
                          "label": [True, True, False], "lift": [12.2, 25.9, 9.0], "score": [0.7, 0.6, 0.9]})
    assert head_labels(table) == {"L1H1": "induction,first_token"}


@pytest.mark.parametrize("causal", [False, True])
def test_fast_equals_naive_on_tracr_shapes(causal):
    """Free head width (d_head x n_heads != d_model), ReLU MLPs, no LayerNorm, bidirectional or causal
    attention: what compiled tracr models are made of (tests/circuits/test_tracr.py converts real ones)."""
    from tests.models.test_tracr_shapes import TRACR_LIKE

    model = make_gpt(**(TRACR_LIKE | {"causal": causal, "n_layers": 3}))
    prompts = ["def f(x): pass", "class A: pass ", "import os, sys"]  # one token length: no padding
    s = setup(model, "kl", "resample", prompts=prompts, n_prompts=3, seed=1)
    edges = make_edges(model, parse_nodes("L1H2,L2H0,logits", model), None, "qkv")
    fast = edge_values(model, s.task, ["kl"], edges, s.deltas, fast=True, max_tokens=40)
    naive = edge_values(model, s.task, ["kl"], edges, s.deltas, fast=False)
    assert max(float(np.abs(fast[1][k] - naive[1][k]).max()) for k in naive[1]) < TOL
    assert sum(float(naive[1][e, "kl"].max()) > 1e-3 for e in edges) > len(edges) // 2
