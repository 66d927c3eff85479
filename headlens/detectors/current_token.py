"""current_token: T(q) = {q}."""

from __future__ import annotations

import torch

from headlens.detectors.base import Detector, finish_index, positions
from headlens.probes.base import ProbeBatch


def targets(batch: ProbeBatch) -> torch.Tensor:
    """``(B, Q, 1)``: q itself for every countable row."""
    return finish_index(positions(batch), batch)


def predicate(batch: ProbeBatch, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """``(C, K)``: k is q."""
    return k == q


DETECTOR = Detector("current_token", "index", targets, "random_tokens", "attends to itself", predicate=predicate)
