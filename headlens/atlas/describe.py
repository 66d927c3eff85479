"""A head's description from measured evidence, its rule scored on held-out text (docs/scores.md).

Why it looks like this:

* **A description is a prediction.** Each candidate rule (a causal pattern detector with a predicate:
  previous token, induction, duplicate token; or a fixed offset of 2 or 3) is simulated on held-out windows:
  its predicted off-rest attention spreads each query row's mass evenly over the rule's targets (nothing
  where it has none). The agreement is the Pearson correlation of predicted and real off-rest attention
  over every (query, key) cell of those windows, keys neither the first token nor the query itself, with a
  bootstrap CI over windows (sums per window, resampled).
* **A rule at or above** :data:`AGREEMENT` names the role, even of a head that rests most of the time (an
  induction head on text with few repeats). Below it, a head whose off-rest attention averages under
  :data:`REST` per row "rests on the first token", any other gets "no clear role"; both with the best
  candidate and its score. No language model writes
  or judges the text: each sentence is a template filled with a number measured here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from headlens.atlas.rules import LATE, candidate_rules, late_rules
from headlens.detectors.base import Detector

AGREEMENT = 0.5  # a rule must correlate this well with the head's real off-rest attention to name its role
REST = 0.25  # mean off-rest attention per query row below which a head is said to rest
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
                  "first_lo": float(first[1][at]), "first_hi": float(first[2][at])}
            ci = (float(agree[best][1][at]), float(agree[best][2][at]))
            # a rule that fits names the role even of a head that mostly rests (an induction head on text with
            # few repeats); otherwise a head that keeps its attention home rests, and any other has no clear role
            role = best if scores[best] >= AGREEMENT else "resting" if ev["off_rest"] < REST else "no clear role"
            if role == "predicted_token" and ev["suppresses"] >= COPY_SHARE:
                role = "copy_suppression"  # attends to what the model predicts and writes against it
            text = _text(role, rules[best], scores[best], ci, ev)
            out.append(Description(layer, h, role, best, scores[best], ci, text, scores, ev))
    return out


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
