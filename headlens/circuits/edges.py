"""The edge table: each edge's effect with a bootstrap CI, a random-sender control, and its composition.

``effect`` is the mean over prompts of ``metric(edge patched) - metric(clean)``; its CI is a percentile
bootstrap over prompts. The control is the same receiver input patched from random senders of the
sender's own layer (other heads; as ``sweep`` draws its random heads), averaged per prompt over
``n_control`` of them; ``embed`` and MLP senders have no control (NaN). An edge is *significant* when
its CI excludes zero on the harmful side and does not overlap the control's CI.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from headlens.circuits.composition import approximate, random_baseline, reference_scores, scores
from headlens.circuits.nodes import Edge, Node, kv_head
from headlens.interventions.controls import control_groups
from headlens.interventions.metrics import bootstrap_ci, get_metric

COLUMNS = ["model", "sender", "receiver", "kv_head", "input", "effect", "ci_low", "ci_high", "control",
           "control_ci_low", "control_ci_high", "composition", "composition_z", "disagree", "label",
           "receiver_pos", "sender_pos"]
Z_STRONG = 3.0  # composition_z beyond which weights say "these heads compose"
Z_WEAK = 2.0  # below which they say "no composition"
# an effect smaller than this fraction of the clean metric is no evidence, however tight its CI: an untrained
# model's heads move the loss by ~1e-7 nats with CIs that exclude zero (float noise, not a circuit)
EFFECT_FLOOR = 1e-3


def control_edges(model: Any, edges: Sequence[Edge], n_control: int, seed: int) -> dict[Edge, list[Edge]]:
    """Per head-sender edge: the same receiver input from ``n_control`` random other heads of the sender's layer."""
    rng = np.random.default_rng(seed)
    out: dict[Edge, list[Edge]] = {}
    for e in edges:
        s = e.sender
        if s.kind != "head" or n_control <= 0:
            out[e] = []
            continue
        groups = control_groups(((s.layer, s.head),), model.cfg.n_heads, n_control, rng, scope="layer")
        out[e] = [Edge(Node("head", layer, h), e.receiver, e.input, e.group, e.pos, e.sender_pos)
                  for (layer, h), in groups]
    return out


def significant(row: Any, higher_is_worse: bool, floor: float = 0.0, two_sided: bool = False) -> bool:
    """CI on the harmful side of ``floor`` (an effect too small to be evidence, see :data:`EFFECT_FLOOR`),
    and clear of the control's CI (when there is one). ``two_sided``: the helpful side counts too (a head
    that writes against the answer, whose ablation *raises* the metric: IOI's negative name movers)."""
    up = row.ci_low > floor and not (row.control == row.control and row.ci_low <= row.control_ci_high)
    down = row.ci_high < -floor and not (row.control == row.control and row.ci_high >= row.control_ci_low)
    if two_sided:
        return bool(up or down)
    return bool(up if higher_is_worse else down)


def effect_floor(clean: float) -> float:
    """The smallest effect that counts as evidence for a metric whose clean value is ``clean``."""
    return EFFECT_FLOOR * abs(float(clean)) if clean == clean else 0.0


def higher_is_worse(metric: str) -> bool:
    """Which way an edge's effect is harmful: a task metric's own; a receiver's score dropping (``receiver:``)."""
    from headlens.circuits.local import is_receiver_metric

    return False if is_receiver_metric(metric) else get_metric(metric).higher_is_worse


def edge_table(model: Any, metric: str, edges: Sequence[Edge], clean: np.ndarray | dict[Edge, np.ndarray],
               values: dict[tuple[Edge, str], np.ndarray], controls: dict[Edge, list[Edge]],
               labels: dict[str, str] | None = None, n_boot: int = 1000, seed: int = 0,
               composition: bool = True, ref: dict[str, np.ndarray] | None = None) -> Any:
    """The tidy table (:data:`COLUMNS`), one row per edge, in the order given. ``clean``: the metric's clean
    values per prompt, or per edge (a receiver-local metric: each receiver's own score). ``ref``: the model's
    reference composition scores by input (:func:`~headlens.circuits.composition.reference_scores`), filled in
    as needed: pass the same dict to every table of one model (discovery's rounds) to compute them once."""
    import pandas as pd

    per_edge = isinstance(clean, dict)
    composition = composition and not getattr(model, "packed_weights", None)  # packed weights: effects only
    comp = scores(model, edges, seed=seed) if composition else {}
    ref = {} if ref is None else ref
    for c in sorted({e.input for e in comp} - set(ref)):
        ref[c] = reference_scores(model, c, seed=seed)
    worse = higher_is_worse(metric)
    rows, says = [], []
    for e in edges:
        delta = values[e, metric] - (clean[e] if per_edge else clean)
        lo, hi = bootstrap_ci(delta, n_boot, seed)
        c_mean = c_lo = c_hi = float("nan")
        if controls.get(e):
            c_delta = np.mean([values[c, metric] - (clean[c] if per_edge else clean) for c in controls[e]],
                              axis=0)  # (B,) per prompt
            c_mean = float(c_delta.mean())
            c_lo, c_hi = bootstrap_ci(c_delta, n_boot, seed)
        score, z = comp.get(e, (float("nan"), float("nan")))
        says.append(_weights_say(score, z, ref.get(e.input)))
        r = e.receiver
        rows.append([getattr(model, "name", ""), e.sender.name, r.name,
                     kv_head(model, r.head) if r.kind == "head" else -1, e.input, float(delta.mean()), lo, hi,
                     c_mean, c_lo, c_hi, score, z, False, _label(e, labels), e.pos, e.sender_pos])
    df = pd.DataFrame(rows, columns=COLUMNS)
    sig = df.apply(lambda row: significant(row, worse), axis=1) if len(df) else df["disagree"]
    say = pd.Series(says, index=df.index, dtype=object)
    df["disagree"] = ((sig & (say == "no")) | (~sig & (say == "yes"))).astype(bool)
    base = np.mean([clean[e] for e in edges], axis=0) if per_edge and len(edges) else clean
    base = np.array([np.nan]) if isinstance(base, dict) else np.asarray(base)
    df.attrs.update(metric=metric, clean=float(base.mean()), n_prompts=len(base),
                    composition_baseline=random_baseline(model) if composition else float("nan"))
    note = approximate(model) if composition else None
    if note:
        df.attrs["composition_note"] = note
    return df


def _weights_say(score: float, z: float, ref: np.ndarray | None) -> str:
    """What the weights say of an edge: ``"yes"`` when it composes beyond the rotation null (``z >
    Z_STRONG``) *and* beyond 95% of this model's head pairs (``ref``: trained weights sit far above the
    null almost everywhere, so the null alone says yes to most pairs); ``"no"`` when ``z < Z_WEAK`` or
    the weights do not single the pair out (below 75% of the model's pairs); ``""`` when there is no
    score (not head to head) or neither holds."""
    if z != z or ref is None or not len(ref):
        return ""
    if z < Z_WEAK or score < float(np.quantile(ref, 0.75)):
        return "no"
    if z > Z_STRONG and score > float(np.quantile(ref, 0.95)):
        return "yes"
    return ""


def _label(e: Edge, labels: dict[str, str] | None) -> str:
    if not labels:
        return ""
    s, r = labels.get(e.sender.name, ""), labels.get(e.receiver.name, "")
    return f"{s or '-'} -> {r or '-'}" if (s or r) else ""


def significant_mask(df: Any, two_sided: bool | None = None) -> Any:
    """Boolean Series: which rows of an edge table are significant (see :func:`significant`); ``two_sided``
    defaults to what the table's discovery used (``attrs["two_sided"]``)."""
    worse = higher_is_worse(df.attrs.get("metric", "repeated_loss"))
    floor = effect_floor(df.attrs.get("clean", float("nan")))
    both = bool(df.attrs.get("two_sided", False)) if two_sided is None else two_sided
    return (df.apply(lambda row: significant(row, worse, floor, both), axis=1).astype(bool) if len(df)
            else df["disagree"])
