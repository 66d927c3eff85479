"""``copy_suppression``: a head type read off two rows of the scores table, its attention and its OV circuit.

McDougall et al. (2023) name copy suppression for a head whose *attention* goes to an earlier copy of a token
the model is about to predict and whose *OV circuit* writes against that token (GPT-2 small's L10H7).
Each half alone is something else: ``ov_suppression`` is a statement about the weights (the head's OV puts
most tokens in their own bottom 5, whatever it attends to), and a head that attends to a name and writes
against it on one task may do so through its position, not its OV map. So the type is derived, not scanned:

* a head is labelled ``copy_suppression`` when it carries ``negative_name_mover`` (the attention claim: on
  IOI it attends from the last token to a name the model is about to predict, above chance, and its direct
  logit attribution is against the name it attends to) *and* ``ov_suppression`` (the OV claim, from the
  weights, above its null);
* its row is the negative name mover's row (the attention score on IOI, its interval, its DLA columns), with
  the label of both, so its strength reads on the same scale as every behaviour type;
* a run without both detectors (a model without IOI names, ``--detectors`` naming one) has no such rows.

The rule is docs/scores.md's ("copy_suppression: two claims"); the atlas applies the same two claims to
held-out text (:mod:`headlens.atlas.describe`).
"""

from __future__ import annotations

from typing import Any

ATTENTION, OV, NAME = "negative_name_mover", "ov_suppression", "copy_suppression"
RULE = (f"{NAME}: labelled {ATTENTION} (attention to a predicted name, DLA against it) and {OV} (OV bottom 5); "
        f"the row is the {ATTENTION} row")


def with_copy_suppression(df: Any) -> Any:
    """``df`` with one ``copy_suppression`` row per head when it holds both halves (module docstring).

    >>> import pandas as pd
    >>> df = pd.DataFrame({"layer": [0, 0, 0, 0], "head": [0, 1, 0, 1], "score": [0.5, 0.4, 0.9, 0.1],
    ...                    "detector": [ATTENTION, ATTENTION, OV, OV], "label": [True, True, True, False]})
    >>> out = with_copy_suppression(df)
    >>> out[out.detector == NAME][["head", "score", "label"]].values.tolist()
    [[0, 0.5, True], [1, 0.4, False]]
    """
    import pandas as pd

    det = df["detector"]
    if not ((det == ATTENTION).any() and (det == OV).any()) or (det == NAME).any():
        return df
    ov = df[det == OV].set_index(["layer", "head"])["label"].astype(bool)
    rows = df[det == ATTENTION].copy()
    both = ov.reindex(pd.MultiIndex.from_frame(rows[["layer", "head"]]), fill_value=False).to_numpy()
    rows["detector"], rows["label"] = NAME, rows["label"].astype(bool).to_numpy() & both
    out = pd.concat([df, rows], ignore_index=True)
    out.attrs = {**df.attrs, "copy_suppression_rule": RULE}
    return out
