"""The sums a description's score needs, streamed over windows: each layer's pattern reduced in its hook.

Why it looks like this:

* **Whole rows, first token and self included.** A description predicts a head's whole attention row
  (:mod:`headlens.atlas.describe`): each rule spreads a row's mass over its targets (evenly, or by its
  weights for a decay) and, in a row where it has none, puts it on the first token, where a head with
  nothing to do rests. So a head that rests on the first token is described by the rule ``first_token``,
  and one that does induction where a repeat exists and rests elsewhere by ``induction`` alone.
* **Sums, not patterns.** Agreement is a Pearson correlation over every causal (query, key) cell, and a
  mixture of rules is linear in the rules' predictions, so per window and head it needs only ``n, sx, sxx``
  and, per rule, ``sxy``; per window (not per head) ``sy`` and the rules' Gram matrix ``G[r, s] = sum y_r
  y_s``. A mixture ``w`` then has ``sy = w . sy``, ``syy = w' G w``, ``sxy = w . sxy``: fit and scored from
  sums, with a bootstrap over windows. ``sxy`` is split into the rows where a rule has targets (a product
  per query row, ``(H, K) x (K, 2R)``, with each rule's mass on target) and the first-token cell of the
  rows where it has none (a product of ``(B, H, Q)`` rows). The rows with targets also give a rule's
  *conditional* agreement and its coverage: scored on those rows alone, as a pair with the first token
  (``cs0``, ``cy0``: the head's and the rule's first-token cell there), so a head that keeps part of
  each such row on the first token is not held to the rule alone.
* **The same sums per band of query positions** (``bsxy``, ``bfirst``, ``bsy``, ``bgram``, ``by0``,
  ``brows``; :data:`headlens.atlas.rules.SINK_BANDS`): a description may set the first token's weight per
  band (:mod:`headlens.atlas.sinkbands`). The per-row products are summed per band, not per window, so
  this costs a sum over rows; each whole-window sum is the sum of its bands'.
* **Rules known before the forward are summed in the hook** (they read the tokens only). A rule whose
  targets need the forward itself (``predicted_token``: the model's own top predictions, known after the
  last layer) keeps each layer's pattern in float32 until they are known (a batch's worth), then takes the
  same products.
* **Float32 products, float64 sums**: each row's ``K`` cells and each band's rows are summed in float32
  by the products (relative error about 1e-6, under the bootstrap's), everything after in float64.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from headlens.atlas.rules import CLASSES, SINK_BANDS, annotate, causal_cells, rule_targets
from headlens.detectors.base import Detector
from headlens.probes.base import ProbeBatch

Late = Callable[[Any, ProbeBatch, torch.Tensor], dict[str, torch.Tensor]]  # (logits, batch, cells) -> rule targets
CS_SUMS = "predicted_token"  # the rule whose off-rest mass copy suppression's first claim reads


def heldout_stats(model: Any, windows: list[torch.Tensor], rules: dict[str, Detector], late: Late | None = None,
                  batch_size: int = 8, classes: dict[str, torch.Tensor] | None = None,
                  progress: Callable[[int, int], None] | None = None) -> dict[str, torch.Tensor]:
    """Per window the sums the descriptions need (``W`` first; rules in ``names`` order, early rules then late):

    per head ``(W, L, H, ...)``: ``rest`` (off-rest mass, first-token mass, query rows), ``own`` (n, sx, sxx over
    every causal cell), ``sxy`` ``(.., R)`` (each rule's prediction, first-token fallback included), ``csx``,
    ``csxx``, ``csxy`` ``(.., R)`` (the same on the rows where the rule has targets, without fallback), ``on``
    ``(.., R)`` (mass on the rule's targets), ``cs0`` ``(.., R)`` (first-token attention on the rows where the
    rule has targets), ``cs`` ``(.., 5)`` (copy suppression's first claim); per window: ``sy`` ``(W, R)``,
    ``gram`` ``(W, R, R)``, ``cn, cy, cyy, cy0`` ``(W, R)`` (cells, sum y, sum y^2, y on the first token, on the
    rows with targets), ``has`` ``(W, R)`` (query rows with a target), ``chance`` ``(W, R)`` (a uniform row's
    mass on the targets), ``hasrow`` ``(W, T, R)`` bool. Per band of query positions ``G``: ``bsxy`` ``(W, L, H, G,
    R)``, ``bfirst`` ``(W, L, H, G)`` (the head's first-token attention), ``bsy``, ``by0`` ``(W, G, R)`` (each rule's
    sum y, and y on the first token), ``bgram`` ``(W, G, R, R)``, ``brows`` ``(W, G)`` (query rows). ``names``: the
    rule order, as a list.

    ``rules``: the rules whose predicate reads the window alone; ``late(logits, batch, cells)``: rule name ->
    targets ``(B, Q, K)`` of the rules that need the model's logits ``(B, T, V)`` on the window. ``classes``:
    the vocabulary's token classes (:func:`headlens.atlas.rules.token_classes`) the rules read.
    """
    from headlens.models.vocab import vocab

    special, L = vocab(model).special, model.cfg.n_layers
    out: dict[str, list[torch.Tensor]] = {}
    names: list[str] = []
    for start in range(0, len(windows), batch_size):
        batch = _batch(windows[start:start + batch_size], special, classes)
        sums, names = _batch_sums(model, batch, rules, late, L)
        for key, value in sums.items():
            out.setdefault(key, []).append(value)
        if progress is not None:
            progress(min(start + batch_size, len(windows)), len(windows))
    T = max(int(v.shape[1]) for v in out["hasrow"])
    out["hasrow"] = [torch.nn.functional.pad(v, (0, 0, 0, T - v.shape[1])) for v in out["hasrow"]]
    return {**{key: torch.cat(vals) for key, vals in out.items()}, "names": names}


def _batch_sums(model: Any, batch: ProbeBatch, rules: dict[str, Detector], late: Late | None, L: int
                ) -> tuple[dict[str, torch.Tensor], list[str]]:
    """One batch's sums: the early rules summed in each layer's hook, the late ones after."""
    T = batch.tokens.shape[1]
    cells = causal_cells(batch)  # (B, Q, K): whole causal rows
    early = {name: rule_targets(rule, batch, T) * cells for name, rule in rules.items()}  # (B, Q, K) weights
    targets = _targets(early).float()  # (B, Q, K, 2R): float32 products, summed per window in float64
    per_layer: list[dict[str, torch.Tensor]] = [{} for _ in range(L)]
    kept: list[torch.Tensor] = [torch.empty(0)] * L  # per layer (B, H, Q, K) float32, for the late rules

    def fold(layer: int) -> Any:
        def reduce(pattern: torch.Tensor, hook: Any) -> None:  # (B, H, Q, K)
            x = pattern.detach().cpu().float() * cells[:, None]  # (B, H, Q, K) float32: the real rows
            diag = x.diagonal(dim1=-2, dim2=-1)  # (B, H, Q): attention on the query itself
            per_layer[layer]["rows"] = torch.stack([x.sum(-1), (x * x).sum(-1), x[..., 0], diag], -1).double()
            per_layer[layer]["prod"] = _products(x, targets)  # (B, H, G, 2R): sum x.y, then mass on target
            if late is not None:
                kept[layer] = x
        return reduce

    names = [f"blocks.{layer}.attn.hook_pattern" for layer in range(L)]
    with torch.no_grad(), model.hooks([(name, fold(layer)) for layer, name in enumerate(names)]):
        logits = model(batch.tokens.to(model.device))  # (B, T, V): windows are right-padded; pads are never a query
    rows = torch.stack([s["rows"] for s in per_layer], 1)  # (B, L, H, Q, 4): sum, sum of squares, first, self
    prod = torch.stack([s["prod"] for s in per_layer], 1)  # (B, L, H, G, 2R)
    hits = dict(early)
    if late is not None:
        extra = {n: t.double() for n, t in late(logits, batch, cells).items()}  # rule -> (B, Q, K)
        del logits
        more = _targets(extra)  # (B, Q, K, 2R')
        if more.numel():
            lp = torch.stack([_products(kept[layer], more.float()) for layer in range(L)], 1)  # (B, L, H, G, 2R')
            a, b = prod.chunk(2, -1)
            c, d = lp.chunk(2, -1)
            prod = torch.cat([a, c, b, d], -1)
        hits.update(extra)
    return _assemble(batch, cells, hits, rows, prod), list(hits)


def _targets(hits: dict[str, torch.Tensor]) -> torch.Tensor:
    """``(B, Q, K, 2R)`` float64: per rule its prediction ``y`` on the rows where it has targets (each row's mass
    spread over them by their weights), then per rule its targets as 0/1."""
    if not hits:
        return torch.zeros(0)
    w = torch.stack(list(hits.values()), -1).double()  # (B, Q, K, R)
    y = w / w.sum(-2, keepdim=True).clamp(min=1e-300)  # (B, Q, K, R): the rule's predicted attention
    return torch.cat([y, (w > 0).double()], -1)  # (B, Q, K, 2R)


def _products(x: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """``(B, H, G, 2R)``: the pattern ``x`` ``(B, H, Q, K)`` summed against each column of ``targets`` ``(B, Q, K,
    2R)``, row by row, then over the query rows of each position band (:func:`bands`)."""
    B, H, Q, _ = x.shape  # (B, H, Q, K)
    G = len(SINK_BANDS) + 1
    if targets.numel() == 0:
        return x.new_zeros(B, H, G, 0, dtype=torch.float64)
    per_row = torch.einsum("bhqk,bqkr->bhqr", x, targets)  # (B, H, Q, 2R): one small product per query row
    return torch.einsum("bhqr,qg->bhgr", per_row, bands(Q).float()).double()  # (B, H, G, 2R)


def bands(T: int, n: int = len(SINK_BANDS) + 1) -> torch.Tensor:
    """``(T, n)`` float64 one-hot: each query position's band (:data:`headlens.atlas.rules.SINK_BANDS`), the
    positions past the first ``n`` bands in the last.

    >>> bands(9).argmax(1).tolist(), bands(9, 3).argmax(1).tolist()
    ([0, 0, 1, 1, 2, 2, 2, 2, 3], [0, 0, 1, 1, 2, 2, 2, 2, 2])
    """
    band = torch.bucketize(torch.arange(T), torch.tensor(SINK_BANDS), right=True).clamp(max=n - 1)  # (T,)
    return torch.nn.functional.one_hot(band, n).double()


def _assemble(batch: ProbeBatch, cells: torch.Tensor, hits: dict[str, torch.Tensor], rows: torch.Tensor,
              prod: torch.Tensor) -> dict[str, torch.Tensor]:
    """The per-window sums (see :func:`heldout_stats`) from each query row's sums ``rows`` ``(B, L, H, Q, 4)``
    (mass, sum of squares, first-token and self attention), each rule's ``sum x.y`` and mass on target
    ``prod`` ``(B, L, H, 2R)`` and the head-independent targets ``hits[name]`` ``(B, Q, K)`` weights."""
    B, L, H, Q, _ = rows.shape
    grid = (B, L, H)
    okq = batch.query_ok.double()  # (B, Q)
    w = torch.stack(list(hits.values()), -1)  # (B, Q, K, R)
    n_t = (w > 0).sum(-2)  # (B, Q, R): targets per row
    has = (n_t > 0) & batch.query_ok[..., None]  # (B, Q, R)
    hasd = has.double()
    y = w / w.sum(-2, keepdim=True).clamp(min=1e-300)  # (B, Q, K, R): prediction on rows with targets
    fall = (1 - hasd) * okq[..., None]  # (B, Q, R): rows where the rule falls back on the first token
    yt = y.clone()
    yt[:, :, 0] += fall  # (B, Q, K, R): the whole prediction
    n_cells = cells.sum((-2, -1)).double()  # (B,)
    mass, sq, first, own = rows.unbind(-1)  # (B, L, H, Q) each
    bsxy_c, bon = prod.chunk(2, -1)  # (B, L, H, G, R) each: per band of query positions
    sxy_c, on = bsxy_c.sum(3), bon.sum(3)  # (B, L, H, R) each
    band = bands(Q) * okq[..., None]  # (B, Q, G): the countable rows of each band
    row_gram = torch.einsum("bqkr,bqks->bqrs", yt, yt)  # (B, Q, R, R): the rules' uncentred Gram, row by row
    per_cell = cells.sum(-1).double()  # (B, Q): cells per row
    q = torch.arange(Q)
    chance = (n_t.double() / (q[None, :, None] + 1)) * hasd  # (B, Q, R): a uniform row's mass on targets
    off = mass - first - own  # (B, L, H, Q): attention off the first token and the query itself
    out = {"rest": torch.stack([off.sum(-1), (first * okq[:, None, None]).sum(-1),
                                okq.sum(-1)[:, None, None].expand(grid)], -1),
           "own": torch.stack([n_cells[:, None, None].expand(grid), mass.sum(-1), sq.sum(-1)], -1),
           "sxy": sxy_c + torch.einsum("blhq,bqr->blhr", first, fall),
           "csx": torch.einsum("blhq,bqr->blhr", mass, hasd), "csxx": torch.einsum("blhq,bqr->blhr", sq, hasd),
           "csxy": sxy_c, "cs0": torch.einsum("blhq,bqr->blhr", first, hasd), "on": on,
           "sy": yt.sum((1, 2)), "gram": row_gram.sum(1),
           "bsxy": bsxy_c + torch.einsum("blhq,bqr,bqg->blhgr", first, fall, band),
           "bfirst": torch.einsum("blhq,bqg->blhg", first, band), "bsy": torch.einsum("bqkr,bqg->bgr", yt, band),
           "bgram": torch.einsum("bqrs,bqg->bgrs", row_gram, band), "by0": torch.einsum("bqr,bqg->bgr", yt[:, :, 0], band),
           "brows": band.sum(1),
           "cn": torch.einsum("bq,bqr->br", per_cell, hasd), "cy": y.sum((1, 2)), "cyy": (y * y).sum((1, 2)),
           "cy0": y[:, :, 0].sum(1),
           "has": hasd.sum(1), "chance": chance.sum(1), "hasrow": has}
    if CS_SUMS in hits:  # copy suppression's first claim, on off-rest attention (docs/atlas.md)
        i = list(hits).index(CS_SUMS)
        n_off = (cells.sum(-1) - 2).clamp(min=1).double()  # (B, Q): off-rest keys per row
        even = torch.einsum("blhq,bq->blh", off, n_t[..., i] / n_off * hasd[..., i])
        out["cs"] = torch.stack([on[..., i], hasd[..., i].sum(-1)[:, None, None].expand(grid),
                                 chance[..., i].sum(-1)[:, None, None].expand(grid),
                                 torch.einsum("blhq,bq->blh", off, hasd[..., i]), even], -1)
    return out


def _batch(seqs: list[torch.Tensor], special: frozenset[int], classes: dict[str, torch.Tensor] | None = None
           ) -> ProbeBatch:
    lengths = torch.tensor([len(s) for s in seqs])
    T = int(lengths.max())
    tokens = torch.zeros(len(seqs), T, dtype=torch.long)
    for b, s in enumerate(seqs):
        tokens[b, : len(s)] = s
    valid = torch.arange(T)[None, :] < lengths[:, None]  # (B, T)
    spec = torch.isin(tokens, torch.tensor(sorted(special), dtype=torch.long)) | ~valid
    batch = ProbeBatch(tokens, lengths, valid, spec, True)
    if classes is None:  # no token strings: every class is empty
        classes = {c: torch.zeros(int(tokens.max()) + 1, dtype=torch.bool) for c in CLASSES}
    annotate(batch, classes)
    return batch
