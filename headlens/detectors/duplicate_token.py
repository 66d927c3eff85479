"""duplicate_token (Wang et al. 2022): T(q) = {k != q : x_k = x_q}, k < q in causal models."""

from __future__ import annotations

import torch

from headlens.detectors.base import Detector, finish_mask
from headlens.probes import ProbeBatch


def targets(batch: ProbeBatch) -> torch.Tensor:
    """``(B, Q, K)``: earlier (or, bidirectionally, any other) ordinary occurrences of x_q.

    >>> from headlens.probes import ProbeBatch
    >>> t = torch.tensor([[9, 1, 2, 1]]); v = torch.ones(1, 4, dtype=torch.bool)
    >>> targets(ProbeBatch(t, torch.tensor([4]), v, t == 9, causal=True))[0, 3].tolist()
    [False, True, False, False]
    """
    x = batch.tokens
    same = x[:, :, None] == x[:, None, :]  # (B, Q, K)
    same &= ~torch.eye(x.shape[1], dtype=torch.bool, device=x.device)[None]
    same &= ~batch.special[:, None, :]
    return finish_mask(same, batch)


DETECTOR = Detector("duplicate_token", "mask", targets, "repeated_segments",
                    "attends to earlier copies of the current token")
