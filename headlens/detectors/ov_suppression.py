"""ov_suppression (weight-based, McDougall et al. 2023's negative copy score): the head writes *against*
the token it attends to.

score = the share of sampled source tokens ``t`` whose own token is among the bottom 5 of the whole
vocabulary in what the head writes when it attends to ``t``: the mirror of ``ov_copying``, on the same
effective embeddings, folded norms and exact ranks (:mod:`headlens.readout.ranks`, computed once for
both). Chance is ``5 / d_vocab``; the null pairs each source with another sampled token, and a label needs
the score's interval above the null's as well as τ. McDougall et al. find L10H7 of GPT-2 small puts most
tokens in its bottom 10; it attends to a token the model is about to predict and pushes it down.

This label is the OV half of copy suppression only; a head whose attention shows the other half (on IOI,
the negative name movers': it attends to a name and writes against it) is labelled ``copy_suppression``
too (:mod:`headlens.scoring.derived`, docs/scores.md).
"""

from __future__ import annotations

from typing import Any

from headlens.detectors.base import Detector, WeightCounts
from headlens.detectors.ov_copying import THRESHOLD
from headlens.readout.ranks import self_ranks


def counts(model: Any) -> WeightCounts:
    """Sources pushed into each head's own bottom 5 (and the null's)."""
    r = self_ranks(model)
    return WeightCounts(r.bottom, r.n, r.k / r.d_vocab, r.null_bottom, {}, r.provenance())


DETECTOR = Detector("ov_suppression", "weights", None, None,
                    "writes against the token it attends to: own token in the OV's bottom 5 of the vocabulary",
                    weights_fn=counts, threshold=THRESHOLD)
