"""The task a metric reads: probe tokens, the positions that count, and (narrowed) the columns its logits stand for.

A task narrowed to some columns (:meth:`Task.at`) is read from logits at those positions only, ``(B, C, V)``
(:mod:`headlens.interventions.logits`); its targets and positions come along.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Task:
    """Probe tokens and the positions a metric reads.

    Attributes:
        tokens: ``(B, T)`` token ids.
        positions: ``(B, T)`` bool; True where the logits at ``t`` are scored against ``tokens[t + 1]``.
        attention_mask: ``(B, T)`` 1 for real tokens, 0 for right padding (None: no padding).
        candidates: token ids the argmax is restricted to (bracket accuracy: the closers).
        probe: which probe made the tokens.
        answers: ``(B, 2)`` the correct and the wrong next token of each prompt, read at ``positions``
            (``logit_diff`` on IOI: IO and S).
        cols: ``(C,)`` the positions the logits given to a metric stand for (None: every position, ``(B, T, V)``).
    """

    tokens: torch.Tensor
    positions: torch.Tensor
    attention_mask: torch.Tensor | None = None
    candidates: torch.Tensor | None = None
    probe: str = ""
    answers: torch.Tensor | None = None
    cols: torch.Tensor | None = None

    @property
    def n_prompts(self) -> int:
        return int(self.tokens.shape[0])

    def with_positions(self, positions: torch.Tensor) -> Task:
        return dataclasses.replace(self, positions=positions)

    def at(self, cols: torch.Tensor | None) -> Task:
        """The task read from logits at positions ``cols`` ``(C,)`` only (None: every position)."""
        return dataclasses.replace(self, cols=cols)

    def columns(self) -> torch.Tensor:
        """``(C,)`` the positions the logits stand for."""
        return torch.arange(self.tokens.shape[1], device=self.tokens.device) if self.cols is None else self.cols

    def read(self) -> torch.Tensor:
        """``(B, C)`` bool: ``positions`` at the columns."""
        return self.positions if self.cols is None else self.positions[:, self.cols]

    def targets(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(B, C)`` the token each column predicts (``tokens[t + 1]``) and ``(C,)`` whether it predicts one (the
        last position does not; its target is a placeholder)."""
        T = self.tokens.shape[1]
        cols = self.columns()
        return self.tokens[:, (cols + 1).clamp(max=T - 1)], cols < T - 1

    def rows(self, rows: slice) -> Task:
        """The task of prompts ``rows`` only (every per-prompt field sliced)."""
        cut = {f: getattr(self, f)[rows] for f in ("tokens", "positions", "attention_mask", "answers")
               if getattr(self, f) is not None}
        return dataclasses.replace(self, **cut)
