"""Bracket heads, from the probe's ``bracket_match`` / ``bracket_hard`` annotations.

* ``bracket_matching``: T(q) = {the opener matched by the closer at q}.
* ``open_bracket``: T(q) = {the opener that the closer at q + 1 will match}: the innermost
  bracket still open, seen from the position that has to *predict* the closer. A causal
  language model chooses a closer's type one position early, so this is where its
  bracket-tracking heads look (the dyck zoo model grows one, and no from-closer head).
  Rows where the closer directly follows its opener are dropped (q is the opener itself).

Each has a hard subset: closers whose opener is *not* the nearest preceding opener (a closed
group sits between them), which separates matching from "attend to the last open bracket".
"""

from __future__ import annotations

import torch

from headlens.detectors.base import Detector, finish_index
from headlens.probes.base import ProbeBatch


def targets(batch: ProbeBatch) -> torch.Tensor:
    """``(B, Q, 1)``: the matching opener's position at each closer, else -1."""
    return _annotated(batch, "bracket_match")


def hard_targets(batch: ProbeBatch) -> torch.Tensor:
    """``(B, Q, 1)``: like :func:`targets`, only at closers with a closed opener in between."""
    return _annotated(batch, "bracket_hard")


def open_targets(batch: ProbeBatch) -> torch.Tensor:
    """``(B, Q, 1)``: at the position before each closer, the opener that closer matches, else -1."""
    return _annotated(batch, "bracket_match", shift=1)


def open_hard_targets(batch: ProbeBatch) -> torch.Tensor:
    """``(B, Q, 1)``: like :func:`open_targets`, only before closers with a closed opener in between."""
    return _annotated(batch, "bracket_hard", shift=1)


def _annotated(batch: ProbeBatch, key: str, shift: int = 0) -> torch.Tensor:
    if key not in batch.annotations:  # a probe without bracket annotations has no targets
        return torch.full_like(batch.tokens, -1)[:, :, None]  # (B, Q, 1)
    idx = batch.annotations[key]  # (B, T): opener position at each closer, else -1
    if shift:
        pad = torch.full_like(idx[:, :shift], -1)
        idx = torch.cat([idx[:, shift:], pad], dim=1)  # (B, T): read at the closer's q - shift
        q = torch.arange(idx.shape[1], device=idx.device)[None, :]  # (1, Q)
        idx = torch.where(idx < q, idx, torch.full_like(idx, -1))  # the opener itself predicts nothing
    return finish_index(idx, batch)


DETECTOR = Detector("bracket_matching", "index", targets, "brackets",
                    "attends from a closing bracket to its opener")
HARD_DETECTOR = Detector("bracket_matching_hard", "index", hard_targets, "brackets",
                         "bracket matching where the opener is not the nearest opener")
OPEN_DETECTOR = Detector("open_bracket", "index", open_targets, "brackets",
                         "attends, just before a closer, to the opener it will close")
OPEN_HARD_DETECTOR = Detector("open_bracket_hard", "index", open_hard_targets, "brackets",
                              "open_bracket where the opener is not the nearest opener")
