"""What a detector is: a pure function from a probe batch to its target positions.

Two shapes of target, so the scan can reduce each the cheapest way:

* ``"index"``: one target per query row, ``(B, Q)`` long with ``-1`` where a row has none
  (previous/next/current/first token, bracket matching). Reduced by one gather.
* ``"mask"``: a set of targets per row, ``(B, Q, K)`` bool (duplicate token, induction).
  Reduced by one ``bmm`` of the pattern with the mask.
* ``"weights"``: no probe at all; a score per head from the model's weights (copying).

Every target function already drops the rows a detector must not count (pads, special
tokens, rows outside the definition), so a row counts exactly when it has a target.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import torch

from headlens.probes import ProbeBatch

TargetFn = Callable[[ProbeBatch], torch.Tensor]


@dataclass(frozen=True)
class Detector:
    """One head type.

    Attributes:
        name: registry key, also the ``detector`` column of the scores table.
        kind: ``"index"``, ``"mask"`` or ``"weights"`` (see the module docstring).
        targets: ``ProbeBatch -> (B, Q)`` index or ``(B, Q, K)`` mask; None for weight scores.
        probe: the generated probe that exercises it (``None`` for weight scores).
        description: one line for ``--help`` and the dashboard.
        bidirectional_only: True when the target lies to the right of the query.
        weights_fn: ``model -> (n_layers, n_heads)`` float64 scores, for ``kind == "weights"``.
    """

    name: str
    kind: Literal["index", "mask", "weights"]
    targets: TargetFn | None
    probe: str | None
    description: str
    bidirectional_only: bool = False
    weights_fn: Callable[[Any], torch.Tensor] | None = None


def finish_index(idx: torch.Tensor, batch: ProbeBatch) -> torch.Tensor:
    """Set ``-1`` where the query row must not count or the target is not a visible real key."""
    T = batch.tokens.shape[1]
    q = torch.arange(T, device=idx.device)[None, :]  # (1, Q)
    ok = batch.query_ok & (idx >= 0) & (idx < batch.lengths[:, None])
    if batch.causal:
        ok &= idx <= q
    return torch.where(ok, idx, torch.full_like(idx, -1))  # (B, Q)


def finish_mask(mask: torch.Tensor, batch: ProbeBatch) -> torch.Tensor:
    """Keep only real query rows (non-special) and real, visible keys."""
    mask = mask & batch.query_ok[:, :, None] & batch.valid[:, None, :]  # (B, Q, K)
    if batch.causal:
        mask &= lower(mask.shape[-1], mask.device)[None]
    return mask


def lower(T: int, device: torch.device | str = "cpu", diagonal: int = 0) -> torch.Tensor:
    """``(Q, K)`` bool, True where ``k <= q + diagonal`` (``torch.tril`` of ones, without its slow bool path)."""
    i = torch.arange(T, device=device)
    return i[None, :] <= i[:, None] + diagonal


def positions(batch: ProbeBatch) -> torch.Tensor:
    """``(B, T)`` long: each position's index, for offset detectors."""
    B, T = batch.tokens.shape
    return torch.arange(T, device=batch.tokens.device).expand(B, T)
