"""A head's description from measured evidence, its rule scored on held-out text (docs/atlas.md).

Why it looks like this:

* **A description is a prediction.** Each candidate rule (:mod:`headlens.atlas.rules`: previous token,
  induction and its longest-match variant, duplicate token, the offsets 2 and 3, a key the model predicts)
  is simulated on held-out windows: its predicted off-rest attention spreads each query row's mass evenly
  over the rule's targets (nothing where it has none). The agreement is the Pearson correlation of
  predicted and real off-rest attention over every (query, key) cell of those windows, keys neither the
  first token nor the query itself, with a bootstrap CI over windows (sums per window, resampled;
  :mod:`headlens.atlas.heldout` streams them).
* **A rule at or above** :data:`AGREEMENT` names the role, even of a head that rests most of the time (an
  induction head on text with few repeats). Below it, a head whose off-rest attention averages under
  :data:`REST` per row "rests on the first token", any other gets "no clear role"; both with the best
  candidate and its score.
* **Copy suppression from joint evidence** (McDougall et al. 2023: a head that attends to an earlier copy of
  a token the model is about to predict and pushes that token down). Such a head attends to predicted
  tokens only when one occurs earlier and rests otherwise, so the ``predicted_token`` rule rarely explains
  its whole pattern. Two measured claims name it instead, each of which alone would not: in rows where a
  predicted token (the model's own top 5 at the query) occurs earlier, the share of the head's off-rest
  attention that lands on one is above the share an even spread over the row's off-rest keys would give,
  by its whole bootstrap interval on held-out text; and the weight-based ``copy_suppression`` detector
  labels it (its OV circuit ranks a sampled token in the vocabulary's bottom 5 for itself often enough,
  :mod:`headlens.scoring.weights`). A head that copies instead (an induction head also attends to what is
  predicted: it causes the prediction) fails the second.
* No language model writes or judges the text: each sentence is a template filled with a number measured
  here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from headlens.atlas.rules import LATE, ROLE, candidate_rules, late_rules
from headlens.detectors.base import Detector

AGREEMENT = 0.5  # a rule must correlate this well with the head's real off-rest attention to name its role
REST = 0.25  # mean off-rest attention per query row below which a head is said to rest
CS_RULE = "predicted_token"  # the pattern of copy suppression
COPY_SHARE = 0.5  # "writes the token it attends to" when its OV promotes it for this share of exemplar keys


@dataclass(frozen=True)
class Description:
    """A head's tested description: ``role`` (a rule's name, ``"resting"`` or ``"no clear role"``), the best
    ``rule`` and its held-out ``agreement`` with CI, every candidate's agreement, and the paragraph ``text``."""

    layer: int
    head: int
    role: str
    rule: str
    agreement: float
    ci: tuple[float, float]
    text: str
    candidates: dict[str, float] = field(default_factory=dict)
    evidence: dict[str, float] = field(default_factory=dict)


def _corr(s: torch.Tensor) -> torch.Tensor:
    """Pearson correlation from sums ``(..., 6)`` = (n, sx, sy, sxx, syy, sxy)."""
    n, sx, sy, sxx, syy, sxy = s.unbind(-1)
    cov = sxy - sx * sy / n
    var = (sxx - sx * sx / n) * (syy - sy * sy / n)
    return torch.where(var > 0, cov / var.clamp(min=1e-300).sqrt(), torch.zeros_like(cov))


def _with_ci(per_window: torch.Tensor, stat: Any, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The pooled statistic over windows and its 95 % bootstrap interval (windows resampled)."""
    from headlens.scoring.stats import bootstrap_weights

    w = bootstrap_weights(per_window.shape[0], 400, seed)  # (n_boot, W)
    boot = stat(torch.einsum("bw,w...->b...", w, per_window))  # (n_boot, L, H)
    return stat(per_window.sum(0)), boot.quantile(0.025, 0), boot.quantile(0.975, 0)


def describe(model: Any, exemplars: Any, heldout: list[torch.Tensor], batch_size: int = 8) -> list[Description]:
    """Every head's :class:`Description`, layer by layer: its rules scored on the ``heldout`` windows, its writes
    read at its exemplars' keys (:func:`headlens.atlas.reads.ov_on_heads`)."""
    from headlens.atlas.heldout import heldout_stats
    from headlens.atlas.reads import ov_on_heads

    rules = candidate_rules()
    early = {name: rule for name, rule in rules.items() if name not in LATE}
    stats = heldout_stats(model, heldout, early, late_rules(rules), batch_size)
    agree = {name: _with_ci(stats[f"corr:{name}"], _corr) for name in rules}  # each (L, H) x 3
    mass = {name: _with_ci(stats[f"mass:{name}"], lambda s: s[..., 0] / s[..., 1].clamp(min=1)) for name in rules}
    chance = {name: stats[f"mass:{name}"][..., 2].sum(0) / stats[f"mass:{name}"][..., 1].sum(0).clamp(min=1)
              for name in rules}
    off = _with_ci(stats["rest"], lambda s: s[..., 0] / s[..., 2].clamp(min=1))
    first = _with_ci(stats["rest"], lambda s: s[..., 1] / s[..., 2].clamp(min=1))
    cs = _copy_suppression(model, stats[f"mass:{CS_RULE}"], tuple(off[0].shape))
    H = exemplars.n_heads
    ovs = ov_on_heads(model, {divmod(i, H): kept for i, kept in enumerate(exemplars.top["attention"])})
    out = []
    for layer in range(exemplars.n_layers):
        for h in range(exemplars.n_heads):
            at = (layer, h)
            scores = {name: float(agree[name][0][at]) for name in rules}
            best = max(scores, key=scores.get)
            ov = ovs[at]
            ev = {"off_rest": float(off[0][at]), "first": float(first[0][at]), "mass": float(mass[best][0][at]),
                  "mass_lo": float(mass[best][1][at]), "mass_hi": float(mass[best][2][at]),
                  "chance": float(chance[best][at]), "copies": ov["copies"], "suppresses": ov["suppresses"],
                  "n_keys": ov["n"], "off_lo": float(off[1][at]), "off_hi": float(off[2][at]),
                  "first_lo": float(first[1][at]), "first_hi": float(first[2][at]),
                  **{key: float(v[at]) for key, v in cs.items()}}
            ci = (float(agree[best][1][at]), float(agree[best][2][at]))
            role = role_of(best, scores[best], ev)
            text = _text(role, rules[best], scores[best], ci, ev)
            out.append(Description(layer, h, role, best, scores[best], ci, text, scores, ev))
    return out


def _copy_suppression(model: Any, sums: torch.Tensor, shape: tuple[int, int]) -> dict[str, torch.Tensor]:
    """Copy suppression's two claims per head, each ``(L, H)``: ``pred_share`` (with ``pred_lo``, ``pred_hi``),
    the share of its off-rest attention in rows with a predicted token that lands on one, and ``pred_null``,
    that share were each row's off-rest attention spread evenly over its off-rest keys (from ``sums``, the
    held-out ``mass:predicted_token``); ``ov_score`` (``ov_lo``, ``ov_hi``), the share of sampled tokens its
    OV circuit ranks in the vocabulary's bottom 5 for themselves, and ``ov_label``, the ``copy_suppression``
    detector's label (:mod:`headlens.scoring.weights`; NaN where the readout does not apply)."""
    from headlens.detectors import get_detector
    from headlens.errors import HeadlensError
    from headlens.scoring.weights import summarize_weights

    share, lo, hi = _with_ci(sums, lambda s: s[..., 0] / s[..., 3].clamp(min=1e-300))
    out = {"pred_share": share, "pred_lo": lo, "pred_hi": hi,
           "pred_null": sums[..., 4].sum(0) / sums[..., 3].sum(0).clamp(min=1e-300)}
    detector = get_detector("copy_suppression")
    try:
        w = summarize_weights(detector.weights_fn(model), detector.threshold)
    except HeadlensError:  # an encoder, a packed model: no OV readout
        return {**out, **{k: torch.full(shape, float("nan")) for k in ("ov_score", "ov_lo", "ov_hi", "ov_label")}}
    return {**out, "ov_score": w.summary.score.reshape(shape), "ov_lo": w.summary.ci_low.reshape(shape),
            "ov_hi": w.summary.ci_high.reshape(shape), "ov_label": w.labels.double().reshape(shape)}


def role_of(best: str, score: float, ev: dict[str, float]) -> str:
    """The role a head's evidence names (module docstring): its best rule's when that agrees well enough (even
    for a head that mostly rests: an induction head on text with few repeats); copy suppression when it
    attends to predicted tokens above chance and writes against what it attends to; else resting or none.

    >>> ev = {"ov_label": 1.0, "pred_lo": 0.2, "pred_null": 0.05, "off_rest": 0.4}
    >>> role_of("previous_token", 0.3, ev), role_of("induction_longest", 0.7, ev)
    ('copy_suppression', 'induction')
    """
    suppresses = ev["ov_label"] == 1.0  # NaN (no OV readout) is not a label
    if score >= AGREEMENT:
        return "copy_suppression" if best == CS_RULE and suppresses else ROLE.get(best, best)
    if suppresses and ev["pred_lo"] > ev["pred_null"]:
        return "copy_suppression"
    return "resting" if ev["off_rest"] < REST else "no clear role"


def _text(role: str, rule: Detector, score: float, ci: tuple[float, float], ev: dict[str, float]) -> str:
    """The paragraph: one measured claim per sentence, each with its number (and CI)."""
    tested = (f"Simulated from the rule '{rule.name}' on held-out text, its predicted attention agrees with "
              f"the real one at r = {score:.2f} [{ci[0]:.2f}, {ci[1]:.2f}]")
    if role == "resting":
        return (f"Rests on the first token: {ev['first']:.2f} of its attention per query row "
                f"[{ev['first_lo']:.2f}, {ev['first_hi']:.2f}] goes there on held-out text, and only "
                f"{ev['off_rest']:.2f} [{ev['off_lo']:.2f}, {ev['off_hi']:.2f}] to keys other than the first token "
                f"and itself. Its best candidate rule is '{rule.name}': r = {score:.2f} [{ci[0]:.2f}, {ci[1]:.2f}].")
    writes = _writes_text(ev)
    if role == "copy_suppression" and rule.name != CS_RULE:
        return (f"Attends to earlier copies of tokens the model predicts next: in rows where one occurs, "
                f"{ev['pred_share']:.2f} [{ev['pred_lo']:.2f}, {ev['pred_hi']:.2f}] of the attention it puts off "
                f"the first token and itself lands on them, against {ev['pred_null']:.2f} were it spread evenly. "
                f"Its OV circuit pushes a token it attends to down: {ev['ov_score']:.2f} [{ev['ov_lo']:.2f}, "
                f"{ev['ov_hi']:.2f}] of sampled tokens rank in the bottom 5 of the vocabulary for themselves "
                f"(the copy_suppression detector's label).{writes} Both are copy suppression's (McDougall et al. "
                f"2023), though no rule predicts its whole pattern: the best, '{rule.name}', agrees at r = "
                f"{score:.2f} [{ci[0]:.2f}, {ci[1]:.2f}] on held-out text. Role: copy suppression.")
    if role == "no clear role":
        return (f"No clear role: it puts {ev['off_rest']:.2f} of its attention off the first token and itself, "
                f"but its best candidate rule, '{rule.name}' ({rule.description}), explains it poorly. {tested}, "
                f"below the {AGREEMENT:.2f} a role needs.{writes}")
    lift = ev["mass"] / ev["chance"] if ev["chance"] > 0 else float("inf")
    return (f"{rule.description[0].upper()}{rule.description[1:]} ({ev['mass']:.2f} of its attention "
            f"[{ev['mass_lo']:.2f}, {ev['mass_hi']:.2f}] where the rule has a target, {lift:.0f}x chance). "
            f"{tested}.{writes} Role: {role.replace('_', ' ')}.")


def _writes_text(ev: dict[str, float]) -> str:
    n = int(ev["n_keys"])
    if n == 0 or ev["copies"] != ev["copies"]:
        return ""
    if ev["copies"] >= COPY_SHARE:
        return (f" It writes the token it attends to (its OV circuit ranks that token in its top 10 for "
                f"{ev['copies']:.2f} of its {n} exemplar keys).")
    if ev["suppresses"] >= COPY_SHARE:
        return (f" It pushes down the token it attends to (its OV circuit ranks that token in its bottom 10 for "
                f"{ev['suppresses']:.2f} of its {n} exemplar keys), as copy suppression does.")
    return ""
