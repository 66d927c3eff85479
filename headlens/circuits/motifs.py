"""Named motifs: an edge table joined to ``classify``'s head labels.

* ``induction circuit``: a previous-token head with a significant edge into an induction head's **k**
  (Olsson et al. 2022: the induction head's key reads "the token before me was X");
* ``duplicate -> induction``: a duplicate-token head with a significant edge into an induction head's **q**;
* ``sink-fed``: a head with a significant edge from a sink (or first-token) head.
"""

from __future__ import annotations

from typing import Any

from headlens.circuits.edges import significant_mask

MOTIFS = {
    "induction circuit": ({"previous_token"}, {"induction"}, {"k"}),
    "duplicate -> induction": ({"duplicate_token"}, {"induction"}, {"q"}),
    "sink-fed": ({"sink", "first_token"}, None, {"q", "k", "v"}),
}


def _has(label: str, wanted: set[str]) -> bool:
    parts = {p.strip() for p in label.replace("+", ",").split(",") if p.strip()}
    return bool(parts & wanted)


def motifs(df: Any, labels: dict[str, str]) -> Any:
    """One row per (motif, edge): ``motif, sender, receiver, input, effect, sender_label, receiver_label``."""
    import pandas as pd

    sig = significant_mask(df)
    rows = []
    for r, ok in zip(df.itertuples(), sig, strict=True):
        if not ok:
            continue
        s_label, r_label = labels.get(r.sender, ""), labels.get(r.receiver, "")
        for name, (senders, receivers, inputs) in MOTIFS.items():
            if _has(s_label, senders) and (receivers is None or _has(r_label, receivers)) and r.input in inputs:
                rows.append([name, r.sender, r.receiver, r.input, r.effect, s_label, r_label])
    return pd.DataFrame(rows, columns=["motif", "sender", "receiver", "input", "effect", "sender_label",
                                       "receiver_label"])
