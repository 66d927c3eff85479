"""SmolLM2's strongest induction head, asked what makes it one: the receiver-local induction score of
L18H6 with an edge into its key patched, through the bridge, equals plain transformers' eager attention with
``k_proj``'s input patched the same way; its previous-token senders erase far more of it than a head that is
none (the known heads: previous token L16H0, L11H1)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from headlens.circuits.api import setup
from headlens.circuits.local import receiver_values, score, target_mask
from headlens.circuits.nodes import make_edges, parse_nodes
from headlens.detectors import get_detector

SENDERS = "L16H0,L11H1,L2H5"


@pytest.fixture(scope="module")
def hf(smollm2):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(smollm2.source["cache"], attn_implementation="eager").eval()


def _eager(hf, tokens, sender, receiver, targets) -> np.ndarray:
    """L18H6's induction score in transformers with ``sender`` zero-ablated on the direct path into its key."""
    (ls, hs), (lr, hr) = sender, receiver
    layers, d = hf.model.layers, hf.config.head_dim
    z, o_proj = {}, layers[ls].self_attn.o_proj
    h = o_proj.register_forward_pre_hook(lambda mod, args: z.setdefault("z", args[0].detach()))
    with torch.no_grad():
        out = hf(tokens, output_hidden_states=True)
    h.remove()
    cols = slice(hs * d, (hs + 1) * d)
    delta = -z["z"][..., cols] @ o_proj.weight[:, cols].T  # (B, T, D): the sender's write, removed
    patched = layers[lr].input_layernorm(out.hidden_states[lr] + delta)
    h = layers[lr].self_attn.k_proj.register_forward_pre_hook(lambda mod, args: (patched,))
    try:
        with torch.no_grad():
            pattern = hf(tokens, output_attentions=True).attentions[lr][:, hr]  # (B, Q, K)
    finally:
        h.remove()
    return score(pattern[None].double(), targets)[0].numpy()


def test_what_makes_l18h6_an_induction_head(smollm2, hf):
    s = setup(smollm2, "receiver:induction", "zero", n_prompts=8, seed=0)
    edges = make_edges(smollm2, parse_nodes("L18H6", smollm2), parse_nodes(SENDERS, smollm2), "k")
    clean, values = receiver_values(smollm2, s.task, "receiver:induction", edges, s.deltas)
    targets = target_mask(smollm2, s.task, get_detector("induction"))
    drop = {}
    for e in edges:
        truth = _eager(hf, s.task.tokens, (e.sender.layer, e.sender.head), (18, 6), targets)
        assert np.abs(values[e] - truth).max() < 1e-4, e.name
        drop[e.sender.name] = float((clean[e] - values[e]).mean())
    assert clean[edges[0]].mean() > 0.3  # it is an induction head
    assert min(drop["L16H0"], drop["L11H1"]) > 5 * abs(drop["L2H5"])  # its previous-token senders key it
