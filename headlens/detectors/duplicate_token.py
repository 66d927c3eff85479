"""duplicate_token (Wang et al. 2022): T(q) = {k != q : x_k = x_q}, k < q in causal models."""

from __future__ import annotations

import torch

from headlens.detectors.base import Detector, same_token_targets
from headlens.probes.base import ProbeBatch


def targets(batch: ProbeBatch) -> torch.Tensor:
    """``(B, Q, M)``: earlier (or, bidirectionally, any other) ordinary occurrences of x_q.

    >>> from headlens.probes.base import ProbeBatch
    >>> t = torch.tensor([[9, 1, 2, 1]]); v = torch.ones(1, 4, dtype=torch.bool)
    >>> targets(ProbeBatch(t, torch.tensor([4]), v, t == 9, causal=True))[0, 3].tolist()
    [1]
    """
    x = batch.tokens
    return same_token_targets(x, x, ~batch.special, batch, -1 if batch.causal else None)


def predicate(batch: ProbeBatch, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """``(B, C, K)``: ``x_k == x_q`` for an ordinary k other than q (earlier than q in causal models)."""
    x = batch.tokens
    return (x[:, k] == x[:, q]) & ~batch.special[:, k] & (k != q)  # (B, 1, K) vs (B, C, 1)


DETECTOR = Detector("duplicate_token", "mask", targets, "repeated_segments",
                    "attends to earlier copies of the current token", windowed=True, predicate=predicate)
