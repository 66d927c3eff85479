"""The fast path's edges against path patching by freezing, on every causal family.

The reference (:mod:`headlens.circuits.freezing`) never computes a sender's write: it replaces the sender's
activation in the model's own forward and holds every other component clean, so a wrong write rule (a linear
``dz @ W_O`` under a post-attention norm) cannot hide in both. Each family: every input (q, k, v, logits) from
a head, the embedding and an MLP, under one method (rotated over the families); three families (a post-norm,
a post-only norm with a QK norm over all heads, a plain pre-norm) under every method.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hf_families import _ALL, build

import headlens
from headlens.circuits.api import setup
from headlens.circuits.freezing import Freezer
from headlens.circuits.nodes import LOGITS, Edge, Node
from headlens.circuits.senders import METHODS

CAUSAL = [name for name, fam in _ALL.items() if fam.causal]
NO_FORKS = {"gptj", "opt"}  # q/k/v edges refused in one line there (test_circuit_families); logits edges only
EVERY_METHOD = ["gemma2", "olmo2", "llama"]
ATOL = 1e-5


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    torch.set_num_threads(min(2, torch.get_num_threads()))
    root, cache = tmp_path_factory.mktemp("freezing"), {}

    def get(family: str):
        if family not in cache:
            cache[family] = headlens.load(f"hf:{build(family, root / family)}")
        return cache[family]

    return get


def _edges(family: str) -> list[Edge]:
    h0, embed, mlp0, mlp1 = Node("head", 0, 1), Node("embed"), Node("mlp", 0), Node("mlp", 1)
    logits = [Edge(h0, LOGITS, "resid"), Edge(mlp1, LOGITS, "resid"), Edge(embed, LOGITS, "resid")]
    if family in NO_FORKS:
        return logits
    return [*(Edge(h0, Node("head", 1, 2), c) for c in "qkv"), Edge(embed, Node("head", 1, 0), "k"),
            Edge(mlp0, Node("head", 1, 3), "q"), *logits]


def _fast_and_frozen(model, method: str, edges: list[Edge]) -> tuple[np.ndarray, np.ndarray]:
    """``(E, B)`` per-prompt effects of ``edges``: the fast path's and the freezing reference's."""
    s = setup(model, "repeated_loss", method, n_prompts=4, n_control=0, seed=1)
    clean, values = s.values(edges)
    fast = np.stack([values[e, s.metric] - clean for e in edges])
    ref = Freezer(model, s.task, s.deltas.replacement, s.named)
    return fast, np.stack([ref.effect(e, s.metric) for e in edges])


def _method(family: str) -> str:
    """The one method a family's every-input test runs (rotated over the families)."""
    return METHODS[CAUSAL.index(family) % len(METHODS)]


@pytest.mark.parametrize("family", CAUSAL)
def test_every_input_equals_freezing(loaded, family):
    """Each family, each input, from a head, the embedding and an MLP: equal within 1e-5 per prompt."""
    method = _method(family)
    edges = _edges(family)
    fast, ref = _fast_and_frozen(loaded(family), method, edges)
    assert np.abs(ref).max() > 1e-4  # the edges move the metric: equality is not 0 == 0
    np.testing.assert_allclose(fast, ref, atol=ATOL, err_msg=f"{family} / {method}: {[e.name for e in edges]}")


@pytest.mark.parametrize(("family", "method"), [(f, m) for f in EVERY_METHOD for m in METHODS if m != _method(f)])
def test_every_method_equals_freezing(loaded, family, method):
    """The other three methods (the fourth is the every-input test's) on three families."""
    fast, ref = _fast_and_frozen(loaded(family), method, _edges(family))
    np.testing.assert_allclose(fast, ref, atol=ATOL)


def test_a_linear_write_under_a_post_norm_is_not_the_reference(loaded, monkeypatch):
    """The reference tells the rules apart on Gemma 2: the linear write (no post-norm) disagrees with it."""
    from headlens.readout import write

    model = loaded("gemma2")
    edges = [Edge(Node("head", 0, h), Node("head", 1, 2), c) for h in range(4) for c in "qk"]
    fast, ref = _fast_and_frozen(model, "zero", edges)
    np.testing.assert_allclose(fast, ref, atol=ATOL)
    real = write.write_path
    monkeypatch.setattr("headlens.circuits.senders.write_path",
                        lambda m: write.WritePath(m, (None,) * 2, real(m).post_mlp))  # heads written linearly
    linear, ref = _fast_and_frozen(model, "zero", edges)
    assert np.abs(linear - ref).max() > 100 * ATOL


@pytest.mark.parametrize(("family", "says"), [("llama", None), ("gemma2", "norm after the sublayer"),
                                              ("qwen3", "q/k norms"), ("olmo2", "norm after the sublayer")])
def test_composition_says_where_it_is_only_an_approximation(loaded, family, says):
    from headlens.circuits.composition import approximate

    note = approximate(loaded(family))
    assert note is None if says is None else says in note
