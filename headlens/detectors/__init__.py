"""Detector registry: one module per head type, one entry here (HEAD_SCORES.md).

Detectors with settings (``sink``: s; ``streaming``: s, w) are registered with their defaults and
a ``factory``; ``get_detector("streaming(s=16,w=256)")`` builds a variant (named like that in the
scores table, its settings in ``Detector.params``). The CLI takes the same spelling:
``--detectors 'previous_token,streaming(w=128)'``.

>>> sorted(DETECTORS)[:3]
['bracket_matching', 'bracket_matching_hard', 'copying']
>>> get_detector("streaming(w=128)").params
{'s': 4, 'w': 128}
"""

from __future__ import annotations

import re

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
    retrieval,
    sink,
    streaming,
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
        sink.DETECTOR,
        streaming.DETECTOR,
        retrieval.DETECTOR,
    )
}
_CALL = re.compile(r"^\s*([A-Za-z_][\w.]*)\s*\((.*)\)\s*$")


def get_detector(name: str) -> Detector:
    """The registered detector called ``name`` (or ``name(key=value, ...)`` for one with settings),
    else a ``DetectorError`` listing the known ones."""
    call = _CALL.match(name)
    base = call.group(1) if call else name
    if base not in DETECTORS:
        raise DetectorError(f"unknown detector {base!r}; expected one of {', '.join(DETECTORS)}")
    det = DETECTORS[base]
    if not call:
        return det
    if det.factory is None:
        raise DetectorError(f"detector {base!r} has no settings; use it as {base!r}")
    params = {}
    for item in filter(None, (p.strip() for p in call.group(2).split(","))):
        key, eq, value = item.partition("=")
        if not eq or key.strip() not in det.params:
            raise DetectorError(f"bad setting {item!r} for {base}; expected key=value with key in "
                                f"{', '.join(det.params)}")
        try:
            params[key.strip()] = type(det.params[key.strip()])(value.strip())
        except ValueError:
            raise DetectorError(f"bad value {value.strip()!r} for {base} setting {key.strip()!r}") from None
    try:
        return det.factory(**{**det.params, **params})
    except ValueError as err:
        raise DetectorError(str(err)) from None


def split_names(names: str) -> list[str]:
    """``"a,streaming(s=1,w=8),b"`` -> ``["a", "streaming(s=1,w=8)", "b"]`` (commas inside parentheses kept).

    >>> split_names("previous_token, streaming(s=1,w=8),induction")
    ['previous_token', 'streaming(s=1,w=8)', 'induction']
    """
    return [n.strip() for n in re.split(r",(?![^()]*\))", names) if n.strip()]


__all__ = ["DETECTORS", "Detector", "get_detector", "split_names"]
