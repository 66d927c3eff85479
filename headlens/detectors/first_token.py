"""first_token (attention sink): T(q) = {0} for q >= 1; position 0 is BOS or [CLS].

Gu et al. 2024 call a head a sink head at mass > 0.3; headlens labels it by the shared rule.
"""

from __future__ import annotations

import torch

from headlens.detectors.base import Detector, finish_index, positions
from headlens.probes.base import ProbeBatch


def targets(batch: ProbeBatch) -> torch.Tensor:
    """``(B, Q, 1)``: 0 for every countable row q >= 1."""
    pos = positions(batch)
    return finish_index(torch.where(pos >= 1, torch.zeros_like(pos), torch.full_like(pos, -1)), batch)


def predicate(batch: ProbeBatch, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """``(C, K)``: k is position 0 and q is not."""
    return (k == 0) & (q >= 1)


DETECTOR = Detector("first_token", "index", targets, "random_tokens", "attends to the first token (sink)",
                    predicate=predicate)
