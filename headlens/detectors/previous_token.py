"""previous_token: T(q) = {q-1}; the BOS/CLS row has no target. Predicate: ``k == q - 1``."""

from __future__ import annotations

import torch

from headlens.detectors.base import Detector, finish_index, positions
from headlens.probes.base import ProbeBatch


def targets(batch: ProbeBatch) -> torch.Tensor:
    """``(B, Q, 1)``: q-1 for every countable row q >= 1.

    >>> from headlens.probes.base import ProbeBatch
    >>> t = torch.tensor([[9, 1, 2]]); v = torch.ones(1, 3, dtype=torch.bool)
    >>> b = ProbeBatch(t, torch.tensor([3]), v, t == 9, causal=True)
    >>> targets(b)[..., 0].tolist()
    [[-1, 0, 1]]
    """
    return finish_index(positions(batch) - 1, batch)


def predicate(batch: ProbeBatch, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """``(C, K)``: k is the key right before q."""
    return k == q - 1


DETECTOR = Detector("previous_token", "index", targets, "random_tokens", "attends to the previous token",
                    predicate=predicate)
