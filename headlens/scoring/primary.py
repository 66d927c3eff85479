"""The primary statistic of each row of a scores table, for ranking and for the strongest label.

Where a head type has distractors (coreference, user annotations with distractor spans), Clark et al.
2019's preference accuracy is primary (:mod:`headlens.scoring.annotated`); elsewhere the score is. Works on
the table alone (pandas, no torch): the dashboard ranks and colours heads from shipped scores with it
before torch is imported.
"""

from __future__ import annotations

from typing import Any


def has_preference(rows: Any) -> Any:
    """Boolean Series: rows whose detector has distractors (a preference accuracy)."""
    import pandas as pd

    if "preference" not in rows.columns:
        return pd.Series(False, index=rows.index)
    return rows["preference"].notna()


def preference_chance(scores: Any, detector: str) -> float:
    """The chance level of ``detector``'s preference accuracy (from the table's provenance; 0.5 when lost)."""
    value = scores.attrs.get("probes", {}).get(f"annotated:{detector}", {}).get("preference_chance")
    return float(value) if value else 0.5


def primary(rows: Any) -> Any:
    """Each row's primary statistic: preference accuracy where the detector has distractors, else the score."""
    return rows["preference"].where(has_preference(rows), rows["score"]) if "preference" in rows else rows["score"]


def strength(scores: Any) -> Any:
    """How strongly each row's head does its type, comparable across types: the lift of the primary statistic
    over its chance level (preference / chance with distractors, else score / uniform baseline = ``lift``).
    The grid's strongest label and the order of a head's labels use it."""
    out = scores["lift"].astype(float).copy()
    pref = has_preference(scores)
    for det in scores.loc[pref, "detector"].unique():
        rows = pref & (scores["detector"] == det)
        out[rows] = scores.loc[rows, "preference"] / preference_chance(scores, str(det))
    return out


def ranked(scores: Any, detector: str) -> Any:
    """``detector``'s rows, best first by its primary statistic (ties: the score)."""
    rows = scores[scores["detector"] == detector]
    return rows.assign(_key=primary(rows)).sort_values(["_key", "score"], ascending=False).drop(columns="_key")
