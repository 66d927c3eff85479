"""The sums a description's score needs, streamed over held-out windows: each layer's pattern reduced in its hook.

Why it looks like this:

* **Sums, not patterns.** A rule's agreement is a Pearson correlation of real and predicted off-rest
  attention over every (query, key) cell (:mod:`headlens.atlas.describe`), so per window and head it needs
  only ``(n, sx, sy, sxx, syy, sxy)``, and its attention on target only the mass on the rule's targets.
  ``sx, sxx`` are the pattern's own; ``n, sy, syy`` and the chance mass do not depend on the head (one per
  window); ``sxy`` and the mass on target are one batched product of the layer's pattern ``(B, H, Q*K)``
  with every rule's prediction and targets ``(B, Q*K, 2R)``. Nothing ``(B, L, H, Q, K)`` is ever stacked.
  Each row's off-rest attention ``(B, H, Q)`` is kept too: against each rule's rows with a target, it
  gives the share of off-rest attention on the targets and what an even spread would put there (copy
  suppression's first claim, :mod:`headlens.atlas.describe`).
* **Rules known before the forward are summed in the hook** (the token rules and the offsets read the tokens
  only). A rule whose targets need the forward itself (``predicted_token``: the model's own top
  predictions, known after the last layer) keeps each layer's off-rest pattern in float32 until they are
  known (``(B, H, Q, K)`` per layer, a batch's worth), then takes the same product.
* **Float64 sums** of the float32 pattern: the same values as summing the whole stack in float64, up to the
  order of the additions.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from headlens.detectors.base import Detector, predicate_mask
from headlens.probes.base import ProbeBatch

Late = Callable[[Any, ProbeBatch, torch.Tensor], dict[str, torch.Tensor]]  # (logits, batch, cells) -> rule targets


def heldout_stats(model: Any, windows: list[torch.Tensor], rules: dict[str, Detector], late: Late | None = None,
                  batch_size: int = 8) -> dict[str, torch.Tensor]:
    """Per held-out window and head, the sums the descriptions need (each ``(W, L, H, ...)`` float64):
    ``rest`` (off-rest mass, first-token mass, query rows) and per rule ``corr:<name>`` (n, sx, sy, sxx, syy,
    sxy of real vs predicted off-rest attention) and ``mass:<name>`` (mass on targets, rows with a target,
    chance mass).

    ``rules``: the rules whose predicate reads the window alone; ``late(logits, batch, cells)``: rule name ->
    targets ``(B, Q, K)`` of the rules that need the model's logits ``(B, T, V)`` on the window.
    """
    from headlens.models.vocab import vocab

    special, L = vocab(model).special, model.cfg.n_layers
    out: dict[str, list[torch.Tensor]] = {}
    for start in range(0, len(windows), batch_size):
        batch = _batch(windows[start:start + batch_size], special)
        for key, value in _batch_sums(model, batch, rules, late, L).items():
            out.setdefault(key, []).append(value)
    return {key: torch.cat(vals) for key, vals in out.items()}


def _batch_sums(model: Any, batch: ProbeBatch, rules: dict[str, Detector], late: Late | None, L: int
                ) -> dict[str, torch.Tensor]:
    """One batch's sums ``(B, L, H, ...)``: the early rules summed in each layer's hook, the late ones after."""
    T = batch.tokens.shape[1]
    q, k = torch.arange(T)[:, None], torch.arange(T)[None, :]
    cells = (k >= 1) & (k < q) & batch.valid[:, None, :] & batch.query_ok[:, :, None]  # (B, Q, K) off-rest
    early = {name: predicate_mask(rule.predicate, batch, 0, T, 0, T) & cells for name, rule in rules.items()}
    targets = _targets(early)  # (B, Q*K, 2R)
    per_layer: list[dict[str, torch.Tensor]] = [{} for _ in range(L)]
    kept: list[torch.Tensor] = [torch.empty(0)] * L  # per layer (B, H, Q, K) float32, for the late rules

    def fold(layer: int) -> Any:
        def reduce(pattern: torch.Tensor, hook: Any) -> None:  # (B, H, Q, K)
            p = pattern.detach().cpu()
            x = p * cells[:, None]  # (B, H, Q, K) float32: real off-rest attention
            first = (p[..., 0].double() * batch.query_ok[:, None]).sum(-1)  # (B, H)
            x64 = x.double()
            per_layer[layer]["own"] = torch.stack([x64.sum((-2, -1)), (x64 * x64).sum((-2, -1)), first], -1)
            per_layer[layer]["rows"] = x64.sum(-1)  # (B, H, Q): each row's off-rest attention
            per_layer[layer]["prod"] = _products(x64, targets)  # (B, H, 2R): sxy per rule, then mass on target
            if late is not None:
                kept[layer] = x
        return reduce

    names = [f"blocks.{layer}.attn.hook_pattern" for layer in range(L)]
    with torch.no_grad(), model.hooks([(name, fold(layer)) for layer, name in enumerate(names)]):
        logits = model(batch.tokens.to(model.device))  # (B, T, V): windows are right-padded; pads are never a query
    own = torch.stack([s["own"] for s in per_layer], 1)  # (B, L, H, 3): sx, sxx, first-token mass
    rows = torch.stack([s["rows"] for s in per_layer], 1)  # (B, L, H, Q)
    prod = torch.stack([s["prod"] for s in per_layer], 1)  # (B, L, H, 2R): sxy per rule, then mass on target
    sxy, on = prod.chunk(2, -1) if early else (own[..., :0], own[..., :0])  # (B, L, H, R) each
    hits = dict(early)
    if late is not None:
        extra = late(logits, batch, cells)  # rule -> (B, Q, K)
        del logits
        more = _targets(extra)  # (B, Q*K, 2R')
        prod = torch.stack([_products(kept[layer].double(), more) for layer in range(L)], 1)  # (B, L, H, 2R')
        sxy, on = (torch.cat([a, b], -1) for a, b in zip((sxy, on), prod.chunk(2, -1), strict=True))
        hits.update(extra)
    return _assemble(batch, cells, hits, own, sxy, on, rows)


def _targets(hits: dict[str, torch.Tensor]) -> torch.Tensor:
    """``(B, Q*K, 2R)`` float64: per rule its prediction ``y`` (each row's mass spread evenly over its targets),
    then per rule its targets as 0/1."""
    if not hits:
        return torch.zeros(0)
    hit = torch.stack(list(hits.values()), -1).double()  # (B, Q, K, R)
    y = hit / hit.sum(-2, keepdim=True).clamp(min=1)  # (B, Q, K, R): the rule's predicted off-rest attention
    B, Q, K, R = hit.shape
    return torch.cat([y, hit], -1).reshape(B, Q * K, 2 * R)  # (B, Q*K, 2R)


def _products(x: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """``(B, H, 2R)``: the off-rest pattern ``x`` ``(B, H, Q, K)`` float64 summed against each column of ``targets``."""
    if targets.numel() == 0:
        return x.new_zeros(*x.shape[:2], 0)
    B, H, Q, K = x.shape
    return torch.bmm(x.reshape(B, H, Q * K), targets)  # (B, H, Q*K) @ (B, Q*K, 2R)


def _assemble(batch: ProbeBatch, cells: torch.Tensor, hits: dict[str, torch.Tensor], own: torch.Tensor,
              sxy: torch.Tensor, on: torch.Tensor, rows: torch.Tensor) -> dict[str, torch.Tensor]:
    """The per-window sums (each ``(B, L, H, ...)``) from the heads' own sums ``own`` ``(B, L, H, 3)``, each
    rule's ``sxy`` and mass on target ``on`` ``(B, L, H, R)`` (rules in ``hits`` order), each row's off-rest
    attention ``rows`` ``(B, L, H, Q)`` and the head-independent sums of each rule's targets ``hits[name]``
    ``(B, Q, K)``. ``mass:<name>`` also holds the off-rest attention of the rows with a target, and what
    share of it would land on the targets if each row's were spread evenly over its off-rest keys."""
    B, L, H, _ = own.shape
    grid = (B, L, H)
    per_window = lambda v: v.double()[:, None, None].expand(grid)  # noqa: E731  (B,) -> (B, L, H)
    sx, sxx, first = own.unbind(-1)  # (B, L, H) each
    n = per_window(cells.sum((-2, -1)))
    out = {"rest": torch.stack([sx, first, per_window(batch.query_ok.sum(-1))], -1)}
    q = torch.arange(cells.shape[-1])
    n_off = cells.sum(-1).clamp(min=1)  # (B, Q): off-rest keys per row
    for i, (name, hit) in enumerate(hits.items()):
        n_t = hit.sum(-1)  # (B, Q): targets per row
        y = hit.double() / n_t[..., None].clamp(min=1)  # (B, Q, K): the rule's prediction
        has = (n_t > 0).double()  # (B, Q)
        chance = (n_t / (q + 1)).double() * has  # (B, Q): a uniform row's mass on the targets
        out[f"corr:{name}"] = torch.stack([n, sx, per_window(y.sum((-2, -1))), sxx,
                                           per_window((y * y).sum((-2, -1))), sxy[..., i]], -1)
        even = torch.einsum("blhq,bq->blh", rows, n_t / n_off.double())  # off-rest attention spread evenly: its mass on target
        out[f"mass:{name}"] = torch.stack([on[..., i], per_window(has.sum(-1)), per_window(chance.sum(-1)),
                                           torch.einsum("blhq,bq->blh", rows, has), even], -1)
    return out


def _batch(seqs: list[torch.Tensor], special: frozenset[int]) -> ProbeBatch:
    lengths = torch.tensor([len(s) for s in seqs])
    T = int(lengths.max())
    tokens = torch.zeros(len(seqs), T, dtype=torch.long)
    for b, s in enumerate(seqs):
        tokens[b, : len(s)] = s
    valid = torch.arange(T)[None, :] < lengths[:, None]  # (B, T)
    spec = torch.isin(tokens, torch.tensor(sorted(special), dtype=torch.long)) | ~valid
    return ProbeBatch(tokens, lengths, valid, spec, True)
