"""How much of a row a head puts on the first token, by the query's token: an odds factor per query token.

Why it looks like this:

* **Where a head rests depends on what it reads.** A description (:mod:`headlens.atlas.describe`) sets a
  head's share on the first token once, or per band of query positions (:mod:`headlens.atlas.sinkbands`),
  but on SmolLM2's prose the query token's identity explains about 0.57 of the row-to-row variance of that
  share, its position a third (benchmarks/README.md). A factor per query token on the odds of that share is
  what a reader can state ("more after ',' and a line break") and a simulation can put back from the tokens
  alone: a row whose share is ``s`` gets ``s u / (s u + 1 - s)``, the rest of the row scaled to what is left
  (:func:`headlens.atlas.sinkbands.query_rested`). An odds factor keeps every share in [0, 1], composes with
  the bands, and leaves a head that never rests (``s = 0``) as it was.
* **Fit per token, shrunk to the description.** Over the fit rows, each of the :data:`TOP` most frequent
  query tokens gets the factor that makes the description's first-token mass after it match the head's
  (:data:`ITERS` steps of ``u <- u odds(target) / odds(put back)`` by mass, a Newton-like step on the log
  odds), with :data:`PRIOR` pseudo-rows at the description's own mean share after that token, so a token seen
  a few times stays near 1; every other token keeps 1. :mod:`headlens.atlas.keypref` fits, gates and scores
  it beside the key weights (kept where it cuts the squared error of whole rows on the other fit windows by
  :data:`headlens.atlas.mixture.MIN_DROP`).
* **The sentence shows measured shares**: the head's own mean share on the first token on held-out text, and
  after the tokens whose factor moves the most mass on the fit windows, each on the side the factor puts it
  (a token the held-out text contradicts is not named), with at least :data:`MIN_ROWS` held-out rows each.
"""

from __future__ import annotations

import torch

PRIOR = 2.0  # pseudo-rows at the description's own share that shrink each query token's factor towards 1
TOP = 256  # query tokens that get a factor: the most frequent on the fit windows (shared by every head)
ITERS = 8  # fitting steps (one is exact for rows of one share; a few more for rows of several)
SHOWN = 3  # query tokens a sentence names each way
MIN_ROWS = 4  # held-out rows a named query token needs
LIMIT = 1e3  # the largest factor either way


def fit_odds(s: torch.Tensor, x: torch.Tensor, tokens: torch.Tensor, V: int
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """From the fit rows: ``s`` ``(N, R)`` the description's share on the first token in each row (N heads),
    ``x`` ``(N, R)`` the head's, ``tokens`` ``(R,)`` each row's query token. Returns ``(N, V)`` float32 odds
    factors (1 outside the :data:`TOP` tokens), the top tokens ``(n,)`` and ``(N, n)`` the mass each token's
    factor moves (the head's first-token mass after it minus the description's, on these rows).

    >>> s = torch.full((1, 6), 0.5, dtype=torch.float64)
    >>> x = torch.tensor([[0.9, 0.9, 0.9, 0.1, 0.1, 0.1]], dtype=torch.float64)
    >>> odds, top, moved = fit_odds(s, x, torch.tensor([1, 1, 1, 2, 2, 2]), 4)
    >>> [round(float(v), 2) for v in odds[0]], top.tolist()  # 3 rows at 0.9 and 2 pseudo-rows at 0.5: 0.74
    ([1.0, 2.85, 0.35, 1.0], [1, 2])
    """
    count = torch.bincount(tokens, minlength=V)
    n = min(TOP, int((count > 0).sum()))
    top = count.topk(n).indices  # (n,)
    look = torch.full((V,), n, dtype=torch.long)
    look[top] = torch.arange(n)
    idx = look[tokens]  # (R,): each row's token's place among the top, n for the others
    N = s.shape[0]
    rows = torch.zeros(n + 1, dtype=torch.float64).index_add_(0, idx, torch.ones_like(s[0]))  # (n + 1,)
    real = torch.zeros(N, n + 1, dtype=torch.float64).index_add_(1, idx, x)
    base = torch.zeros(N, n + 1, dtype=torch.float64).index_add_(1, idx, s)
    bar = base / rows.clamp(min=1)  # (N, n + 1): the description's mean share after each token
    target, total = real + PRIOR * bar, rows + PRIOR
    free = (bar > 1e-6) & (bar < 1 - 1e-6)  # a token whose rows all rest wholly, or never, has no odds to move
    free[:, n] = False
    u = torch.ones(N, n + 1, dtype=torch.float64)
    for _ in range(ITERS):
        put = torch.zeros_like(real).index_add_(1, idx, _moved(s, u[:, idx])) + PRIOR * _moved(bar, u)
        step = (target + 1e-9) / (put + 1e-9) * (total - put + 1e-9) / (total - target + 1e-9)
        u = torch.where(free, (u * step).clamp(1 / LIMIT, LIMIT), u)
    odds = torch.ones(N, V)
    odds[:, top] = u[:, :n].float()
    return odds, top, (real - base)[:, :n]


def _moved(s: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """A share ``s`` with its odds multiplied by ``u``."""
    return s * u / (s * u + 1 - s).clamp(min=1e-12)


def clause(odds: dict[int, float], strings: list[str], moved: dict[int, float], held: dict[int, tuple[float, int]],
           mean: float) -> str:
    """What the query factors say: the head's mean share on the first token on held-out text and its share after
    the named query tokens there (``held``: token -> (share, rows)), those whose factor moves the most mass on the
    fit windows (``moved``), each named on the side its factor puts it and the held-out share confirms.

    >>> clause({5: 3.0, 6: 0.2, 7: 2.0}, ["x"] * 5 + [",", " the", "!"], {5: 4.0, 6: -3.0, 7: 0.1},
    ...        {5: (0.9, 40), 6: (0.2, 30), 7: (0.3, 10)}, 0.6)
    "Its share on the first token depends on the query's token: on held-out text 0.60 of a row on average; more after ',' (0.90); less after ' the' (0.20) (3 query tokens weighted, fit on the pass's windows)"
    """
    name = lambda t: repr(strings[t]) if t < len(strings) else str(t)  # noqa: E731
    order = sorted(moved, key=lambda t: -abs(moved[t]))
    ok = lambda t: held.get(t, (0.0, 0))[1] >= MIN_ROWS  # noqa: E731
    more = [t for t in order if odds[t] > 1 and ok(t) and held[t][0] > mean][:SHOWN]
    less = [t for t in order if odds[t] < 1 and ok(t) and held[t][0] < mean][:SHOWN]
    said = "; ".join(f"{side} after " + ", ".join(f"{name(t)} ({held[t][0]:.2f})" for t in ts)
                     for side, ts in (("more", more), ("less", less)) if ts)
    return (f"Its share on the first token depends on the query's token: on held-out text {mean:.2f} of a row on "
            f"average{'; ' + said if said else ''} ({len(odds)} query tokens weighted, fit on the pass's windows)")
