"""Receiver-local effects equal the receiver's pattern in a full hooked forward with the edge patched."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import headlens
from headlens.circuits.api import setup
from headlens.circuits.local import _induction_mass, induction_targets, receiver_effects
from headlens.circuits.native import naive_logits
from headlens.circuits.nodes import CircuitError, make_edges, parse_nodes
from tests.conftest import make_gpt


@pytest.mark.parametrize("ref", ["induction-2l", "gpt"])
def test_local_effect_equals_the_hooked_pattern(ref):
    model = headlens.load(ref) if ref != "gpt" else make_gpt(n_layers=3, init_range=0.2)
    s = setup(model, "repeated_loss", "mean", n_prompts=6)
    receivers = "L1H1" if ref != "gpt" else "L1H1,L2H3"
    edges = make_edges(model, parse_nodes(receivers, model), None, "qk")
    _, values = receiver_effects(model, s.task, edges, s.deltas, max_tokens=300)
    for e in edges:
        seen: dict[str, torch.Tensor] = {}
        layer, head = e.receiver.layer, e.receiver.head

        def keep(x: torch.Tensor, hook: object, seen: dict = seen) -> None:
            seen.setdefault("p", x)

        with torch.no_grad(), model.hooks([(f"blocks.{layer}.attn.hook_pattern", keep)]):
            naive_logits(model, s.task, e, s.deltas.delta(e.sender))
        ref_mass = _induction_mass(seen["p"][:, head][None], induction_targets(s.task))[0].numpy()
        assert np.abs(ref_mass - values[e]).max() < 1e-5, e.name


def test_induction_2l_previous_token_key_edge_erases_most_of_the_induction_score():
    model = headlens.load("induction-2l")
    s = setup(model, "repeated_loss", "zero", n_prompts=16)
    edges = make_edges(model, parse_nodes("L1H1", model), parse_nodes("L0H0", model), "k")
    clean, values = receiver_effects(model, s.task, edges, s.deltas)
    assert clean[1, 1].mean() > 0.4 and values[edges[0]].mean() < 0.1 * clean[1, 1].mean()


def test_v_edges_and_bridge_models_are_refused():
    model = make_gpt()
    s = setup(model, "repeated_loss", "zero", n_prompts=2)
    with pytest.raises(CircuitError, match="q and k edges"):
        receiver_effects(model, s.task, make_edges(model, parse_nodes("L1H0", model), None, "v"), s.deltas)
