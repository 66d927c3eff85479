"""A running top-k per row: O(rows x k) memory whatever the number of candidates streamed through it."""

from __future__ import annotations

from typing import Any

import torch


class RunningTopK:
    """The k largest scores seen so far in each of ``n_rows`` rows, with a payload per kept score.

    :meth:`merge` takes one batch's candidates ``(n_rows, M)`` and keeps, per row, the k largest of the
    kept and the new (ties keep the earlier); payloads are built only for the new candidates that survive.

    >>> top = RunningTopK(1, 2)
    >>> top.merge(torch.tensor([[1.0, 5.0, 3.0]]), lambda row, j: j)
    >>> top.merge(torch.tensor([[4.0]]), lambda row, j: 10 + j)
    >>> top.scores.tolist(), top.payloads
    ([[5.0, 4.0]], [[1, 10]])
    """

    def __init__(self, n_rows: int, k: int) -> None:
        self.k = k
        self.scores = torch.full((n_rows, 0), float("-inf"), dtype=torch.float64)  # (rows, <= k)
        self.payloads: list[list[Any]] = [[] for _ in range(n_rows)]

    def merge(self, candidates: torch.Tensor, payload: Any) -> None:
        """Fold ``candidates`` ``(n_rows, M)`` in (``-inf``/NaN: not a candidate); ``payload(row, j)`` is
        called for each surviving candidate ``j``."""
        cand = torch.nan_to_num(candidates.double(), nan=float("-inf"))
        m = min(self.k, cand.shape[1])
        val, idx = cand.topk(m, dim=1)  # (rows, m): the batch's own best, a bound on what can survive
        kept = self.scores.shape[1]
        both = torch.cat([self.scores, val], dim=1)  # (rows, kept + m): kept first, so ties keep them
        order = torch.sort(both, dim=1, descending=True, stable=True).indices[:, : self.k]
        self.scores = both.gather(1, order)
        orders, scores, picks = order.tolist(), self.scores.tolist(), idx.tolist()  # once, not per row
        for row, old in enumerate(self.payloads):
            new = []
            for slot, s in zip(orders[row], scores[row], strict=True):
                if s == float("-inf"):
                    break
                new.append(old[slot] if slot < kept else payload(row, picks[row][slot - kept]))
            self.payloads[row] = new
        self.scores = self.scores[:, : max((len(p) for p in self.payloads), default=0)]
