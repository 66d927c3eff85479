"""Detector registry: one module per head type, one entry here (HEAD_SCORES.md).

>>> sorted(DETECTORS)[:3]
['bracket_matching', 'bracket_matching_hard', 'copying']
"""

from __future__ import annotations

from headlens.detectors import (
    bracket_matching,
    copying,
    coreference,
    current_token,
    duplicate_token,
    first_token,
    induction,
    next_token,
    previous_token,
)
from headlens.detectors.base import Detector
from headlens.errors import DetectorError

DETECTORS: dict[str, Detector] = {
    d.name: d
    for d in (
        previous_token.DETECTOR,
        next_token.DETECTOR,
        current_token.DETECTOR,
        first_token.DETECTOR,
        duplicate_token.DETECTOR,
        induction.DETECTOR,
        bracket_matching.DETECTOR,
        bracket_matching.HARD_DETECTOR,
        bracket_matching.OPEN_DETECTOR,
        bracket_matching.OPEN_HARD_DETECTOR,
        copying.DETECTOR,
        coreference.DETECTOR,
    )
}


def get_detector(name: str) -> Detector:
    """The registered detector called ``name``, or a ``DetectorError`` listing the known ones."""
    if name not in DETECTORS:
        raise DetectorError(f"unknown detector {name!r}; expected one of {', '.join(DETECTORS)}")
    return DETECTORS[name]


__all__ = ["DETECTORS", "Detector", "get_detector"]
