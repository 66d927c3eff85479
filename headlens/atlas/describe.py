"""A head's description from measured evidence: a mixture of rules fit on the pass, scored on held-out text.

Why it looks like this:

* **A description is a prediction of the whole attention row.** Each candidate rule
  (:mod:`headlens.atlas.rules`: the first token, the query itself, previous token, offsets, recent windows,
  delimiters, the start of the word, same-class tokens, duplicate and induction variants, an absolute
  position, a key the model predicts) spreads each query row's mass over its targets and, in a row where
  it has none, puts it on the first token (where a head with nothing to do rests). A description is a
  non-negative mixture of at most three of them (:mod:`headlens.atlas.mixture`), fit on windows of the pass
  and scored on the held-out ones: the **agreement** is the Pearson correlation of predicted and real
  attention over every causal (query, key) cell of those windows, first token and self included, with a
  bootstrap CI over windows. So a head that rests on the first token is described by the rule
  ``first_token``, not by an exception, and one that does induction where a repeat exists and rests
  elsewhere by ``induction`` alone (the agreement was once taken over off-rest cells only, which left such
  heads "resting").
* **The role** is the heaviest rule of a mixture that agrees at :data:`AGREEMENT` or more, when it holds
  :data:`MIN_WEIGHT` of the mixture, is not the first token and has targets in :data:`MIN_COVERAGE` of the
  held-out rows (a rule that never applies agrees through its first-token fallback alone), and is not an even
  spread over the keys so far beside a heavier first token (that is a rest with a background); then copy suppression's two claims (below);
  a mixture led by the first token that agrees is **resting** (a tested description: its rule agrees),
  unless a rule names the role **conditionally**: on the rows where it has targets (at least
  :data:`MIN_COVERAGE` of the rows and at most :data:`MAX_COVERAGE`: a rule with targets in nearly every row,
  ``uniform`` or ``recent_4``, is not conditional, and the whole-row mixture has judged it), the rule *paired with the first token* (fit on the fit windows,
  :func:`headlens.atlas.mixture.conditional_pairs`) agrees at :data:`AGREEMENT` or more on held-out text,
  with the rule holding :data:`MIN_WEIGHT` of the pair or more and the head's mass on its targets there
  above chance; the sentence gives how often that is (its coverage). The pair, not the rule alone: an
  induction head on prose (SmolLM2's L17H4) keeps a share of its attention on the first token even in the
  rows where a repeat exists, and the rule alone counted that rest against it (agreement under 0.5 on those
  rows, while a mixture over all rows gains little from induction, its rows being few). The rule's weight
  keeps a head that rests there too from being named by it. Below all of these, a head
  whose off-rest attention averages under :data:`REST` per row rests by its own statistic (the mass it puts
  off the first token and itself, with its CI); any other gets "no clear role".
* **Copy suppression from joint evidence** (McDougall et al. 2023: a head that attends to an earlier copy of
  a token the model is about to predict and pushes that token down). Such a head attends to predicted
  tokens only when one occurs earlier, so no rule predicts its whole pattern. Two measured claims name it,
  each of which alone would not: in rows where a predicted token (the model's own top 5 at the query)
  occurs earlier, the share of the head's off-rest attention that lands on one is above the share an even
  spread over the row's off-rest keys would give, by its whole bootstrap interval on held-out text; and the
  weight-based detector :data:`WEIGHT_CS` labels it (its OV circuit ranks a sampled token in the
  vocabulary's bottom 5 for itself often enough, :mod:`headlens.scoring.weights`). A head that copies
  instead (an induction head also attends to what is predicted: it causes the prediction) fails the second.
  Its page then states the two claims, never a rule's numbers with the role's name.
* No language model writes or judges the text: each sentence is a template filled with a number measured
  here, and no template names a role its own numbers argue against (``tests/atlas``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from headlens.atlas.mixture import (
    conditional_pairs,
    conditional_sums,
    corr,
    coverage,
    fit_mixtures,
    mixture_sums,
)
from headlens.atlas.rules import BANDS, LATE, ROLE, SINK, WEIGHTED, candidate_rules, late_rules
from headlens.atlas.sinkbands import band_error, band_names, fit_bands
from headlens.detectors.base import Detector

AGREEMENT = 0.5  # a description must correlate this well with the head's real attention to name its role
REST = 0.25  # mean off-rest attention per query row below which a head is said to rest
MIN_WEIGHT = 0.25  # the heaviest rule of a mixture names the role when it holds this share of it
MIN_COVERAGE = 0.05  # a rule names a role (whole-row or conditional) only with targets in this share of query rows
MAX_COVERAGE = 0.9  # ... and none in the rest: a rule with targets in nearly every row is the mixture's to judge
EVEN = ("uniform", "uniform_rest")  # even spreads: beside a heavier first token, the background of a rest
BACKGROUND = EVEN + tuple(f"recent_{n}" for n in BANDS) + WEIGHTED  # spreads by position alone: what they pick
# is not said, so copy suppression's two claims, which say it, name the role before them
CS_RULE = "predicted_token"  # the pattern of copy suppression
WEIGHT_CS = "ov_suppression"  # the weight-based detector whose label is copy suppression's second claim
COPY_SHARE = 0.5  # "writes the token it attends to" when its OV promotes it for this share of exemplar keys


@dataclass(frozen=True)
class Description:
    """A head's tested description: ``role`` (a rule's role, ``"resting"``, ``"copy_suppression"`` or ``"no
    clear role"``), its main ``rule`` and its held-out ``agreement`` with CI, the ``mixture`` it is simulated
    from (rule -> weight, summing to 1; one rule is ``{rule: 1.0}``), its ``coverage`` (the share of held-out
    query rows where the mixture's rules other than the first token have targets), every single rule's
    agreement (``candidates``), the measured ``evidence`` and the paragraph ``text``. The substitution test
    (:mod:`headlens.atlas.substitute`) fills ``share_kept`` (the share of the head's mean-ablation effect on
    the loss its description keeps) with ``share_ci``, ``ablation_delta`` (the loss change of its mean
    ablation) and ``subst_windows`` (the held-out windows it ran on); None and 0 where it did not run.
    ``sink_bands``: the first token's weight per band of query positions (:mod:`headlens.atlas.sinkbands`;
    empty where one weight holds in every row), the ``mixture`` then giving each rule's mean over the rows.
    ``key_pref``: a weight per key token on the cells off the first token (:mod:`headlens.atlas.keypref`; empty
    where none), the ``agreement`` then that of the pattern put back. ``query_sink``: an odds factor on the first
    token's share per query token (:mod:`headlens.atlas.keypref`; empty where none)."""

    layer: int
    head: int
    role: str
    rule: str
    agreement: float
    ci: tuple[float, float]
    text: str
    candidates: dict[str, float] = field(default_factory=dict)
    evidence: dict[str, float] = field(default_factory=dict)
    mixture: dict[str, float] = field(default_factory=dict)
    coverage: float = 1.0
    conditional: bool = False
    share_kept: float | None = None
    share_ci: tuple[float, float] | None = None
    ablation_delta: float | None = None
    subst_windows: int = 0
    sink_bands: tuple[float, ...] = ()
    key_pref: dict[int, float] = field(default_factory=dict)  # key token id -> weight (headlens.atlas.keypref)
    query_sink: dict[int, float] = field(default_factory=dict)  # query token id -> odds factor on the first token

    def __post_init__(self) -> None:  # read back from JSON, the intervals are lists and the token ids strings
        object.__setattr__(self, "ci", tuple(self.ci))
        object.__setattr__(self, "key_pref", {int(t): w for t, w in self.key_pref.items()})
        object.__setattr__(self, "query_sink", {int(t): w for t, w in self.query_sink.items()})
        object.__setattr__(self, "sink_bands", tuple(self.sink_bands))
        if self.share_ci is not None:
            object.__setattr__(self, "share_ci", tuple(self.share_ci))

    @property
    def described(self) -> bool:
        """True when the head carries a tested description (any role but "no clear role")."""
        return self.role != "no clear role"

    def mixture_text(self) -> str:
        """``"previous_token 0.70 + first_token 0.30"``; with :attr:`sink_bands`, the first token's weight per band
        of query positions after it (the weights given are their mean over the rows)."""
        text = " + ".join(f"{r} {w:.2f}" for r, w in sorted(self.mixture.items(), key=lambda kv: -kv[1]))
        if not self.sink_bands:
            return text
        bands = ", ".join(f"{b} {s:.2f}" for b, s in zip(band_names(len(self.sink_bands)), self.sink_bands,
                                                          strict=True))
        return f"{text} on average, the first token's weight set by the query's position ({bands})"


def _with_ci(per_window: torch.Tensor, stat: Any, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The pooled statistic over windows and its 95 % bootstrap interval (windows resampled)."""
    from headlens.scoring.stats import bootstrap_weights

    w = bootstrap_weights(per_window.shape[0], 400, seed)  # (n_boot, W)
    boot = stat(torch.einsum("bw,w...->b...", w, per_window))  # (n_boot, L, H, ...)
    return stat(per_window.sum(0)), boot.quantile(0.025, 0), boot.quantile(0.975, 0)


def describe(model: Any, exemplars: Any, heldout: list[torch.Tensor], batch_size: int = 8,
             fit: list[torch.Tensor] | None = None, strings: list[str] | None = None,
             progress: Callable[[int, int], None] | None = None) -> list[Description]:
    """Every head's :class:`Description`, layer by layer: mixtures fit on the ``fit`` windows (the pass's; the
    held-out ones when None), scored on the ``heldout`` windows, its writes read at its exemplars' keys
    (:func:`headlens.atlas.reads.ov_on_heads`). ``strings``: each token's text (token classes; read from the
    model when None); ``progress(done, total)`` in windows read."""
    from headlens.atlas.heldout import heldout_stats
    from headlens.atlas.reads import ov_on_heads

    rules = candidate_rules()
    early = {name: rule for name, rule in rules.items() if name not in LATE}
    classes = _classes(model, strings)
    fit = fit or heldout
    total = len(fit) + len(heldout)
    step = (lambda off: (lambda d, t: progress(off + d, total))) if progress else (lambda off: None)
    fitted = heldout_stats(model, fit, early, late_rules(rules), batch_size, classes, step(0))
    stats = heldout_stats(model, heldout, early, late_rules(rules), batch_size, classes, step(len(fit)))
    names = stats["names"]
    R = len(names)
    weights = fit_mixtures(fitted, fitted["has"].sum(0) > 0, band_error(fitted, names.index(SINK)))  # (L, H, R)
    banded, by_band = fit_bands(fitted, weights, names.index(SINK))  # (L, H, G, R), (L, H)
    rows = fitted["brows"].sum(0)  # (G,)
    n_bands = int(torch.nonzero(rows > 0).max()) + 1 if bool((rows > 0).any()) else 1  # past them, no rows
    mean_w = torch.where(by_band[..., None], torch.einsum("g,lhgr->lhr", rows / rows.sum().clamp(min=1), banded),
                         weights)  # (L, H, R): with bands, each rule's mean weight over the rows
    mix = _with_ci(mixture_sums(stats, banded), corr)  # each (L, H)
    single = _single(stats)  # (L, H, R)
    pair = conditional_pairs(fitted)  # (L, H, R): each rule's weight beside the first token on its own rows
    cond_fit = corr(conditional_sums(fitted, pair).sum(0))  # (L, H, R)
    cover_fit = fitted["has"].sum(0) / fitted["rest"][:, 0, 0, 2].sum().clamp(min=1)  # (R,)
    unfit = torch.tensor([n in (SINK, "self") for n in names])  # (R,)
    unfit |= (cover_fit < MIN_COVERAGE) | (cover_fit > MAX_COVERAGE)
    cond_fit[unfit.expand_as(cond_fit) | (pair < MIN_WEIGHT)] = -1.0
    cond_pick = cond_fit.argmax(-1)  # (L, H): each head's conditional rule, chosen on the fit windows
    cond_weight = torch.where(cond_fit.amax(-1) > -1, pair.gather(-1, cond_pick[..., None])[..., 0], 0.0)  # (L, H)
    cond = _with_ci(conditional_sums(stats, pair), corr)  # each (L, H, R)
    cover = stats["has"].sum(0) / stats["rest"][:, 0, 0, 2].sum().clamp(min=1)  # (R,)
    mix_cover = coverage(stats, weights, names.index(SINK))
    share = _with_ci(torch.cat([stats["on"], stats["has"][:, None, None].expand_as(stats["on"])], -1),
                     lambda s: s[..., :R] / s[..., R:].clamp(min=1))
    chance = stats["chance"].sum(0) / stats["has"].sum(0).clamp(min=1)  # (R,)
    off = _with_ci(stats["rest"], lambda s: s[..., 0] / s[..., 2].clamp(min=1))
    first = _with_ci(stats["rest"], lambda s: s[..., 1] / s[..., 2].clamp(min=1))
    cs = _copy_suppression(model, stats["cs"], tuple(off[0].shape))
    H = exemplars.n_heads
    ovs = ov_on_heads(model, {divmod(i, H): kept for i, kept in enumerate(exemplars.top["attention"])})
    out = []
    for layer in range(exemplars.n_layers):
        for h in range(exemplars.n_heads):
            at = (layer, h)
            w = {names[i]: float(mean_w[at][i]) for i in range(R) if float(mean_w[at][i]) > 1e-9}
            shares = tuple(float(v) for v in banded[at][:n_bands, names.index(SINK)]) if bool(by_band[at]) else ()
            content = {r: v for r, v in w.items() if r != SINK}
            main = max(content, key=content.get) if content else SINK
            i = names.index(main)
            ci_ = int(cond_pick[at])
            ov = ovs[at]
            ev = {"off_rest": float(off[0][at]), "first": float(first[0][at]), "mass": float(share[0][at][i]),
                  "mass_lo": float(share[1][at][i]), "mass_hi": float(share[2][at][i]), "chance": float(chance[i]),
                  "copies": ov["copies"], "suppresses": ov["suppresses"], "n_keys": ov["n"],
                  "off_lo": float(off[1][at]), "off_hi": float(off[2][at]), "first_lo": float(first[1][at]),
                  "first_hi": float(first[2][at]), "main_weight": w.get(main, 0.0), "sink_weight": w.get(SINK, 0.0), "rule_coverage": float(cover[i]),
                  "cond_rule": ci_, "cond_weight": float(cond_weight[at]), "cond_r": float(cond[0][at][ci_]), "cond_lo": float(cond[1][at][ci_]),
                  "cond_hi": float(cond[2][at][ci_]), "cond_coverage": float(cover[ci_]),
                  "cond_mass": float(share[0][at][ci_]), "cond_chance": float(chance[ci_]),
                  **{key: float(v[at]) for key, v in cs.items()}}
            score, ci = float(mix[0][at]), (float(mix[1][at]), float(mix[2][at]))
            role = role_of(main, score, ev)
            d = Description(layer, h, role, main, score, ci, "", {n: float(single[at][j]) for j, n in enumerate(names)},
                            ev, w, float(mix_cover[at]), sink_bands=shares)
            if role not in ("copy_suppression", "resting", "no clear role") and not _by_mixture(main, score, ev):
                cr = names[ci_]  # named conditionally: the pair on the rows with targets, the first token elsewhere
                mixture = {k: v for k, v in ((cr, ev["cond_weight"]), (SINK, 1 - ev["cond_weight"])) if v > 0}
                d = Description(layer, h, role, cr, ev["cond_r"], (ev["cond_lo"], ev["cond_hi"]), "", d.candidates,
                                ev, mixture, ev["cond_coverage"], True)
            out.append(_with_text(d, rules))
    return out


def _single(stats: dict[str, torch.Tensor]) -> torch.Tensor:
    """``(L, H, R)``: each single rule's agreement (with its first-token fallback) on the windows of ``stats``."""
    s = stats["own"].sum(0)  # (L, H, 3)
    grid = stats["sxy"].shape[1:]
    n, sx, sxx = (v[..., None].expand(grid) for v in s.unbind(-1))
    sy = stats["sy"].sum(0).expand(grid)
    syy = stats["gram"].sum(0).diagonal().expand(grid)
    return corr(torch.stack([n, sx, sy, sxx, syy, stats["sxy"].sum(0)], -1))


def _classes(model: Any, strings: list[str] | None) -> dict[str, torch.Tensor]:
    """The vocabulary's token classes (:func:`headlens.atlas.rules.token_classes`) from its strings."""
    from headlens.atlas.rules import token_classes
    from headlens.models.token_text import readable_tokens

    ids = torch.arange(int(model.cfg.d_vocab))
    strings = strings if strings is not None else readable_tokens(model, ids)
    try:
        raw = [str(s) for s in model.to_str_tokens(ids)]
    except Exception:
        raw = strings
    return token_classes(strings, raw if len(raw) == len(strings) else strings)


def _copy_suppression(model: Any, sums: torch.Tensor, shape: tuple[int, int]) -> dict[str, torch.Tensor]:
    """Copy suppression's two claims per head, each ``(L, H)``: ``pred_share`` (with ``pred_lo``, ``pred_hi``),
    the share of its off-rest attention in rows with a predicted token that lands on one, and ``pred_null``,
    that share were each row's off-rest attention spread evenly over its off-rest keys (from ``sums``, the
    held-out ``cs`` sums); ``ov_score`` (``ov_lo``, ``ov_hi``), the share of sampled tokens its
    OV circuit ranks in the vocabulary's bottom 5 for themselves, and ``ov_label``, the :data:`WEIGHT_CS`
    detector's label (:mod:`headlens.scoring.weights`; NaN where the readout does not apply)."""
    from headlens.detectors import get_detector
    from headlens.errors import HeadlensError
    from headlens.scoring.weights import summarize_weights

    share, lo, hi = _with_ci(sums, lambda s: s[..., 0] / s[..., 3].clamp(min=1e-300))
    out = {"pred_share": share, "pred_lo": lo, "pred_hi": hi,
           "pred_null": sums[..., 4].sum(0) / sums[..., 3].sum(0).clamp(min=1e-300)}
    detector = get_detector(WEIGHT_CS)
    try:
        w = summarize_weights(detector.weights_fn(model), detector.threshold)
    except HeadlensError:  # an encoder, a packed model: no OV readout
        return {**out, **{k: torch.full(shape, float("nan")) for k in ("ov_score", "ov_lo", "ov_hi", "ov_label")}}
    return {**out, "ov_score": w.summary.score.reshape(shape), "ov_lo": w.summary.ci_low.reshape(shape),
            "ov_hi": w.summary.ci_high.reshape(shape), "ov_label": w.labels.double().reshape(shape)}


def role_of(main: str, score: float, ev: dict[str, float]) -> str:
    """The role a head's evidence names (module docstring): its mixture's heaviest rule when the mixture agrees
    and that rule (not the first token) holds :data:`MIN_WEIGHT` of it; else copy suppression from its two
    claims; else a rule that agrees on the rows where it has targets, often enough; else resting (a mixture
    led by the first token that agrees, or by its own statistic), or none.

    >>> ev = {"ov_label": 1.0, "pred_lo": 0.2, "pred_null": 0.05, "off_rest": 0.4, "main_weight": 0.8,
    ...       "sink_weight": 0.2, "rule_coverage": 0.9, "cond_r": 0.2, "cond_coverage": 0.5, "cond_rule": 0, "cond_weight": 0.4, "cond_mass": 0.3,
    ...       "cond_chance": 0.05}
    >>> role_of("previous_token", 0.3, ev), role_of("induction_longest", 0.7, ev), role_of("decay_8", 0.9, ev)
    ('copy_suppression', 'induction', 'copy_suppression')
    >>> role_of("first_token", 0.9, {**ev, "ov_label": 0.0, "cond_r": 0.6, "cond_rule": 5})  # where it can
    'induction'
    >>> role_of("first_token", 0.9, {**ev, "ov_label": 0.0})  # led by the first token: a tested rest
    'resting'
    >>> role_of("first_token", 0.9, {**ev, "ov_label": 0.0, "cond_r": 0.9, "cond_rule": 5, "cond_weight": 0.1})
    'resting'
    """
    cs = ev["ov_label"] == 1.0 and ev["pred_lo"] > ev["pred_null"]  # NaN (no OV readout) is not a label
    if cs and main in BACKGROUND:
        return "copy_suppression"
    if _by_mixture(main, score, ev):
        return "copy_suppression" if main == CS_RULE and ev["ov_label"] == 1.0 else ROLE.get(main, main)
    if cs:
        return "copy_suppression"
    if (ev["cond_r"] >= AGREEMENT and MIN_COVERAGE <= ev["cond_coverage"] <= MAX_COVERAGE
            and ev["cond_weight"] >= MIN_WEIGHT and ev["cond_mass"] > ev["cond_chance"]):  # where it can, above chance
        return ROLE.get(_NAMES[int(ev["cond_rule"])], _NAMES[int(ev["cond_rule"])])
    return "resting" if score >= AGREEMENT or ev["off_rest"] < REST else "no clear role"


def _by_mixture(main: str, score: float, ev: dict[str, float]) -> bool:
    """The whole-row mixture names the role: it agrees, its heaviest rule is not the first token, holds
    :data:`MIN_WEIGHT` of it and has targets in :data:`MIN_COVERAGE` of the held-out rows or more (a rule that
    never applies agrees through its first-token fallback alone: that is a rest, not its role), and is not an even
    spread (:data:`EVEN`) beside a heavier first token: a head that rests and spreads the rest evenly."""
    return (score >= AGREEMENT and main != SINK and ev["main_weight"] >= MIN_WEIGHT
            and ev["rule_coverage"] >= MIN_COVERAGE and not (main in EVEN and ev["sink_weight"] >= ev["main_weight"]))


_NAMES = [n for n in candidate_rules() if n not in LATE] + list(LATE)  # heldout_stats' rule order


def _with_text(d: Description, rules: dict[str, Detector]) -> Description:
    return replace(d, text=_text(d, rules[d.rule]))


def _text(d: Description, rule: Detector) -> str:
    """The paragraph: one measured claim per sentence, each with its number (and CI)."""
    ev, score, ci = d.evidence, d.agreement, d.ci
    r = f"r = {score:.2f} [{ci[0]:.2f}, {ci[1]:.2f}]"
    sim = (f"Simulated as {d.mixture_text()} (fit on the pass's windows), its predicted attention agrees with "
           f"the real one at {r} on held-out text (every cell of each row, first token and self included)")
    rest = (f"{ev['first']:.2f} of its attention per query row [{ev['first_lo']:.2f}, {ev['first_hi']:.2f}] goes to "
            f"the first token on held-out text, and {ev['off_rest']:.2f} [{ev['off_lo']:.2f}, {ev['off_hi']:.2f}] to "
            f"keys other than the first token and itself")
    writes = _writes_text(ev)
    if d.role == "copy_suppression":
        return (f"Attends to earlier copies of tokens the model predicts next: in rows where one occurs, "
                f"{ev['pred_share']:.2f} [{ev['pred_lo']:.2f}, {ev['pred_hi']:.2f}] of the attention it puts off "
                f"the first token and itself lands on them, against {ev['pred_null']:.2f} were it spread evenly. "
                f"Its OV circuit pushes a token it attends to down: {ev['ov_score']:.2f} [{ev['ov_lo']:.2f}, "
                f"{ev['ov_hi']:.2f}] of sampled tokens rank in the bottom 5 of the vocabulary for themselves "
                f"(the {WEIGHT_CS} detector's label).{writes} Both are copy suppression's (McDougall et al. "
                f"2023), though no rule predicts when it fires. {sim}. Role: copy suppression.")
    if d.role == "resting" and score >= AGREEMENT and not d.conditional:
        return f"Rests on the first token: {rest}. {sim}.{writes} Role: resting."
    if d.role == "resting":
        return (f"Rests on the first token: {rest} (under the {REST:.2f} that resting allows). Simulated as "
                f"{d.mixture_text()}, its best description, it agrees at {r}, below the {AGREEMENT:.2f} a rule needs.")
    if d.role == "no clear role":
        return (f"No clear role: it puts {ev['off_rest']:.2f} of its attention off the first token and itself, "
                f"but its best description explains it poorly. {sim}, below the {AGREEMENT:.2f} a role needs."
                f"{writes}")
    desc = f"{rule.description[0].upper()}{rule.description[1:]}"
    if d.conditional:
        return (f"{desc} where it can: on the {d.coverage:.0%} of held-out query rows where the rule '{rule.name}' "
                f"has a target, {ev['cond_mass']:.2f} of its attention goes to one "
                f"({ev['cond_mass'] / max(ev['cond_chance'], 1e-9):.0f}x chance), and its predicted attention agrees "
                f"with the real one on those rows at {r} (simulated as {d.mixture_text()}, the first token where the "
                f"rule has no target); over all its rows, {rest}.{writes} Role: "
                f"{d.role.replace('_', ' ')}.")
    lift = ev["mass"] / ev["chance"] if ev["chance"] > 0 else float("inf")
    return (f"{desc} ({ev['mass']:.2f} of its attention [{ev['mass_lo']:.2f}, {ev['mass_hi']:.2f}] where the rule "
            f"has a target, {d.coverage:.0%} of query rows, {lift:.0f}x chance). {sim}.{writes} "
            f"Role: {d.role.replace('_', ' ')}.")


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


def gate(d: Description) -> Description:
    """``d`` with its role withheld where the substitution test contradicts it (after
    :func:`headlens.atlas.substitute.substitute` has filled its evidence):

    * a copy suppressor whose mean ablation raises the loss, by its whole interval, while on the positions where
      the model's top prediction is right and occurs earlier in the window it does not lower it (its estimate
      there is 0 or more): there, pushing that earlier token down can only hurt, so a copy suppressor's removal
      lowers the loss; a head that helps the model elsewhere and not there is not one. (On a few windows the
      interval on those positions is wide, so its estimate's sign is read; a larger ``subst_windows`` narrows
      it.)
    * a head named by a rule whose mean ablation moves the loss by more than its interval while putting its
      description back keeps less than none of that effect (the share's whole interval below 0).

    Its page then says which, with the numbers, and names no role.

    >>> ev = {"cs_delta": 0.01, "cs_lo": -0.01, "cs_hi": 0.04, "cs_rows": 108.0, "abl_lo": 0.001, "abl_hi": 0.01}
    >>> d = Description(1, 2, "copy_suppression", "first_token", 0.9, (0.8, 0.95), "... Role: copy suppression.",
    ...                 evidence=ev, share_ci=(0.1, 0.9), ablation_delta=0.005)
    >>> g = gate(d)
    >>> g.role, g.text.endswith("Role: copy suppression.")
    ('no clear role', False)
    >>> gate(replace(d, evidence={**ev, "cs_delta": -0.002})).role  # its removal lowers the loss there
    'copy_suppression'
    """
    ev, head = d.evidence, d.text.rsplit(" Role: ", 1)[0]
    moved = ev.get("abl_lo", 0.0) > 0 or ev.get("abl_hi", 0.0) < 0
    if d.role == "copy_suppression" and ev.get("abl_lo", 0.0) > 0 and ev.get("cs_rows", 0) > 0 and ev["cs_delta"] >= 0:
        why = (f"its mean ablation raises the loss by {d.ablation_delta:+.3f} [{ev['abl_lo']:+.3f}, "
               f"{ev['abl_hi']:+.3f}], and changes it by {ev['cs_delta']:+.3f} [{ev['cs_lo']:+.3f}, {ev['cs_hi']:+.3f}] on the "
               f"{int(ev['cs_rows'])} positions where the model's top prediction is right and occurs earlier, where "
               f"removing a copy suppressor would lower it")
    elif (d.role not in ("copy_suppression", "resting", "no clear role") and moved and d.share_ci is not None
          and d.share_ci[1] < 0):
        why = (f"its mean ablation changes the loss by {d.ablation_delta:+.3f} [{ev['abl_lo']:+.3f}, "
               f"{ev['abl_hi']:+.3f}], and putting its description back in its place keeps {d.share_kept:.2f} "
               f"[{d.share_ci[0]:.2f}, {d.share_ci[1]:.2f}] of that: less than removing the head")
    else:
        return d
    named = d.role.replace("_", " ")
    return replace(d, role="no clear role", evidence={**ev, "withheld": named},
                   text=f"{head} The substitution test argues against {named}: {why}. No role is named.")
