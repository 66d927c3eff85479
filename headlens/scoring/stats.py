"""Statistics: pooled scores, uniform baselines, bootstrap intervals and the labelling rules.

A score is a ratio of per-prompt sums, ``Σ_b num_b / Σ_b den_b`` (attention mass on targets
over rows with a target, pooled over prompts, docs/scores.md). Its 95 % interval resamples
*prompts* with replacement (rows within a prompt are not independent); every resample is one
row of a multinomial count matrix ``W`` (n_boot x P), so all heads are bootstrapped at once by
``W @ num`` and ``W @ den``. Seeded, so a table is reproducible.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

DEFAULT_THRESHOLD = 0.4  # κ for pattern detectors: the strength's CI low end, (ci_low - chance) / (1 - chance)
WEIGHTS_THRESHOLD = 0.9  # τ for a weight detector that gives plain scores and no τ of its own (no interval, no lift)
Z95 = 1.959963984540054  # the normal quantile of a two-sided 95 % interval
MIN_LIFT = 3.0
N_BOOT = 1000
PREFERENCE_MARGIN = 0.5  # "well above chance": the accuracy CI's low end at least halfway from chance to 1


@dataclass(frozen=True)
class Summary:
    """Per-head summary of one detector (all tensors ``(N,)`` over the flattened heads).

    Attributes:
        score, ci_low, ci_high: pooled score and its 95 % bootstrap interval.
        baseline: the uniform-attention score (one value, broadcast).
        n_positions: rows with a target, over all prompts.
        n_prompts: prompts with at least one such row.
    """

    score: torch.Tensor
    ci_low: torch.Tensor
    ci_high: torch.Tensor
    baseline: float
    n_positions: int
    n_prompts: int

    @property
    def lift(self) -> torch.Tensor:
        return self.score / self.baseline if self.baseline > 0 else torch.full_like(self.score, float("nan"))


def bootstrap_weights(n_prompts: int, n_boot: int = N_BOOT, seed: int = 0) -> torch.Tensor:
    """``(n_boot, n_prompts)`` float64 multinomial counts: how often each prompt is drawn."""
    gen = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, n_prompts, (n_boot, n_prompts), generator=gen)
    w = torch.zeros(n_boot, n_prompts, dtype=torch.float64)
    return w.scatter_add_(1, idx, torch.ones_like(idx, dtype=torch.float64))


def summarize(num: torch.Tensor, den: torch.Tensor, base: torch.Tensor, seed: int = 0,
              n_boot: int = N_BOOT) -> Summary:
    """Pool per-prompt sums into scores with a bootstrap CI.

    Args:
        num: ``(P, N)`` float64 per-prompt target mass for N heads.
        den: ``(P,)`` float64 per-prompt row counts (1 per prompt for a mean of per-prompt scores).
        base: ``(P,)`` float64 per-prompt uniform-attention mass, pooled like ``num``.
        seed: bootstrap seed.
        n_boot: bootstrap resamples.

    >>> num = torch.tensor([[1.0], [3.0]], dtype=torch.float64)
    >>> s = summarize(num, torch.tensor([2.0, 2.0], dtype=torch.float64), torch.ones(2, dtype=torch.float64))
    >>> s.score.item(), s.baseline, s.n_positions
    (1.0, 0.5, 4)
    """
    keep = den > 0  # prompts without a single target row carry no information
    num, den, base = num[keep], den[keep], base[keep]
    total = den.sum()
    if total == 0:
        nan = torch.full((num.shape[1],), float("nan"), dtype=torch.float64)
        return Summary(nan, nan, nan, float("nan"), 0, 0)
    score = num.sum(0) / total
    w = bootstrap_weights(len(den), n_boot, seed)  # (n_boot, P)
    boot = (w @ num) / (w @ den)[:, None]  # (n_boot, N)
    lo, hi = torch.quantile(boot, torch.tensor([0.025, 0.975], dtype=torch.float64), dim=0)
    return Summary(score, lo, hi, float(base.sum() / total), round(float(total)), int(keep.sum()))


def default_threshold(detector: Any) -> float:
    """A detector's default cut-off: its own, else κ = 0.4 on the strength scale for pattern detectors
    (:func:`strength_label`) and τ = 0.9 on the score for weight scores without a τ of their own."""
    own = getattr(detector, "threshold", None)
    if own is not None:
        return float(own)
    return WEIGHTS_THRESHOLD if getattr(detector, "kind", None) == "weights" else DEFAULT_THRESHOLD


def label(ci_low: torch.Tensor, lift: torch.Tensor, threshold: float = DEFAULT_THRESHOLD,
          min_lift: float = MIN_LIFT) -> torch.Tensor:
    """The rule on the score itself, ``ci_low >= τ`` and ``lift >= 3``: the weight detectors' (with their null,
    :mod:`headlens.scoring.weights`), whose chance is so small that the score is their strength.

    >>> label(torch.tensor([0.5, 0.5, 0.3]), torch.tensor([4.0, 2.0, 9.0])).tolist()
    [True, False, False]
    """
    return (ci_low >= threshold) & (lift >= min_lift)


def strength_of(x: torch.Tensor, chance: float) -> torch.Tensor:
    """``x``'s place between ``chance`` and a perfect head, ``(x - chance) / (1 - chance)`` (Cohen's kappa form:
    0 at chance, 1 perfect); NaN where ``chance`` is not in ``[0, 1)`` (every key a target: nothing to beat).
    The torch twin of :func:`headlens.scoring.primary.strength`, which reads a table.

    >>> [round(v, 3) for v in strength_of(torch.tensor([0.4, 0.7, 1.0]), 0.25).tolist()]
    [0.2, 0.6, 1.0]
    """
    x = torch.as_tensor(x, dtype=torch.float64)
    if not 0.0 <= chance < 1.0:
        return torch.full_like(x, float("nan"))
    return (x - chance) / (1.0 - chance)


def strength_label(s: Summary, kappa: float = DEFAULT_THRESHOLD) -> torch.Tensor:
    """The label rule of the pattern detectors (docs/scores.md): the low end of the 95 % CI of the head's
    strength clears κ, ``(ci_low - chance) / (1 - chance) >= κ``, with ``chance`` the type's own uniform
    baseline on the same probe rows. No absolute level on the attention mass: a type whose targets take
    much attention by chance (short windows, a bidirectional model, big target sets) needs more mass, one with
    a tiny chance about κ. No lift floor either: where chance is below κ / (2 + κ) (1/6 at κ = 0.4) the rule
    already asks for more than 3x chance, and above it a floor of 3x could not be met past chance 1/3.

    >>> lo = torch.tensor([0.45, 0.7])  # the same CI low ends against a chance of 0.05, then of 0.4
    >>> [strength_label(Summary(lo, lo, lo, chance, 100, 20)).tolist() for chance in (0.05, 0.4)]
    [[True, True], [False, True]]
    """
    return strength_of(s.ci_low, s.baseline) >= kappa


def above_null(s: Summary) -> torch.Tensor:
    """The attention half of the gated types' label and of the preference rule: the CI lies above the type's
    uniform baseline (``ci_low > chance``: the strength's CI low end above 0), with no lift floor: at a chance of
    0.18 (the names at END, ``negative_name_mover``) a lift of 3 would be a mass of 0.53, an absolute bar again.

    >>> above_null(Summary(torch.zeros(2), torch.tensor([0.2, 0.1]), torch.ones(2), 0.18, 64, 64)).tolist()
    [True, False]
    """
    return s.ci_low > s.baseline


def wilson(hits: torch.Tensor, n: int, z: float = Z95) -> tuple[torch.Tensor, torch.Tensor]:
    """Wilson's score interval for ``hits`` successes in ``n`` independent trials (95 % by default).

    The interval of a weight score over sampled tokens: unlike a bootstrap it is not ``[0, 0]`` at zero
    hits, so a null that never hits still has an upper end to clear.

    >>> lo, hi = wilson(torch.tensor([0.0, 128.0]), 256)
    >>> [round(v, 4) for v in lo.tolist()], [round(v, 4) for v in hi.tolist()]
    ([0.0, 0.4392], [0.0148, 0.5608])
    """
    hits = torch.as_tensor(hits, dtype=torch.float64)
    if n <= 0:
        nan = torch.full_like(hits, float("nan"))
        return nan, nan
    p, z2 = hits / n, z * z
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z * torch.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    return (centre - half).clamp_min(0.0), (centre + half).clamp_max(1.0)


def preference_label(pref: Summary, mass: Summary, margin: float = PREFERENCE_MARGIN) -> torch.Tensor:
    """The label rule of head types with distractors (coreference): Clark et al. 2019's preference accuracy
    is the primary statistic. A head carries the label when the accuracy's 95 % CI lies well above chance
    (``pref.ci_low >= chance + margin * (1 - chance)``: 0.75 for one distractor) and its attention on the
    target is above its uniform baseline (``mass.ci_low > mass.baseline``: it attends there, not merely
    less elsewhere). The mass threshold τ does not apply.

    >>> pref = Summary(torch.tensor([0.95, 0.74, 0.95]), torch.tensor([0.92, 0.68, 0.92]),
    ...                torch.tensor([0.98, 0.80, 0.98]), 0.5, 100, 100)
    >>> mass = Summary(torch.tensor([0.2, 0.5, 0.05]), torch.tensor([0.15, 0.45, 0.04]),
    ...                torch.tensor([0.25, 0.55, 0.06]), 0.1, 100, 100)
    >>> preference_label(pref, mass).tolist()
    [True, False, False]
    """
    chance = pref.baseline
    return (pref.ci_low >= chance + margin * (1 - chance)) & above_null(mass)
