"""The primary statistic of each row of a scores table, for ranking and for the strongest label.

Where a head type has distractors (coreference, user annotations with distractor spans), Clark et al.
2019's preference accuracy is primary (:mod:`headlens.scoring.annotated`); elsewhere the score is. Works on
the table alone (pandas, no torch): the dashboard ranks and colours heads from shipped scores with it
before torch is imported.
"""

from __future__ import annotations

from typing import Any


def light(scores: Any) -> Any:
    """``scores`` sharing its data, with only the provenance these functions read (``probes``). pandas deep-copies
    ``attrs`` in every operation, and a real LM's provenance is large (the weight detectors' per-head records:
    27 kB on SmolLM2), which made the dashboard's grid of 270 heads take half a second of copying."""
    import pandas as pd

    out = pd.DataFrame(scores)  # the same columns, no copy; attrs start empty
    if "probes" in scores.attrs:
        out.attrs["probes"] = scores.attrs["probes"]
    return out


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


# -- resting: a state of almost every head, not a type that crowds the others out ---------------------------
RESTING = frozenset({"first_token", "sink"})  # head types that measure resting on the first position(s)


def is_resting(detector: str) -> bool:
    """Whether ``detector`` measures resting (``first_token``, ``sink`` and its variants ``sink(s=8)``).

    >>> is_resting("first_token"), is_resting("sink(s=8)"), is_resting("induction")
    (True, True, False)
    """
    return str(detector).split("(")[0] in RESTING


def label_order(labelled: Any) -> Any:
    """Labelled rows in the one order every view uses (docs/scores.md, "Resting"): within a head, what it
    does when it is not resting first, strongest first by :func:`strength`; its resting label (``first_token``,
    ``sink``) last. So a head's first row is its strongest label, and a resting label comes first only for a
    head that does nothing else. Heads whose strength is unknown (weight scores: no baseline) follow by score.
    """
    if labelled.empty:
        return labelled.reset_index(drop=True)
    nan = float("nan")  # a hand-made table may lack lift or score: then the table's order decides
    src = light(labelled).reset_index(drop=True)
    keys = src.assign(_resting=src["detector"].map(is_resting).astype(bool),
                      _strength=strength(src) if "lift" in src else nan,
                      _score=src["score"] if "score" in src else nan)
    order = keys.sort_values(["_resting", "_strength", "_score"], ascending=[True, False, False], na_position="last",
                             kind="stable").index.to_numpy()
    return labelled.iloc[order].reset_index(drop=True)


def strongest_rows(scores: Any) -> Any:
    """One row per labelled head: its strongest label by :func:`label_order` (the grid's square, the summary's
    type). Empty when no head carries a label."""
    if scores.empty or "label" not in scores.columns:
        return scores.iloc[0:0]
    labelled = scores[scores["label"].fillna(False).astype(bool)]
    return label_order(labelled).drop_duplicates(["layer", "head"], keep="first").reset_index(drop=True)
