"""Which cut-off each detector is labelled at, and which gated detectors are labelled against their own null.

A pattern detector's cut-off is κ on the strength scale: the low end of the strength's CI,
``(ci_low - chance) / (1 - chance)``, must reach it (:func:`headlens.scoring.stats.strength_label`); a weight
detector's is τ on its score (:mod:`headlens.scoring.weights`). The defaults live on the detectors
(:func:`headlens.scoring.stats.default_threshold`); a user's ``threshold`` (one number for every behaviour type,
or a dict per detector) overrides them. See docs/scores.md, "Baselines, intervals and the label rule".
"""

from __future__ import annotations

from collections.abc import Sequence

from headlens.detectors import all_detectors, get_detector
from headlens.detectors.base import Detector
from headlens.scoring.stats import DEFAULT_THRESHOLD, default_threshold
from headlens.zoo.names import current_name


def against_null(threshold: float | dict[str, float] | None, dets: Sequence[Detector]) -> set[str]:
    """Gated detectors (the name movers) whose attention half is labelled against the type's own null (its
    CI above the uniform baseline, :func:`headlens.scoring.stats.above_null`) and their gate, not a κ: a mass
    threshold tuned on one model did not transfer (on a family never seen, a name mover at 0.37 got no label). A κ the user sets for the detector (or for all)
    still applies."""
    if isinstance(threshold, int | float):
        return set()
    mine = threshold if isinstance(threshold, dict) else {}
    return {d.name for d in dets if d.gate is not None and d.name not in mine}


def thresholds(threshold: float | dict[str, float] | None, annotated: Sequence[str] = (),
                dets: Sequence[Detector] = ()) -> dict[str, float]:
    pool = {**all_detectors(), **{d.name: d for d in dets}}  # Detector objects passed in need not be registered
    out = {name: default_threshold(d) for name, d in pool.items()}
    out.update({name: DEFAULT_THRESHOLD for name in annotated})
    if isinstance(threshold, dict):
        threshold = {current_name(name): tau for name, tau in threshold.items()}  # old names of renamed types
        for name, tau in threshold.items():
            if name not in annotated and name not in pool:
                get_detector(name)
            out[name] = float(tau)
        for name in out:  # a variant with settings, "streaming(w=128)", takes its base detector's threshold
            base = name.split("(")[0]
            if base != name and name not in threshold and base in threshold:
                out[name] = float(threshold[base])
    elif threshold is not None:
        out.update({n: float(threshold) for n in out if n not in pool or pool[n].kind != "weights"})
    return out
