"""Detector registry: one module per head type, one entry here (definitions: docs/scores.md, "What each score means").

Detectors with settings (``sink``: s; ``streaming``: s, w) are registered with their defaults and
a ``factory``; ``get_detector("streaming(s=16,w=256)")`` builds a variant (named like that in the
scores table, its settings in ``Detector.params``). The CLI takes the same spelling:
``--detectors 'previous_token,streaming(w=128)'``.

Your own head types join the same registry, three ways:

* pass a :class:`Detector` object itself: ``classify(model, detectors=[my_detector])``;
* ``headlens.register_detector(my_detector)``, then use its name anywhere in this process;
* a ``headlens.detectors`` entry point in your package's metadata (``pyproject.toml``:
  ``[project.entry-points."headlens.detectors"] two_back = "mypkg.heads:TWO_BACK"``), naming a
  Detector, a list of them, or a function returning either. Entry points are loaded on first
  use of the registry (never at ``import headlens``), so the CLI and the dashboard see them too;
  a plugin that fails to load is skipped with a warning.

From the CLI a ``module:attribute`` reference also works: ``--detectors mypkg.heads:TWO_BACK``.

>>> sorted(DETECTORS)[:3]
['bracket_matching', 'bracket_matching_hard', 'coreference']
>>> get_detector("streaming(w=128)").params
{'s': 4, 'w': 128}
"""

from __future__ import annotations

import importlib
import warnings
from typing import Any

from headlens.detectors import (
    bracket_matching,
    coreference,
    current_token,
    duplicate_token,
    first_token,
    induction,
    name_mover,
    next_token,
    ov_copying,
    ov_suppression,
    previous_token,
    retrieval,
    sink,
    streaming,
    successor,
)
from headlens.detectors.base import Detector
from headlens.errors import DetectorError
from headlens.zoo.names import _CALL, ENTRY_POINT_GROUP, current_name, split_names, unknown_detector
from headlens.zoo.names import DETECTORS as BUILTIN_NAMES

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
        ov_copying.DETECTOR,
        ov_suppression.DETECTOR,
        successor.DETECTOR,
        coreference.DETECTOR,
        sink.DETECTOR,
        streaming.DETECTOR,
        retrieval.DETECTOR,
        name_mover.DETECTOR,
        name_mover.NEGATIVE_DETECTOR,
    )
}


BUILTIN = frozenset(DETECTORS)
if tuple(DETECTORS) != BUILTIN_NAMES:  # the CLI checks names against the torch-free list before torch loads
    raise RuntimeError(f"headlens.zoo.names.DETECTORS {BUILTIN_NAMES} lists other detectors than the "
                       f"registry {tuple(DETECTORS)}")
KINDS = ("index", "mask", "weights", "top1", "annotated")
PROBES = ("random_tokens", "repeated_segments", "brackets", "needle", "ioi")  # the generated probes a detector may name
_plugins_loaded = False


def register_detector(detector: Detector, replace: bool = False) -> Detector:
    """Add ``detector`` to the registry, so ``classify``, the CLI and the dashboard know it by name.

    Args:
        detector: a :class:`Detector` (``targets`` returns ``(B, Q, M)`` key indices, ``-1`` padded;
            ``(B, Q)`` indices and ``(B, Q, K)`` bool masks are accepted too).
        replace: allow replacing a registered detector of the same name (never a built-in one).

    Returns:
        ``detector``, so the call can decorate a module-level constant.

    Raises:
        DetectorError: not a Detector, a bad kind or probe, or a name already taken.

    >>> import headlens
    >>> from headlens.detectors.base import finish_index, positions
    >>> two_back = headlens.Detector("two_back_doc", "index", lambda b: finish_index(positions(b) - 2, b),
    ...                              "random_tokens", "attends two tokens back")
    >>> headlens.register_detector(two_back).name in DETECTORS
    True
    """
    if not isinstance(detector, Detector):
        raise DetectorError(f"register_detector expects a headlens.Detector, got {type(detector).__name__}")
    name = detector.name
    if not isinstance(name, str) or not name or any(c in name for c in ",:() "):
        raise DetectorError(f"detector name {name!r} must be a non-empty string without ',', ':', '(', ')' "
                            f"or spaces")
    if detector.kind not in KINDS:
        raise DetectorError(f"detector {name!r} has kind {detector.kind!r}; expected one of {', '.join(KINDS)}")
    if detector.kind == "weights":
        if not callable(detector.weights_fn):
            raise DetectorError(f"detector {name!r} of kind 'weights' needs a weights_fn(model) -> (L, H) tensor")
    elif detector.kind != "annotated" and (not callable(detector.targets) or detector.probe not in PROBES):
        raise DetectorError(f"detector {name!r} needs a callable targets(batch) and a probe among "
                            f"{', '.join(PROBES)}; got probe {detector.probe!r}")
    if name in BUILTIN or (name in DETECTORS and not replace and DETECTORS[name] is not detector):
        raise DetectorError(f"a detector called {name!r} is already registered"
                            + ("" if name in BUILTIN else "; pass replace=True to replace it"))
    DETECTORS[name] = detector
    return detector


def _entry_points() -> list[Any]:
    from importlib.metadata import entry_points

    return list(entry_points(group=ENTRY_POINT_GROUP))


def _as_detectors(obj: Any, where: str) -> list[Detector]:
    if callable(obj) and not isinstance(obj, Detector):
        obj = obj()
    items = obj if isinstance(obj, list | tuple) else [obj]
    bad = [type(i).__name__ for i in items if not isinstance(i, Detector)]
    if bad:
        raise DetectorError(f"{where} gave {', '.join(bad)}; expected headlens.Detector objects")
    return list(items)


def load_plugins() -> dict[str, Detector]:
    """Register the detectors of every ``headlens.detectors`` entry point (once per process)."""
    global _plugins_loaded
    if not _plugins_loaded:
        _plugins_loaded = True
        for ep in _entry_points():
            try:
                for d in _as_detectors(ep.load(), f"entry point {ep.name!r}"):
                    register_detector(d, replace=True)
            except Exception as err:  # a broken plugin must not break headlens
                warnings.warn(f"skipped detector plugin {ep.name!r} ({ep.value}): {err}", stacklevel=2)
    return DETECTORS


def all_detectors() -> dict[str, Detector]:
    """Every registered detector, entry-point plugins included."""
    return load_plugins()


def get_detector(name: str | Detector) -> Detector:
    """The detector called ``name``: a registered name (entry-point plugins included), ``name(key=value, ...)``
    for one with settings, or ``module:attribute``; a Detector passes through. Unknown names are a
    ``DetectorError`` listing the known ones."""
    if isinstance(name, Detector):
        return name
    name = current_name(name)
    call = _CALL.match(name)
    base = call.group(1) if call else name
    if base not in DETECTORS:
        load_plugins()
    if base not in DETECTORS and ":" in name and not call:
        return _from_reference(name)
    if base not in DETECTORS:
        raise unknown_detector(base, DETECTORS)
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


def _from_reference(name: str) -> Detector:
    """``module:attribute`` -> the Detector(s) it names, registered; the first one is returned."""
    module, _, attr = name.partition(":")
    try:
        obj = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as err:
        raise DetectorError(f"cannot load detector {name!r}: {err}") from None
    found = _as_detectors(obj, name)
    for d in found:
        register_detector(d, replace=True)
    return found[0]


__all__ = ["DETECTORS", "Detector", "all_detectors", "get_detector", "load_plugins", "register_detector",
           "split_names"]
