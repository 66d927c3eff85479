"""A head's description as a non-negative mixture of at most three rules, fit and scored from streamed sums.

Why it looks like this:

* **Fit from sums.** Every rule predicts a whole attention row (:mod:`headlens.atlas.heldout`), and a mixture
  ``sum_r w_r y_r`` is linear in them, so its least-squares fit needs only the covariances: ``C = G - sy
  sy' / n`` between the rules (one per corpus, not per head) and ``c = sxy - sx sy / n`` of each rule with
  the head. Least squares with an intercept and ``w >= 0`` maximises the correlation of the mixture with
  the real pattern among non-negative mixtures of the chosen rules.
* **Greedy, at most three rules.** The best single rule first, then the rule that raises the fit's
  correlation most, while it raises it by :data:`MIN_GAIN` or more: a description stays short enough to
  read. Each step's non-negative least squares enumerates the active sets of its (at most three) rules.
* **Fit on one set of windows, scored on another**: :func:`mixture_sums` gives the per-window sums of the
  chosen mixtures on the held-out windows, for the same Pearson r and bootstrap as a single rule.
* **A rule on its own rows, paired with the first token** (:func:`conditional_pairs`): a head that does
  induction where a repeat exists often keeps part of those rows on the first token too, so a rule scored
  alone on its rows would count that rest against it. The pair is fit on the rows where the rule has targets
  (the same covariances, two rules), and it is the pair that is scored there and put back: its weights,
  applied to whole rows, are the rule's on those rows and the first token's alone elsewhere.
* The weights shown are normalised to sum to 1 (the correlation does not change with the scale): the
  mixture is then an attention pattern itself, each row summing to 1, which substitution puts back.
"""

from __future__ import annotations

import itertools

import torch

MAX_RULES = 3  # at most this many rules in one description
MIN_GAIN = 0.02  # a rule joins a mixture only when it raises the fit's correlation by this much


def corr(s: torch.Tensor) -> torch.Tensor:
    """Pearson correlation from sums ``(..., 6)`` = (n, sx, sy, sxx, syy, sxy)."""
    n, sx, sy, sxx, syy, sxy = s.unbind(-1)
    cov = sxy - sx * sy / n.clamp(min=1)
    var = (sxx - sx * sx / n.clamp(min=1)) * (syy - sy * sy / n.clamp(min=1))
    return torch.where(var > 1e-300, cov / var.clamp(min=1e-300).sqrt(), torch.zeros_like(cov))


def fit_mixtures(stats: dict[str, torch.Tensor], allowed: torch.Tensor | None = None) -> torch.Tensor:
    """``(L, H, R)`` non-negative weights summing to 1 per head (at most :data:`MAX_RULES` non-zero), fit on
    the windows of ``stats`` (:func:`headlens.atlas.heldout.heldout_stats`). ``allowed`` ``(R,)`` bool: the
    rules a mixture may use (rules without a target on the fit windows are left out)."""
    n, sx, sxx = stats["own"].sum(0).unbind(-1)  # (L, H) each
    L, H = n.shape
    sy, G = stats["sy"].sum(0), stats["gram"].sum(0)  # (R,), (R, R)
    n0 = n.reshape(-1)[0].clamp(min=1)
    C = G - torch.outer(sy, sy) / n0  # (R, R): covariance of the rules' predictions
    c = (stats["sxy"].sum(0) - sx[..., None] * sy / n0).reshape(L * H, -1)  # (LH, R): with each head
    vx = (sxx - sx * sx / n0).reshape(-1).clamp(min=1e-300)  # (LH,)
    R = C.shape[0]
    ok = torch.ones(R, dtype=torch.bool) if allowed is None else allowed
    ok = ok & (C.diagonal() > 1e-12)
    chosen = torch.empty(L * H, 0, dtype=torch.long)
    best_r = torch.zeros(L * H, dtype=torch.float64)
    best_w = torch.zeros(L * H, 0, dtype=torch.float64)
    for step in range(MAX_RULES):
        cand_r = torch.full((L * H, R), -1.0, dtype=torch.float64)
        cand_w = torch.zeros(L * H, R, step + 1, dtype=torch.float64)
        for j in range(R):
            if not ok[j]:
                continue
            idx = torch.cat([chosen, torch.full((L * H, 1), j)], 1)  # (LH, m)
            w, explained = _nnls(C[idx[:, :, None], idx[:, None, :]], c.gather(1, idx))
            r = (explained.clamp(min=0) / vx).sqrt()
            r[(chosen == j).any(1)] = -1.0
            cand_r[:, j], cand_w[:, j] = r, w
        r, j = cand_r.max(1)  # (LH,)
        grow = (r >= best_r + (MIN_GAIN if step else 0.0)) & (r > 0)
        if step and not bool(grow.any()):
            break
        new_w = cand_w[torch.arange(L * H), j]  # (LH, m)
        old_w = torch.cat([best_w, torch.zeros(L * H, 1, dtype=torch.float64)], 1)
        best_w = torch.where(grow[:, None], new_w, old_w)
        chosen = torch.cat([chosen, torch.where(grow, j, chosen[:, 0] if step else j)[:, None]], 1)
        best_r = torch.where(grow, r, best_r)
    weights = torch.zeros(L * H, R, dtype=torch.float64)
    weights.scatter_add_(1, chosen, best_w)
    total = weights.sum(1, keepdim=True)
    weights = torch.where(total > 0, weights / total.clamp(min=1e-300), torch.zeros_like(weights))
    none = total[:, 0] <= 0
    weights[none, 0] = 1.0  # nothing correlates positively: the first rule (the sink) alone
    return weights.reshape(L, H, R)


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
    ``weights`` ``(L, H, R)`` on the windows of ``stats``."""
    n, sx, sxx = stats["own"].unbind(-1)  # (W, L, H)
    sy = torch.einsum("wr,lhr->wlh", stats["sy"], weights)
    syy = torch.einsum("lhr,wrs,lhs->wlh", weights, stats["gram"], weights)
    sxy = (stats["sxy"] * weights).sum(-1)
    return torch.stack([n, sx, sy, sxx, syy, sxy], -1)


def conditional_pairs(stats: dict[str, torch.Tensor]) -> torch.Tensor:
    """``(L, H, R)``: each rule's weight in its pair with the first token, fit on the rows where the rule has
    targets only (least squares with ``w >= 0``, the pair's weights summing to 1; 0 where the rule adds
    nothing, or where neither correlates with the head there)."""
    g = {k: stats[k].sum(0) for k in ("cn", "cy", "cyy", "cy0", "has", "csx", "csxy", "cs0")}  # (R,) or (L, H, R)
    n = g["cn"].clamp(min=1)  # (R,)
    ye = g["cy0"] - g["cy"] * g["has"] / n  # (R,): covariance of the rule's prediction with the first token
    C = torch.stack([g["cyy"] - g["cy"] ** 2 / n, ye, ye, g["has"] - g["has"] ** 2 / n], -1).reshape(-1, 2, 2)
    c = torch.stack([g["csxy"] - g["csx"] * g["cy"] / n, g["cs0"] - g["csx"] * g["has"] / n], -1)  # (L, H, R, 2)
    L, H, R, _ = c.shape
    w, _ = _nnls(C.expand(L * H, R, 2, 2).reshape(-1, 2, 2), c.reshape(-1, 2))  # (LHR, 2)
    total = w.sum(-1)
    return torch.where(total > 0, w[:, 0] / total.clamp(min=1e-300), torch.zeros_like(total)).reshape(L, H, R)


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
