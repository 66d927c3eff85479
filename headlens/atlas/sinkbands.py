"""The first token's share of a row, set by the query's position: a mixture whose sink weight is not fixed.

Why it looks like this:

* **Where a head rests changes along the window.** A mixture of rules (:mod:`headlens.atlas.mixture`) gives
  the first token one weight in every row, but a real head's share on the first token varies from row to
  row, and a description that puts the wrong amount on it writes the first token's value where the head
  writes something else (most of the error of SmolLM2's descriptions put back, benchmarks/README.md). Of
  what a reader can state and a simulation can put back, the query's position predicts that share best
  (on SmolLM2's prose, position bands explain about a third of its variance across rows, the query's
  token class under a tenth), so a description may set the first token's share per band of query
  positions (:data:`headlens.atlas.rules.SINK_BANDS`: 0-1, 2-3, 4-7, ..., 64 and on) and spread the rest
  of each row by its other rules, in the mixture's proportions.
* **Fit from the same sums, to the attention itself.** Given the mixture's other rules ``M`` (their weights
  renormalised), the band's share ``s`` minimising ``sum |x - s e_0 - (1 - s) M|^2`` over its rows is
  ``(x - M).(e_0 - M) / |e_0 - M|^2``, from per-band sums (:func:`headlens.atlas.heldout.heldout_stats`:
  ``bfirst``, ``bsxy``, ``by0``, ``bgram``, ``brows``), clipped to [0, 1].
* **Kept only where it helps**: the bands replace the fixed weight when they cut the squared error left on
  the fit windows by :data:`headlens.atlas.mixture.MIN_DROP` or more, as a rule must to join a mixture; the
  description is then the mixture with its first-token weight read per band, and :func:`banded_pattern`
  puts exactly that back.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import torch

from headlens.atlas.mixture import MIN_DROP
from headlens.atlas.rules import SINK_BANDS

TIE = 1e-3  # bands must cut the squared error by this share of the head's sum of squares, or one weight holds


def band_names(n: int = len(SINK_BANDS) + 1) -> list[str]:
    """``["0-1", "2-3", ..., "64+"]``: the query positions of each of the first ``n`` bands, the last open.

    >>> band_names(), band_names(3)
    (['0-1', '2-3', '4-7', '8-15', '16-31', '32-63', '64+'], ['0-1', '2-3', '4+'])
    """
    edges = (0, *SINK_BANDS)[:n]
    return [f"{a}-{b - 1}" for a, b in itertools.pairwise(edges)] + [f"{edges[-1]}+"]


def fit_bands(stats: dict[str, torch.Tensor], weights: torch.Tensor, sink: int = 0
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(L, H, G, R)`` each head's weights per band of query positions, and ``(L, H)`` bool: the heads whose
    first-token share is set per band. ``weights`` ``(L, H, R)``: the mixtures (:func:`headlens.atlas.mixture.
    fit_mixtures`) fit on the windows of ``stats``; ``sink``: the first token's rule index. A head whose bands
    do not cut the squared error by :data:`MIN_DROP`, or whose mixture is the first token alone, keeps its
    weights in every band."""
    L, H, R = weights.shape
    flat_w = weights.reshape(L * H, R)
    banded = _banded(stats, flat_w, sink)  # (LH, G, R)
    flat = flat_w[:, None].expand_as(banded)
    e_flat = _sse(stats, flat)
    sxx = stats["own"].sum(0)[..., 2].reshape(-1)
    use = ((flat_w.sum(-1) - flat_w[:, sink] > 0) & (_sse(stats, banded) < (1 - MIN_DROP) * e_flat)
           & (e_flat > TIE * sxx))  # (LH,): a head its mixture already fits needs no bands
    out = torch.where(use[:, None, None], banded, flat)
    return out.reshape(L, H, *out.shape[1:]), use.reshape(L, H)


def band_error(stats: dict[str, torch.Tensor], sink: int = 0) -> Callable[[torch.Tensor], torch.Tensor]:
    """weights ``(LH, R)`` -> ``(LH,)`` the squared error left on the windows of ``stats`` with the first
    token's weight fit per band (the others' proportions as in the weights)."""
    sxx = stats["own"].sum(0)[..., 2].reshape(-1)
    return lambda w: _sse(stats, _banded(stats, w, sink)) + TIE * sxx  # a near tie goes to one weight


def _banded(stats: dict[str, torch.Tensor], weights: torch.Tensor, sink: int) -> torch.Tensor:
    """``(LH, G, R)``: ``weights`` ``(LH, R)`` with the first token's share fit per band (module docstring),
    the other rules' proportions kept; the weights as they are where there is no other rule."""
    g = {k: stats[k].sum(0) for k in ("bgram", "by0", "brows")}
    bsxy, bfirst = (stats[k].sum(0).flatten(0, 1) for k in ("bsxy", "bfirst"))  # (LH, G, R), (LH, G)
    c = weights.clone()
    c[:, sink] = 0
    total = c.sum(-1, keepdim=True)  # (LH, 1)
    c = c / total.clamp(min=1e-300)  # (LH, R): the other rules, renormalised
    x_m = torch.einsum("ngr,nr->ng", bsxy, c)  # sum x.M per band
    m_0 = torch.einsum("gr,nr->ng", g["by0"], c)  # sum M on the first token
    m_m = torch.einsum("nr,grs,ns->ng", c, g["bgram"], c)  # sum |M|^2
    num = bfirst - x_m - m_0 + m_m
    den = g["brows"] - 2 * m_0 + m_m
    rows = g["brows"].clamp(min=1e-300)
    s = torch.where(den > 1e-9, num / den.clamp(min=1e-300), bfirst / rows).clamp(0, 1)  # any s fits: the head's
    seen = torch.where(g["brows"] > 0, torch.arange(len(rows)), 0).cummax(0).values  # (G,): a band with no rows
    s = s[:, seen]  # takes the share of the last band before it that has some
    e0 = torch.zeros_like(c)
    e0[:, sink] = 1
    banded = s[..., None] * e0[:, None] + (1 - s[..., None]) * c[:, None]  # (LH, G, R)
    return torch.where(total[..., None] > 0, banded, weights[:, None].expand_as(banded))


def _sse(stats: dict[str, torch.Tensor], w: torch.Tensor) -> torch.Tensor:
    """``(LH,)``: the squared error left by band weights ``w`` ``(LH, G, R)`` on the windows of ``stats``."""
    sxx = stats["own"].sum(0)[..., 2].reshape(-1)
    lin = (w * stats["bsxy"].sum(0).flatten(0, 1)).sum((-1, -2))
    quad = torch.einsum("ngr,grs,ngs->n", w, stats["bgram"].sum(0), w)
    return sxx - 2 * lin + quad


def banded_pattern(mixture: dict[str, float], shares: tuple[float, ...], targets: dict[str, torch.Tensor],
                   sink: str) -> torch.Tensor:
    """``(B, Q, K)``: the pattern of a mixture whose first-token weight is ``shares[band]`` at each query
    position: ``s e_0 + (1 - s) M``, ``M`` the mixture's other rules' whole predictions (``targets[rule]``,
    first-token fallback included), their weights renormalised."""
    from headlens.atlas.heldout import bands

    others = {r: w for r, w in mixture.items() if r != sink and w > 0}
    total = sum(others.values())
    e0 = torch.zeros_like(next(iter(targets.values())))  # (B, Q, K)
    e0[..., 0] = 1
    M = sum((w / total * targets[r] for r, w in others.items()), e0 * (total == 0))  # (B, Q, K)
    s = (bands(M.shape[1], len(shares)) @ torch.tensor(shares, dtype=torch.float64)).to(M)  # (Q,): each position's
    return s[:, None] * e0 + (1 - s[:, None]) * M


def key_weighted(p: torch.Tensor, tokens: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``(B, Q, K)``: pattern ``p`` with each key's cell off the first token weighted by its token's weight
    (``tokens`` ``(B, K)``, ``weight`` ``(V,)``; :mod:`headlens.atlas.keypref`), each row renormalised to its mass
    off the first token as in ``p``: the first token's cell is as it was.

    >>> p = torch.tensor([[[1.0, 0, 0], [0.5, 0.5, 0], [0.2, 0.4, 0.4]]])
    >>> key_weighted(p, torch.tensor([[0, 1, 2]]), torch.tensor([1.0, 1.0, 3.0]))[0, 2].tolist()
    [0.20000000298023224, 0.20000000298023224, 0.6000000238418579]
    """
    rest = p[..., 1:] * weight.to(p)[tokens[:, None, 1:].clamp(max=weight.shape[0] - 1)]  # (B, Q, K-1)
    mass = p[..., 1:].sum(-1, keepdim=True)  # (B, Q, 1)
    rest = rest / rest.sum(-1, keepdim=True).clamp(min=1e-12) * mass
    return torch.cat([p[..., :1], rest], -1)


def query_rested(p: torch.Tensor, tokens: torch.Tensor, odds: torch.Tensor) -> torch.Tensor:
    """``(B, Q, K)``: pattern ``p`` with each row's share on the first token moved by its query's token: a row whose
    share is ``s`` gets ``s u / (s u + 1 - s)``, ``u = odds[token at the query]`` (``tokens`` ``(B, Q)``, ``odds``
    ``(V,)``; :mod:`headlens.atlas.keypref`), the other cells scaled to the rest of the row: where the description
    spreads the rest is as it was. A row with no share on the first token (or all of it) keeps it.

    >>> p = torch.tensor([[[1.0, 0, 0], [0.5, 0.5, 0], [0.5, 0.25, 0.25]]])
    >>> query_rested(p, torch.tensor([[0, 1, 2]]), torch.tensor([1.0, 1.0, 3.0]))[0, 2].tolist()
    [0.75, 0.125, 0.125]
    """
    total = p.sum(-1)  # (B, Q)
    s = p[..., 0] / total.clamp(min=1e-12)  # (B, Q): each row's share on the first token
    su = s * odds.to(p)[tokens.clamp(max=odds.shape[0] - 1)]
    new = su / (su + 1 - s).clamp(min=1e-12)  # (B, Q)
    scale = torch.where(s < 1, (1 - new) / (1 - s).clamp(min=1e-12), torch.zeros_like(s))  # (B, Q)
    return torch.cat([(new * total)[..., None], p[..., 1:] * scale[..., None]], -1)
