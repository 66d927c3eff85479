"""bracket_matching: T(q) = {the opener matched by the closer at q}; plus its hard subset.

The hard subset keeps closers whose opener is *not* the nearest preceding opener, which
separates matching from "attend to the last open bracket". Matches come from the probe's
``bracket_match`` / ``bracket_hard`` annotations, computed on the token sequence.
"""

from __future__ import annotations

import torch

from headlens.detectors.base import Detector, finish_index
from headlens.probes import ProbeBatch


def targets(batch: ProbeBatch) -> torch.Tensor:
    """``(B, Q)``: the matching opener's position at each closer, else -1."""
    return _annotated(batch, "bracket_match")


def hard_targets(batch: ProbeBatch) -> torch.Tensor:
    """``(B, Q)``: like :func:`targets`, only at closers with a closed opener in between."""
    return _annotated(batch, "bracket_hard")


def _annotated(batch: ProbeBatch, key: str) -> torch.Tensor:
    if key not in batch.annotations:  # a probe without bracket annotations has no targets
        return torch.full_like(batch.tokens, -1)
    return finish_index(batch.annotations[key], batch)


DETECTOR = Detector("bracket_matching", "index", targets, "brackets",
                    "attends from a closing bracket to its opener")
HARD_DETECTOR = Detector("bracket_matching_hard", "index", hard_targets, "brackets",
                         "bracket matching where the opener is not the nearest opener")
