"""What a scores table says at a glance: per head type, how many heads carry the label and the strongest
of them. ``headlens classify`` prints it by default (``--all`` prints every labelled row) and the HTML
report opens with it.

Works on the table alone (pandas, no torch), in the one order of :func:`headlens.scoring.primary.label_order`:

* a type's heads are its labelled heads best first by the type's primary statistic (the score; the
  preference accuracy for types with distractors, :func:`headlens.scoring.primary.ranked`);
* a **resting** type (``first_token``, ``sink``) lists only the heads that do nothing else: a head that
  rests and is an induction head is listed under induction, its ``rest`` beside it. The count keeps
  every head that carries the label;
* a type with distractors (coreference) shows its ranking when no head is labelled, as the census it
  is (labelled or not); another type without a label gives its best head, for the line that says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from headlens.scoring.primary import (
    from_weights,
    has_preference,
    is_resting,
    is_task,
    ranked,
    strength,
    strongest_rows,
)

TOP = 3  # heads listed per type


@dataclass(frozen=True)
class TypeSummary:
    """One head type of a scores table.

    Attributes:
        detector: the type (the table's ``detector``).
        n_labelled: heads that carry its label.
        heads: its strongest rows (a DataFrame slice of the table, best first): labelled heads; for a
            resting type the labelled heads that carry no other label; with distractors and no label the
            ranking; for another type without a label its best head.
        resting: a resting type (``first_token``, ``sink``).
        n_only: resting types: heads whose only labels are resting ones (the others count under their type).
        preference: the primary statistic is preference accuracy (columns ``preference*``).
        weights: a weight score without a CI (an old table: no probe, no CI, baseline or lift).
        ov: scored from the weights (:func:`headlens.scoring.primary.from_weights`): listed after the types
            that say what heads do on text.
    """

    detector: str
    n_labelled: int
    heads: Any
    resting: bool = False
    n_only: int = 0
    preference: bool = False
    weights: bool = False
    ov: bool = False

    @property
    def best_strength(self) -> float:
        """How strongly the first listed head does the type (:func:`headlens.scoring.primary.strength`)."""
        if self.heads.empty:
            return float("nan")
        return float(strength(self.heads).iloc[0])


def type_summaries(scores: Any, top: int = TOP) -> list[TypeSummary]:
    """Every head type of ``scores``: labelled behaviour types first, the text's own patterns before task types
    (each by their best head's strength, one scale for every type), then weight scores, resting types last,
    then the types without a label.

    >>> import pandas as pd
    >>> rows = [dict(layer=0, head=h, detector=d, score=s, lift=s / 0.05, label=s > 0.4, n_positions=99)
    ...         for h, d, s in [(0, "induction", 0.9), (0, "first_token", 0.8), (1, "first_token", 0.9),
    ...                         (1, "induction", 0.1)]]
    >>> [(t.detector, t.n_labelled, t.n_only, [int(h) for h in t.heads["head"]])
    ...  for t in type_summaries(pd.DataFrame(rows))]
    [('induction', 1, 0, [0]), ('first_token', 2, 1, [1])]
    """
    import pandas as pd

    if scores.empty:
        return []
    labelled = scores[scores["label"].fillna(False).astype(bool)]
    only = strongest_rows(scores)
    only = only[only["detector"].map(is_resting).astype(bool)]  # heads whose strongest label is a resting one
    out = []
    for det in dict.fromkeys(str(d) for d in scores["detector"]):
        rows = scores[scores["detector"] == det]
        mine = labelled[labelled["detector"] == det]
        pref = bool(has_preference(rows).any())
        weights = bool((rows["n_positions"] == 0).all() and rows["lift"].isna().all())
        ov = weights or bool(from_weights(rows).all())
        if is_resting(det):
            keep = {(int(r.layer), int(r.head)) for r in only[only["detector"] == det].itertuples()}
            only_rest = [(int(r.layer), int(r.head)) in keep for r in mine.itertuples()]
            heads = ranked(mine[pd.Series(only_rest, index=mine.index, dtype=bool)], det)
            out.append(TypeSummary(det, len(mine), heads.head(top), True, len(heads), weights=weights, ov=ov))
            continue
        listed = ranked(mine if len(mine) else rows, det).head(top if pref or len(mine) else 1)
        out.append(TypeSummary(det, len(mine), listed, preference=pref, weights=weights, ov=ov))
    return sorted(out, key=_order)


def _order(t: TypeSummary) -> tuple[int, float]:
    """Labelled types that read the text's own patterns (previous token, induction, brackets), then task types
    (name movers, coreference: :data:`headlens.scoring.primary.TASK_TYPES` and types with distractors), each
    by their best head's strength; then weight scores (by strength too), resting types, rankings without a
    label (types with distractors), the other types without a label."""
    if t.n_labelled == 0:  # in the table's order
        return (5 if t.preference else 6), 0.0
    s = t.best_strength
    group = 4 if t.resting else 3 if t.ov or s != s else 2 if is_task(t.detector) or t.preference else 1
    return group, -(s if s == s else 0.0)
