"""ov_copying (weight-based, Wang et al. 2022's copy score): the head's OV circuit writes the token it attends to.

A statement about the weights, not the attention: whether the head attends to tokens worth copying is the
pattern detectors' to say (induction, name movers).

score = the share of sampled source tokens ``t`` whose own token is among the top 5 of the whole
vocabulary in what the head writes when it attends to ``t``: the effective embedding of ``t`` (after
block 0's MLP) through the head's OV, the final norm and the unembedding, norms folded
(:mod:`headlens.readout.ov`, ranked exactly by :mod:`headlens.readout.ranks`). Chance is ``5 / d_vocab``;
the null pairs each source with another sampled token (the vocabulary's rows shuffled), and a label needs
the score's interval above the null's as well as τ. Under grouped-query attention each query head reads
its key/value group's ``W_V`` through its own ``W_O``.

The ``eigen`` column keeps Elhage et al.'s (2021) score: ``Σλ / Σ|λ|`` over the eigenvalues of the raw
``W_E W_V W_O W_U``, norms ignored (its non-zero eigenvalues are those of the ``d_head x d_head`` product
``W_O W_U W_E W_V``). It is not the label: on SmolLM2 it passes 0.9 for 70 heads, of which a handful copy.
"""

from __future__ import annotations

from typing import Any

import torch

from headlens.detectors.base import Detector, WeightCounts
from headlens.readout.ov import raw_weights
from headlens.readout.ranks import self_ranks

THRESHOLD = 0.05  # τ: a twentieth of the sampled tokens in the head's own top 5 (SmolLM2: 500x chance)


def eigen_scores(model: Any) -> torch.Tensor:
    """``(n_layers, n_heads)`` float64: the positive-eigenvalue fraction of the raw ``W_E W_V W_O W_U``."""
    w_e, w_v, w_o, w_u = (w.detach().float().cpu() for w in raw_weights(model))
    n_heads, n_kv = w_o.shape[1], w_v.shape[1]
    w_v = w_v.repeat_interleave(n_heads // n_kv, dim=1)  # (L, H, D, dh): query head h -> kv head h // group
    ue = (w_u @ w_e).double()  # (D, D): unembed then embed, shared by every head (float32: a 2-minute f64 product)
    circuit = w_o.double() @ ue @ w_v.double()  # (L, H, dh, dh): cyclic permutation of W_E W_V W_O W_U
    lam = torch.linalg.eigvals(circuit)  # (L, H, dh) complex
    return (lam.real.sum(-1) / lam.abs().sum(-1).clamp_min(1e-300)).to(torch.float64)


def counts(model: Any) -> WeightCounts:
    """Sources copied into each head's own top 5 (and the null's), with the eigenvalue score as a column."""
    r = self_ranks(model)
    return WeightCounts(r.top, r.n, r.k / r.d_vocab, r.null_top, {"eigen": eigen_scores(model)}, r.provenance())


DETECTOR = Detector("ov_copying", "weights", None, None,
                    "writes the token it attends to: own token in the OV's top 5 of the vocabulary",
                    weights_fn=counts, threshold=THRESHOLD)
