"""next_token: T(q) = {q+1}; bidirectional models only (a causal head cannot see q+1)."""

from __future__ import annotations

import torch

from headlens.detectors.base import Detector, finish_index, positions
from headlens.probes.base import ProbeBatch


def targets(batch: ProbeBatch) -> torch.Tensor:
    """``(B, Q, 1)``: q+1 while it is a real position (the last real row has none)."""
    return finish_index(positions(batch) + 1, batch)


def predicate(batch: ProbeBatch, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """``(C, K)``: k is the key right after q."""
    return k == q + 1


DETECTOR = Detector("next_token", "index", targets, "random_tokens", "attends to the next token",
                    bidirectional_only=True, predicate=predicate)
