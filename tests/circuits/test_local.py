"""Receiver-local metrics (``receiver:<detector>``): the receiver's own score with an edge patched, nothing
downstream, on native models and through the bridge; equal to the pattern of a full forward with the edge
patched, and on a Llama with grouped-query attention to plain transformers' eager attentions."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import headlens
from headlens.circuits.api import circuit, setup
from headlens.circuits.local import receiver_values, score, target_mask
from headlens.circuits.nodes import CircuitError, make_edges, parse_nodes
from headlens.circuits.positions import NamedPositions
from headlens.detectors import get_detector
from tests.conftest import make_gpt


def _fast_equals_naive(model, receivers: str, metric: str = "receiver:induction", named=None, positions=None) -> None:
    s = setup(model, metric, "mean", n_prompts=4, seed=1)
    edges = make_edges(model, parse_nodes(receivers, model), None, "qk", positions=positions)
    c_fast, fast = receiver_values(model, s.task, metric, edges, s.deltas, named, fast=True, max_tokens=300)
    c_naive, naive = receiver_values(model, s.task, metric, edges, s.deltas, named, fast=False)
    assert max(float(np.abs(fast[e] - naive[e]).max()) for e in edges) < 1e-5
    assert max(float(np.abs(c_fast[e] - c_naive[e]).max()) for e in edges) < 1e-5
    assert sum(float(np.abs(naive[e] - c_naive[e]).max()) > 1e-4 for e in edges) > len(edges) // 3


@pytest.mark.parametrize("ref", ["induction-2l", "gpt"])
def test_native_local_effect_equals_the_hooked_pattern(ref):
    model = headlens.load(ref) if ref != "gpt" else make_gpt(n_layers=3, init_range=0.2)
    _fast_equals_naive(model, "L1H1" if ref != "gpt" else "L1H1,L2H3")


@pytest.mark.parametrize("family", ["llama", "gemma2"])
def test_bridge_local_effect_equals_the_hooked_pattern(tmp_path, family):
    from hf_families import build

    model = headlens.load(f"hf:{build(family, tmp_path / family)}")
    _fast_equals_naive(model, "L1H1,L1H2", "receiver:previous_token")
    task = setup(model, "receiver:induction", n_prompts=4).task
    B, T = task.tokens.shape
    named = NamedPositions({"P": torch.full((B,), T - 3)}, (B, T))
    _fast_equals_naive(model, "L1H2", named=named, positions=["P"])  # one query row counts


def _eager_score(hf, tokens, layer_s, head_s, layer_r, head_r, which, targets) -> np.ndarray:
    """The receiver's induction score in plain transformers (eager, output_attentions) with head
    ``(layer_s, head_s)`` zero-ablated on the direct path into ``which``_proj's input of ``layer_r``."""
    layers = hf.model.layers
    z, o_proj = {}, layers[layer_s].self_attn.o_proj
    h = o_proj.register_forward_pre_hook(lambda mod, args: z.setdefault("z", args[0].detach()))
    with torch.no_grad():
        out = hf(tokens, output_hidden_states=True)
    h.remove()
    d = hf.config.head_dim
    cols = slice(head_s * d, (head_s + 1) * d)
    delta = -z["z"][..., cols] @ o_proj.weight[:, cols].T  # (B, T, D)
    patched = layers[layer_r].input_layernorm(out.hidden_states[layer_r] + delta)
    proj = getattr(layers[layer_r].self_attn, f"{which}_proj")
    h = proj.register_forward_pre_hook(lambda mod, args: (patched,))
    try:
        with torch.no_grad():
            pattern = hf(tokens, output_attentions=True).attentions[layer_r][:, head_r]  # (B, Q, K)
    finally:
        h.remove()
    return score(pattern[None].double(), targets)[0].numpy()


def test_gqa_local_effect_equals_plain_transformers(tmp_path):
    """Llama with 4 query heads sharing 2 key/value heads: the receiver's q and k recomputed through the
    bridge equal transformers' own attentions with q_proj's or k_proj's input patched."""
    from hf_families import build, load_eager

    path = build("llama", tmp_path / "llama")
    model, hf = headlens.load(f"hf:{path}"), load_eager(path, "llama")
    s = setup(model, "receiver:induction", "zero", n_prompts=3, seed=3)
    edges = make_edges(model, parse_nodes("L1H1,L1H2", model), parse_nodes("L0H1", model), "qk")
    clean, values = receiver_values(model, s.task, "receiver:induction", edges, s.deltas)
    targets = target_mask(model, s.task, get_detector("induction"))
    for e in edges:
        ref = _eager_score(hf, s.task.tokens, 0, 1, 1, e.receiver.head, e.input, targets)
        assert np.abs(values[e] - ref).max() < 1e-4, e.name
        assert np.abs(ref - clean[e]).max() > 1e-4  # the edge moves the pattern


def test_induction_2l_previous_token_key_edge_erases_most_of_the_induction_score():
    df = circuit("induction-2l", receivers="L1H1", senders="L0H0,L0H2", inputs="k", metric="receiver:induction",
                 method="zero", n_prompts=16, n_control=2)
    row = df.set_index("sender").loc["L0H0"]
    assert df.attrs["clean"] > 0.4 and row.effect < -0.9 * df.attrs["clean"]
    assert row.ci_high < row.control_ci_low  # beats random senders of its layer


def test_refusals_are_one_line():
    model = make_gpt()
    with pytest.raises(CircuitError, match="q and k edges"):
        circuit(model, receivers="L1H0", inputs="v", metric="receiver:induction", n_prompts=2)
    with pytest.raises(CircuitError, match="give --receivers"):
        circuit(model, metric="receiver:induction", n_prompts=2)
    with pytest.raises(CircuitError, match="no predicate target"):
        circuit(model, receivers="L1H0", metric="receiver:ov_copying", n_prompts=2)
