"""One verdict per head: a head's probe labels, its atlas description and its measured effects on one card.

The scores table (``headlens classify``), the atlas page and the dashboard's head view all say what a head
does; they read it from one :class:`HeadCard`, built by :func:`head_card`, so they cannot drift apart. A card
holds:

* the probe labels with their strength (:func:`headlens.scoring.primary.strength`) and CI, strongest first;
* the atlas' role, its rule's held-out agreement with CI, the share of held-out rows where the rule has
  targets (*coverage*), its mixture of rules, and the share of the head's effect its description keeps
  when substituted for the real pattern (read with ``getattr``: an atlas built before those existed has none);
* DLA and ablation where they were measured (None where not);
* ``windows``: which text the atlas numbers come from, so two views of one head say why their numbers differ.

Where the probes and the corpus disagree, :meth:`HeadCard.disagreement` says so in one sentence with both
numbers. Works on the table alone (pandas, no torch) and on any object with a description's fields: this
package comes before :mod:`headlens.atlas` and never imports it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from headlens.scoring.primary import from_weights, is_resting, strength

RESTING_ROLES = ("resting", "first_token", "sink")  # atlas roles that say the head parks its attention
WEIGHT_ROLES = ("copy_suppression",)  # labels read from the weights that also name an atlas role


@dataclass(frozen=True)
class ProbeVerdict:
    """One detector's verdict on a head: its ``score`` with CI, ``strength`` on the common scale, whether it
    carries the ``label``, and the ``probe`` text it was measured on (``"repeated segments"``)."""

    detector: str
    score: float
    ci: tuple[float, float]
    strength: float
    label: bool
    probe: str | None = None
    weights: bool = False  # scored from the weights (what its OV circuit would write), not from text


@dataclass(frozen=True)
class HeadCard:
    """What every view says about one head (module docstring). Atlas fields are None without an atlas."""

    layer: int
    head: int
    labels: tuple[ProbeVerdict, ...] = ()
    probes: dict[str, ProbeVerdict] = field(default_factory=dict)
    role: str | None = None
    rule: str | None = None
    agreement: float | None = None
    agreement_ci: tuple[float, float] | None = None
    candidates: dict[str, float] = field(default_factory=dict)
    coverage: float | None = None
    mixture: dict[str, float] = field(default_factory=dict)
    share_kept: float | None = None
    share_ci: tuple[float, float] | None = None
    share_how: str | None = None  # "exact" (the substitution ran it), "estimated" (first order, no interval) or
    # "no_effect" (its mean ablation moves no loss beyond its interval: not put back)
    share_estimate: float | None = None  # the first-order estimate of the share kept (a rough hint, never a share)
    first: float | None = None
    off_rest: float | None = None
    dla: float | None = None
    ablation: float | None = None
    ablation_ci: tuple[float, float] | None = None
    ablation_estimated: bool = False  # the ablation effect is the atlas's first-order estimate, not run
    subst_delta: float | None = None  # the loss change with its description put back (the substitution test)
    corpus: str = "prose"
    windows: str = ""

    @property
    def name(self) -> str:
        return f"L{self.layer}H{self.head}"

    def behaviour(self) -> ProbeVerdict | None:
        """The strongest label that says what the head does on text (neither a resting one nor one read from
        its weights, unless it names an atlas role), or None."""
        return next((v for v in self.labels if not is_resting(v.detector)
                     and (not v.weights or v.detector in WEIGHT_ROLES)), None)

    def share_reading(self) -> str | None:
        """Why a description keeps little of its head's effect, where the numbers say it: a head that rests on the
        first token (half of its attention or more) whose removal moves the loss beyond its interval and whose
        description, put back, keeps less than half of that. Such a head's write comes from the rest of its
        attention (the first token's value adds about the same to every row), so a description that matches
        where it rests can still miss what it reads; None elsewhere.

        >>> card = HeadCard(23, 6, role="decay_8", share_kept=-0.05, share_ci=(-0.26, 0.11), share_how="exact",
        ...                 first=0.70, ablation=0.0253, ablation_ci=(0.0108, 0.0427), subst_delta=0.0267)
        >>> print(card.share_reading())
        Why it keeps little: 70 % of its attention rests on the first token, and its description matches that, but what the head writes comes from the other 30 %, where the description does not follow it: put back, it raises the loss by +0.0267, about what removing it does (+0.0253).
        """
        if (self.share_how != "exact" or self.share_kept is None or self.share_kept >= 0.5 or self.first is None
                or self.first < 0.5 or self.ablation is None or self.ablation_ci is None or self.subst_delta is None
                or self.ablation_ci[0] <= 0 <= self.ablation_ci[1]):
            return None
        than = ("about what removing it does" if abs(self.subst_delta - self.ablation) <= 0.5 * abs(self.ablation)
                else "more than removing it does" if self.subst_delta - self.ablation > 0 else
                "less than removing it does")
        moves = "raises" if self.subst_delta >= 0 else "lowers"
        return (f"Why it keeps little: {100 * self.first:.0f} % of its attention rests on the first token, and its "
                f"description matches that, but what the head writes comes from the other "
                f"{100 * (1 - self.first):.0f} %, where the description does not follow it: put back, it {moves} "
                f"the loss by {self.subst_delta:+.4f}, {than} ({self.ablation:+.4f}).")

    def disagreement(self) -> str | None:
        """One sentence with both numbers where the probes and the corpus name different roles, else None.

        >>> card = HeadCard(17, 4, labels=(ProbeVerdict("induction", 0.834, (0.817, 0.85), 0.83, True,
        ...                 "repeated segments"),), role="resting", rule="induction", agreement=0.44, first=0.91,
        ...                 candidates={"induction": 0.44})
        >>> print(card.disagreement())
        The probes and the corpus disagree: induction on repeated segments, 0.83; on prose it rests, 91 % of its attention on the first token (the induction rule agrees at r = 0.44).
        """
        if self.role is None:
            return None
        said = self.behaviour()
        if any(v.detector == self.role for v in self.labels):
            return None  # one of its labels is the atlas' role
        if said is not None:
            on = "from its weights" if said.weights else f"on {said.probe or 'its probe'}"
            probe = f"{said.detector} {on}, {said.score:.2f}"
            if self.role in RESTING_ROLES and self.first is not None:
                corpus = f"on {self.corpus} it rests, {100 * self.first:.0f} % of its attention on the first token"
            elif self.role == "no clear role":
                corpus = f"on {self.corpus} no rule fits it (the best, '{self.rule}', agrees at r = {self.agreement:.2f})"
            else:
                corpus = f"on {self.corpus} it reads as {self.role.replace('_', ' ')} (r = {self.agreement:.2f})"
            own = self.candidates.get(said.detector)
            shown = self.role not in RESTING_ROLES and said.detector == self.rule  # already in the sentence
            tail = f" (the {said.detector} rule agrees at r = {own:.2f})" if own is not None and not shown else ""
            return f"The probes and the corpus disagree: {probe}; {corpus}{tail}."
        if said is None and self.role not in (*RESTING_ROLES, "no clear role"):
            probe = self.probes.get(self.role)
            if probe is not None and not probe.label:
                return (f"The probes and the corpus disagree: on {self.corpus} it reads as "
                        f"{self.role.replace('_', ' ')} (r = {self.agreement:.2f}); the {probe.detector} probe "
                        f"does not label it ({probe.score:.2f} on {probe.probe or 'its probe'}).")
        return None


def probe_verdicts(scores: Any, layer: int, head: int) -> dict[str, ProbeVerdict]:
    """Every detector's verdict on one head of a scores table (``headlens classify``'s tidy table)."""
    if scores is None or len(scores) == 0:
        return {}
    rows = scores[(scores["layer"] == layer) & (scores["head"] == head)]
    if rows.empty:
        return {}
    power, weights = strength(rows), from_weights(rows)
    probe_of = {d: name.replace("_", " ") for name, p in scores.attrs.get("probes", {}).items()
                if isinstance(p, dict) for d in p.get("detectors", ())}
    out = {}
    for (_, r), s, w in zip(rows.iterrows(), power, weights, strict=True):
        det = str(r["detector"])
        ci = (float(r["ci_low"]), float(r["ci_high"])) if "ci_low" in r else (float("nan"), float("nan"))
        out[det] = ProbeVerdict(det, float(r["score"]), ci, float(s), bool(r["label"] is True or r["label"] == 1),
                                probe_of.get(det), bool(w))
    return out


def head_card(layer: int, head: int, scores: Any = None, description: Any = None, *, dla: float | None = None,
              ablation: float | None = None, ablation_ci: tuple[float, float] | None = None, corpus: str = "prose",
              windows: str = "") -> HeadCard:
    """The card of one head from a scores table (or None), an atlas description (or None: any object with a
    :class:`headlens.atlas.describe.Description`'s fields) and what else was measured.

    >>> head_card(0, 1).disagreement() is None
    True
    """
    probes = probe_verdicts(scores, layer, head)
    labels = tuple(sorted((v for v in probes.values() if v.label),
                          key=lambda v: (is_resting(v.detector), v.weights,
                                         -(v.strength if v.strength == v.strength else 0))))
    d = description
    if d is None:
        return HeadCard(layer, head, labels, probes, dla=dla, ablation=ablation, ablation_ci=ablation_ci,
                        corpus=corpus, windows=windows)
    ev = getattr(d, "evidence", {}) or {}
    share_ci = getattr(d, "share_ci", None)
    if ablation is None and ablation_ci is None and "abl_lo" in ev:  # the substitution test's own interval
        ablation_ci = (float(ev["abl_lo"]), float(ev["abl_hi"]))
    return HeadCard(
        layer, head, labels, probes, role=d.role, rule=d.rule, agreement=float(d.agreement),
        agreement_ci=tuple(d.ci), candidates=dict(getattr(d, "candidates", {}) or {}),
        coverage=getattr(d, "coverage", None), mixture=dict(getattr(d, "mixture", {}) or {}),
        share_kept=getattr(d, "share_kept", None), share_ci=tuple(share_ci) if share_ci is not None else None,
        share_how=ev.get("share_how"),
        share_estimate=None if ev.get("est_share") != ev.get("est_share") else ev.get("est_share"),
        first=ev.get("first"), off_rest=ev.get("off_rest"), dla=dla,
        ablation=ablation if ablation is not None else getattr(d, "ablation_delta", None), ablation_ci=ablation_ci,
        ablation_estimated=ablation is None and ev.get("share_how") == "estimated",
        subst_delta=ev.get("subst_delta"), corpus=corpus, windows=windows)
