"""User-defined detectors, as a plugin package would ship them (tests/detectors/test_user_detectors.py)."""

from __future__ import annotations

import headlens
from headlens.detectors.base import finish_index, positions


def two_back_targets(batch):
    """``(B, Q, 1)``: the key two positions back."""
    return finish_index(positions(batch) - 2, batch)


TWO_BACK = headlens.Detector("two_back", "index", two_back_targets, "random_tokens", "attends two tokens back")
ONE_BACK = headlens.Detector("one_back", "index", lambda b: finish_index(positions(b) - 1, b), "random_tokens",
                             "attends to the previous token (a user-defined copy of previous_token)")
