"""A head's description as a non-negative mixture of at most three rules, fit and scored from streamed sums.

Why it looks like this:

* **Fit from sums, to the attention itself.** Every rule predicts a whole attention row
  (:mod:`headlens.atlas.heldout`), and a mixture ``sum_r w_r y_r`` is linear in them, so its least-squares
  fit needs only the rules' uncentred Gram ``G = sum y_r y_s`` (one per corpus, not per head) and ``c = sum x
  y_r`` of each rule with the head. The fit has no intercept and its weights are non-negative and sum to 1:
  the mixture is then an attention pattern that matches the head's mass cell by cell, the first token's
  included, and that is what substitution puts back. (A fit with an intercept maximises the correlation,
  which does not see how much mass goes where: its weights, normalised, can put mass where the head puts
  none, benchmarks/README.md.)
* **Greedy, at most three rules.** The best single rule first, then the rule that cuts the squared error
  most, while it cuts what is left by :data:`MIN_DROP` or more: a description stays short enough to read.
  The squared error, not the correlation, picks them: over every cell of a row the first token's cell
  dominates the correlation, so "first token alone" agreed at r = 0.9 with heads that keep half their
  attention elsewhere, and a second rule for that half raised r by less than any threshold that stops noise. Each step's non-negative least squares enumerates the active sets of its (at most three) rules.
* **Fit on one set of windows, scored on another**: :func:`mixture_sums` gives the per-window sums of the
  chosen mixtures on the held-out windows, for the same Pearson r and bootstrap as a single rule.
* **A rule on its own rows, paired with the first token** (:func:`conditional_pairs`): a head that does
  induction where a repeat exists often keeps part of those rows on the first token too, so a rule scored
  alone on its rows would count that rest against it. The pair is fit on the rows where the rule has targets
  (the same uncentred fit, two rules), and it is the pair that is scored there and put back: its weights,
  applied to whole rows, are the rule's on those rows and the first token's alone elsewhere.
* The agreement is still the Pearson correlation of the fit mixture with the real attention (the greedy
  steps compare it, and :func:`mixture_sums` scores it on held-out windows).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import torch

MAX_RULES = 3  # at most this many rules in one description
MIN_DROP = 0.1  # a rule joins a mixture only when it cuts the squared error left by this share


def corr(s: torch.Tensor) -> torch.Tensor:
    """Pearson correlation from sums ``(..., 6)`` = (n, sx, sy, sxx, syy, sxy)."""
    n, sx, sy, sxx, syy, sxy = s.unbind(-1)
    cov = sxy - sx * sy / n.clamp(min=1)
    var = (sxx - sx * sx / n.clamp(min=1)) * (syy - sy * sy / n.clamp(min=1))
    return torch.where(var > 1e-300, cov / var.clamp(min=1e-300).sqrt(), torch.zeros_like(cov))


def fit_mixtures(stats: dict[str, torch.Tensor], allowed: torch.Tensor | None = None,
                 refine: Callable[[torch.Tensor], torch.Tensor] | None = None) -> torch.Tensor:
    """``(L, H, R)`` non-negative weights summing to 1 per head (at most :data:`MAX_RULES` non-zero), fit on
    the windows of ``stats`` (:func:`headlens.atlas.heldout.heldout_stats`): least squares of the attention
    itself (no intercept, the weights summing to 1), rules joining greedily while each cuts the squared error
    left by :data:`MIN_DROP` or more. ``allowed`` ``(R,)`` bool: the rules a mixture may use (rules without a
    target on the fit windows are left out). ``refine``: weights ``(LH, R)`` -> the squared error ``(LH,)`` left
    when the first token's weight may change along the window (:func:`headlens.atlas.sinkbands.band_error`): a
    candidate is then judged by the smaller of the two errors, so a rule does not join only to stand in for a
    rest that changes with the position."""
    sxx = stats["own"].sum(0)[..., 2]  # (L, H): sum x^2
    L, H = sxx.shape
    sxx = sxx.reshape(L * H)
    G = stats["gram"].sum(0)  # (R, R): uncentred sums of the rules' predictions, one per corpus
    c = stats["sxy"].sum(0).reshape(L * H, -1)  # (LH, R): sum x y_r with each head
    R = G.shape[0]
    ok = torch.ones(R, dtype=torch.bool) if allowed is None else allowed
    ok = ok & (G.diagonal() > 1e-12)
    chosen = torch.empty(L * H, 0, dtype=torch.long)
    best_e = torch.full((L * H,), float("inf"), dtype=torch.float64)
    best_w = torch.zeros(L * H, 0, dtype=torch.float64)
    for step in range(MAX_RULES):
        cand_e = torch.full((L * H, R), float("inf"), dtype=torch.float64)
        cand_w = torch.zeros(L * H, R, step + 1, dtype=torch.float64)
        for j in range(R):
            if not ok[j]:
                continue
            idx = torch.cat([chosen, torch.full((L * H, 1), j)], 1)  # (LH, m)
            Cm, cm = G[idx[:, :, None], idx[:, None, :]], c.gather(1, idx)  # (LH, m, m), (LH, m)
            w = _simplex_ls(Cm, cm)  # (LH, m)
            e = sxx - 2 * (w * cm).sum(1) + torch.einsum("nm,nmk,nk->n", w, Cm, w)  # squared error left
            if refine is not None:
                e = torch.minimum(e, refine(torch.zeros(L * H, R, dtype=w.dtype).scatter_add(1, idx, w)))
            e[(chosen == j).any(1)] = float("inf")
            cand_e[:, j], cand_w[:, j] = e, w
        e, j = cand_e.min(1)  # (LH,)
        grow = (e < (1 - MIN_DROP) * best_e) & (best_e > 1e-6 * sxx) if step else torch.isfinite(e)
        if step and not bool(grow.any()):
            break
        new_w = cand_w[torch.arange(L * H), j]  # (LH, m)
        old_w = torch.cat([best_w, torch.zeros(L * H, 1, dtype=torch.float64)], 1)
        best_w = torch.where(grow[:, None], new_w, old_w)
        chosen = torch.cat([chosen, torch.where(grow, j, chosen[:, 0] if step else j)[:, None]], 1)
        best_e = torch.where(grow, e, best_e)
    weights = torch.zeros(L * H, R, dtype=torch.float64)
    weights.scatter_add_(1, chosen, best_w)
    weights[weights < 1e-3] = 0.0  # the penalty's rounding, not a rule
    total = weights.sum(1, keepdim=True)
    weights = torch.where(total > 0, weights / total.clamp(min=1e-300), torch.zeros_like(weights))
    weights[total[:, 0] <= 0, 0] = 1.0  # no rule at all: the first rule (the sink) alone
    return weights.reshape(L, H, R)


def _simplex_ls(C: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """``(N, m)`` weights ``w >= 0`` summing to 1 minimising ``w' C w - 2 w.c`` (``C`` ``(N, m, m)`` the rules'
    uncentred Gram, ``c`` ``(N, m)`` their products with the head): :func:`_nnls` with the sum held by a
    penalty ``lam (1'w - 1)^2`` large against ``C``, then normalised exactly."""
    lam = 1e4 * C.diagonal(dim1=1, dim2=2).mean(1).clamp(min=1e-12)[:, None]  # (N, 1)
    w, _ = _nnls(C + lam[..., None], c + lam)
    total = w.sum(1, keepdim=True)
    return torch.where(total > 0, w / total.clamp(min=1e-300), torch.zeros_like(w))


def _nnls(C: torch.Tensor, c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Non-negative least squares of ``(N, m, m)`` covariances ``C`` and ``(N, m)`` targets ``c``: ``w >= 0``
    maximising ``2 w.c - w' C w``, by every active set; returns ``w`` ``(N, m)`` and the explained ``w.c``."""
    N, m = c.shape
    best_w = torch.zeros(N, m, dtype=torch.float64)
    best = torch.zeros(N, dtype=torch.float64)
    eye = torch.eye(m, dtype=torch.float64)
    for size in range(1, m + 1):
        for active in itertools.combinations(range(m), size):
            a = torch.tensor(active)
            Ca = C[:, a][:, :, a] + 1e-12 * eye[:size, :size] * C.diagonal(dim1=1, dim2=2)[:, a].mean(1)[:, None, None]
            w, info = torch.linalg.solve_ex(Ca, c[:, a])  # (N, size)
            good = (w >= 0).all(1) & torch.isfinite(w).all(1) & (info == 0)
            explained = (w * c[:, a]).sum(1)
            better = good & (explained > best)
            full = torch.zeros(N, m, dtype=torch.float64)
            full[:, a] = w
            best_w = torch.where(better[:, None], full, best_w)
            best = torch.where(better, explained, best)
    return best_w, best


def mixture_sums(stats: dict[str, torch.Tensor], weights: torch.Tensor) -> torch.Tensor:
    """``(W, L, H, 6)`` per-window correlation sums (n, sx, sy, sxx, syy, sxy) of each head's mixture
    ``weights`` ``(L, H, R)``, or ``(L, H, G, R)`` per band of query positions (:mod:`headlens.atlas.sinkbands`),
    on the windows of ``stats``."""
    n, sx, sxx = stats["own"].unbind(-1)  # (W, L, H)
    if weights.dim() == 4:  # per band: the band's rows with the band's weights
        sy = torch.einsum("wgr,lhgr->wlh", stats["bsy"], weights)
        syy = torch.einsum("lhgr,wgrs,lhgs->wlh", weights, stats["bgram"], weights)
        sxy = (stats["bsxy"] * weights).sum((-1, -2))
        return torch.stack([n, sx, sy, sxx, syy, sxy], -1)
    sy = torch.einsum("wr,lhr->wlh", stats["sy"], weights)
    syy = torch.einsum("lhr,wrs,lhs->wlh", weights, stats["gram"], weights)
    sxy = (stats["sxy"] * weights).sum(-1)
    return torch.stack([n, sx, sy, sxx, syy, sxy], -1)


def conditional_pairs(stats: dict[str, torch.Tensor]) -> torch.Tensor:
    """``(L, H, R)``: each rule's weight in its pair with the first token, fit on the rows where the rule has
    targets only (least squares of the attention itself, ``w >= 0``, the pair's weights summing to 1; 0 where
    the rule adds nothing there)."""
    g = {k: stats[k].sum(0) for k in ("cy0", "cyy", "has", "csxy", "cs0")}  # (R,) or (L, H, R)
    C = torch.stack([g["cyy"], g["cy0"], g["cy0"], g["has"]], -1).reshape(-1, 2, 2)  # (R, 2, 2): uncentred Gram
    c = torch.stack([g["csxy"], g["cs0"]], -1)  # (L, H, R, 2)
    L, H, R, _ = c.shape
    w = _simplex_ls(C.expand(L * H, R, 2, 2).reshape(-1, 2, 2), c.reshape(-1, 2))  # (LHR, 2)
    return w[:, 0].reshape(L, H, R)


def conditional_sums(stats: dict[str, torch.Tensor], weight: torch.Tensor) -> torch.Tensor:
    """``(W, L, H, R, 6)``: the correlation sums, on the rows where each rule has targets only, of the pair
    ``weight * rule + (1 - weight) * first token`` (``weight`` ``(L, H, R)``, :func:`conditional_pairs`)."""
    grid = stats["csx"].shape
    per = lambda v: v[:, None, None].expand(grid)  # noqa: E731  (W, R) -> (W, L, H, R)
    a = weight[None].expand(grid)
    b = 1 - a
    has = per(stats["has"])  # the first token's sum y and sum y^2: one cell of 1 per row
    sy = a * per(stats["cy"]) + b * has
    syy = a * a * per(stats["cyy"]) + 2 * a * b * per(stats["cy0"]) + b * b * has
    sxy = a * stats["csxy"] + b * stats["cs0"]
    return torch.stack([per(stats["cn"]), stats["csx"], sy, stats["csxx"], syy, sxy], -1)


def coverage(stats: dict[str, torch.Tensor], weights: torch.Tensor, skip: int = 0) -> torch.Tensor:
    """``(L, H)``: the share of query rows where any of a head's rules but the ``skip``-th (the sink) has a
    target (1 for a head described by the sink alone)."""
    has = stats["hasrow"].double()  # (W, T, R)
    rows = stats["rest"][:, 0, 0, 2].sum().clamp(min=1)
    use = (weights > 0).double()
    use[..., skip] = 0
    union = (torch.einsum("wtr,lhr->wtlh", has, use) > 0).double().sum((0, 1))  # (L, H)
    return torch.where(use.sum(-1) > 0, union / rows, torch.ones_like(union))
