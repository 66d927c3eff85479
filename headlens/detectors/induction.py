"""induction (prefix matching, Olsson et al. 2022): T(q) = {k <= q-1 : x_{k-1} = x_q}.

On ``[BOS] p + r + r`` with r drawn without replacement only rows inside the second r have a
target, so "count only rows inside a repeat" follows from the definition.
"""

from __future__ import annotations

import dataclasses

import torch

from headlens.detectors.base import Detector, finish_targets, same_token_targets
from headlens.probes.base import ProbeBatch


def targets(batch: ProbeBatch) -> torch.Tensor:
    """``(B, Q, M)``: the tokens right after earlier occurrences of x_q.

    >>> from headlens.probes.base import ProbeBatch
    >>> t = torch.tensor([[9, 1, 2, 1]]); v = torch.ones(1, 4, dtype=torch.bool)
    >>> targets(ProbeBatch(t, torch.tensor([4]), v, t == 9, causal=True))[0, 3].tolist()
    [2]
    """
    x = batch.tokens
    # j = k-1: an ordinary earlier copy of x_q with j <= q-2 whose successor k = j+1 is a real position
    j_ok = ~batch.special & torch.cat([batch.valid[:, 1:], torch.zeros_like(batch.valid[:, :1])], dim=1)
    causal_batch = batch if batch.causal else _as_causal(batch)  # k <= q-1 in both directions
    j = same_token_targets(x, x, j_ok, causal_batch, -2)  # (B, Q, M)
    return finish_targets(torch.where(j >= 0, j + 1, j), batch)


def predicate(batch: ProbeBatch, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """``(B, C, K)``: ``x_{k-1} == x_q`` for k <= q - 1 whose predecessor is an ordinary token."""
    j = (k - 1).clamp_min(0)  # (1, K): the earlier copy's position
    x = batch.tokens
    return (x[:, j] == x[:, q]) & ~batch.special[:, j] & (k >= 1) & (k <= q - 1)  # (B, C, K)


def _as_causal(batch: ProbeBatch) -> ProbeBatch:
    return dataclasses.replace(batch, causal=True)


DETECTOR = Detector("induction", "mask", targets, "repeated_segments",
                    "attends to the token after an earlier copy of the current token",
                    windowed=True, predicate=predicate)
