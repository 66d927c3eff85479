"""The primary statistic of each row of a scores table, for ranking and for the strongest label.

Where a head type has distractors (coreference, user annotations with distractor spans), Clark et al.
2019's preference accuracy is primary (:mod:`headlens.scoring.annotated`); elsewhere the score is. Works on
the table alone (pandas, no torch): the dashboard ranks and colours heads from shipped scores with it
before torch is imported.
"""

from __future__ import annotations

from typing import Any

# the label rule in one line, for what a view says when no head passes it (docs/scores.md, "the label rule")
LABEL_RULE = ("the low end of the strength's 95% CI, (ci_low - chance) / (1 - chance), at least 0.4 or --threshold; "
              "weight scores and name movers: their own rules")


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
    """How strongly each row's head does its type, on one scale for every type: the primary statistic's place
    between its type's own null and a perfect head, ``(x - chance) / (1 - chance)`` (Cohen's kappa form: 0 at
    chance, 1 perfect, below 0 under chance). ``x`` is the score against its uniform baseline (for a weight
    score, the rank statistic against its chance 5/V), or the preference accuracy against its chance with
    distractors. Lift (``x / chance``) is not comparable across types: 40x is a strong induction head and
    4,000x an ordinary weight score whose chance is 5/V; it stays in the table, to compare heads of one type.
    The summary, the grid's strongest label and the order of a head's labels use this strength.

    >>> import pandas as pd
    >>> rows = pd.DataFrame({"detector": ["induction", "ov_copying"], "score": [0.926, 0.453],
    ...                      "baseline": [0.0231, 0.0001], "lift": [40.1, 4530.0]})
    >>> [round(float(v), 3) for v in strength(rows)]
    [0.924, 0.453]
    """
    base = scores["baseline"].astype(float) if "baseline" in scores else scores["score"] * float("nan")
    out = (scores["score"].astype(float) - base) / (1.0 - base)
    pref = has_preference(scores)
    for det in scores.loc[pref, "detector"].unique():
        rows = pref & (scores["detector"] == det)
        chance = preference_chance(scores, str(det))
        out[rows] = (scores.loc[rows, "preference"].astype(float) - chance) / (1.0 - chance)
    return out


def from_weights(rows: Any) -> Any:
    """Boolean Series: rows scored from the weights (``ov_copying``, ``ov_suppression``, ``successor``: what the
    head's OV circuit would write, measured without a prompt, ``n_prompts`` 0), not from what it does on text.
    A hand-made table without ``n_prompts``: the rows without a lift (no probe, no chance level)."""
    import pandas as pd

    if "n_prompts" in rows.columns:
        return rows["n_prompts"].astype(float) == 0
    if "lift" in rows.columns:
        return rows["lift"].isna()
    return pd.Series(False, index=rows.index)


def ranked(scores: Any, detector: str) -> Any:
    """``detector``'s rows, best first by its primary statistic (ties: the score)."""
    rows = scores[scores["detector"] == detector]
    return rows.assign(_key=primary(rows)).sort_values(["_key", "score"], ascending=False).drop(columns="_key")


# -- task types: a head's behaviour on one task's prompts (IOI, coreference, a needle), listed after the types
# that read the text's own patterns (previous token, induction, brackets), which every text exercises
TASK_TYPES = frozenset({"name_mover", "negative_name_mover", "copy_suppression", "coreference", "retrieval"})


def is_task(detector: str) -> bool:
    """Whether ``detector`` is a task type (:data:`TASK_TYPES`).

    >>> is_task("negative_name_mover"), is_task("previous_token")
    (True, False)
    """
    return str(detector).split("(")[0] in TASK_TYPES


# -- resting: a state of almost every head, not a type that crowds the others out ---------------------------
RESTING = frozenset({"first_token", "sink"})  # head types that measure resting on the first position(s)


def is_resting(detector: str) -> bool:
    """Whether ``detector`` measures resting (``first_token``, ``sink`` and its variants ``sink(s=8)``).

    >>> is_resting("first_token"), is_resting("sink(s=8)"), is_resting("induction")
    (True, True, False)
    """
    return str(detector).split("(")[0] in RESTING


def label_order(labelled: Any) -> Any:
    """Labelled rows in the one order every view uses (docs/scores.md, "One strength scale, one label rule"):
    within a head, what it does on text first (behaviour types, strongest first by :func:`strength`), then what
    its weights would do (:func:`from_weights`), its resting label (``first_token``, ``sink``) last. So a
    head's first row is its strongest behaviour, a weight type comes first only for a head with no behaviour
    label, and a resting label only for a head that does nothing else. Rows whose strength is unknown follow
    by score.
    """
    if labelled.empty:
        return labelled.reset_index(drop=True)
    nan = float("nan")  # a hand-made table may lack lift or score: then the table's order decides
    src = light(labelled).reset_index(drop=True)
    group = src["detector"].map(is_resting).astype(int) * 2 + from_weights(src).astype(int)  # behaviour 0, weights 1
    power = strength(src) if "score" in src and "baseline" in src else src["lift"] if "lift" in src else nan
    keys = src.assign(_group=group, _strength=power,  # a hand-made table without baselines: its lifts
                      _score=src["score"] if "score" in src else nan)
    order = keys.sort_values(["_group", "_strength", "_score"], ascending=[True, False, False], na_position="last",
                             kind="stable").index.to_numpy()
    return labelled.iloc[order].reset_index(drop=True)


def strongest_rows(scores: Any) -> Any:
    """One row per labelled head: its strongest label by :func:`label_order` (the grid's square, the summary's
    type). Empty when no head carries a label."""
    if scores.empty or "label" not in scores.columns:
        return scores.iloc[0:0]
    labelled = scores[scores["label"].fillna(False).astype(bool)]
    return label_order(labelled).drop_duplicates(["layer", "head"], keep="first").reset_index(drop=True)
