"""induction (prefix matching, Olsson et al. 2022): T(q) = {k <= q-1 : x_{k-1} = x_q}.

On ``[BOS] p + r + r`` with r drawn without replacement only rows inside the second r have a
target, so "count only rows inside a repeat" follows from the definition.
"""

from __future__ import annotations

import torch

from headlens.detectors.base import Detector, finish_mask, lower
from headlens.probes import ProbeBatch


def targets(batch: ProbeBatch) -> torch.Tensor:
    """``(B, Q, K)``: the tokens right after earlier occurrences of x_q.

    >>> from headlens.probes import ProbeBatch
    >>> t = torch.tensor([[9, 1, 2, 1]]); v = torch.ones(1, 4, dtype=torch.bool)
    >>> targets(ProbeBatch(t, torch.tensor([4]), v, t == 9, causal=True))[0, 3].tolist()
    [False, False, True, False]
    """
    x = batch.tokens
    T = x.shape[1]
    prev = torch.cat([torch.full_like(x[:, :1], -1), x[:, :-1]], dim=1)  # (B, K): x_{k-1}
    prev_special = torch.cat([torch.ones_like(batch.special[:, :1]), batch.special[:, :-1]], dim=1)
    hit = (x[:, :, None] == prev[:, None, :]) & ~prev_special[:, None, :]  # (B, Q, K)
    hit &= lower(T, x.device, -1)[None]  # k <= q-1
    return finish_mask(hit, batch)


DETECTOR = Detector("induction", "mask", targets, "repeated_segments",
                    "attends to the token after an earlier copy of the current token")
