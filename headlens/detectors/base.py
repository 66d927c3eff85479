"""What a detector is: a pure function from a probe batch to its target positions, or a rule over (query, key).

**The target format** (one for every scan path, dense or sparse): every pattern detector returns ``(B, Q, M)`` long key indices,
``targets[b, q, m]`` = a key position that query row q of prompt b attends to *on target*, with
``-1`` meaning "no target" (padding; it may sit anywhere in a row, not only at the end). ``M`` is
the most targets any row of the batch has: 1 for the one-target detectors (previous/next/current/
first token, bracket matching), a few to a few thousand for set detectors (duplicate token,
induction) on long text. A row counts exactly when it has at least one target; a key appears at
most once per row. This is what lets the scan score a head from the scores ``s_qk`` at the target
keys and the row's log-sum-exp, without ever building the ``(Q, K)`` pattern (``headlens.scoring.lse``).

``kind`` says how the detector is scored:

* ``"index"``: at most one target per row (``M == 1``);
* ``"mask"``: a set of targets per row (any ``M``);
* ``"weights"``: no probe at all; a score per head from the model's weights (ov_copying, ov_suppression,
  successor heads). ``weights_fn`` returns :class:`WeightCounts` (hits over trials per head, with a chance
  rate and a null, from which :mod:`headlens.scoring.weights` forms the score, its interval and the label),
  or a plain ``(n_layers, n_heads)`` score tensor (no interval: labelled on the score alone).
* ``"annotated"``: targets given as character spans of the probe's texts (coreference, and
  the user's own head types from annotated prompts); scored by :mod:`headlens.scoring.annotated`.
* ``"top1"``: at most one target per row, scored by whether the row's *largest* attention weight
  falls on a target (retrieval heads), by :mod:`headlens.scoring.top1` rather than the mass scan.

The old forms are still accepted from user-written target functions and converted by
:func:`as_targets`: ``(B, Q)`` long (one index per row) and ``(B, Q, K)`` bool masks.

Detectors with settings (``streaming``: s sinks and a window of w) carry ``params`` and a
``factory`` that builds a variant: ``get_detector("streaming(s=8,w=128)")``.

Every target function already drops the rows a detector must not count (pads, special
tokens, rows outside the definition).

**A gate on what the head writes** (the name movers). Some head types are defined by their pattern *and* by
what they write: a name mover attends from END to IO *and* its direct logit attribution to ``IO - S``
is positive. Such a detector is an ordinary pattern detector (its score, CI, baseline and lift are the
attention mass on its targets) with a :class:`Gate`: a per-prompt statistic of each head on the same
probe (``(P, L, H)`` float64) whose bootstrap CI must clear zero on the gate's side for the label; the
scores table carries it in the gate's columns (``dla``, ``dla_ci_low``, ``dla_ci_high``).

**Targets as a predicate** (for targets too many to list at long contexts). A detector may instead (or as well) give ``predicate``:
``(batch, q, k) -> bool``, with ``q`` the ``(C, 1)`` and ``k`` the ``(1, K)`` long positions of a block of
query rows and keys; the result broadcasts to ``(B, C, K)``. ``previous_token`` is ``k == q - 1``,
``duplicate_token`` is ``tok[k] == tok[q]`` for an earlier ordinary k. Whatever it returns is then
limited as :func:`finish_targets` limits an index list (countable rows, real keys, ``k <= q`` when causal),
by :func:`predicate_mask`. The scan evaluates it on each query block of scores it already forms and
drops the block, so memory is O(block + T) whatever the number of targets (:mod:`headlens.scoring.scan`
picks, per batch, whichever of the two forms is cheaper). A detector given only a predicate gets
``targets`` built from it (:func:`predicate_targets`), for the code that wants index lists.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from headlens.probes.base import ProbeBatch

TargetFn = Callable[[ProbeBatch], torch.Tensor]
Predicate = Callable[[ProbeBatch, torch.Tensor, torch.Tensor], torch.Tensor]  # (batch, q (C, 1), k (1, K)) -> (B, C, K)
PREDICATE_BYTES = 16 * 2**20  # a (B, C, K) block of a predicate evaluated at once (int64 intermediates)


@dataclass(frozen=True)
class Gate:
    """A second condition on a pattern detector's label, from what each head writes (module docstring).

    Attributes:
        name: the column prefix in the scores table (``dla``: ``dla``, ``dla_ci_low``, ``dla_ci_high``).
        values: ``(model, probe, cache) -> (P, L, H)`` float64: the statistic per prompt of the probe and
            head; ``cache`` is a dict shared by the gates of one run, for measurements two gates both need.
        sign: +1: the label needs the CI above zero (``ci_low > 0``); -1: below zero (``ci_high < 0``).
        description: what the statistic is, in one line.
    """

    name: str
    values: Callable[[Any, Any, dict], torch.Tensor]
    sign: int
    description: str


@dataclass(frozen=True)
class WeightCounts:
    """What a weight detector measured, per head, as counts (the statistics are :mod:`headlens.scoring.weights`').

    Attributes:
        hits: ``(n_layers, n_heads)`` float64: trials the head passes (source tokens it copies, list items
            it maps to their successor ...).
        trials: trials per head (the same for every head).
        chance: the rate a head without the mechanism would have (``k / d_vocab``, ``1 / (n - 1)``): the
            table's ``baseline``.
        null_hits: ``(n_layers, n_heads)`` float64: the same count under the detector's null (a label needs
            the score's interval above the null's), or None.
        columns: extra per-head ``(n_layers, n_heads)`` values, each a column of this detector's rows.
        attrs: details for the table's provenance (``attrs["weights"][name]``): samples, lists, the null.
    """

    hits: torch.Tensor
    trials: int
    chance: float
    null_hits: torch.Tensor | None = None
    columns: Mapping[str, torch.Tensor] = field(default_factory=dict)
    attrs: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Detector:
    """One head type.

    Attributes:
        name: registry key, also the ``detector`` column of the scores table.
        kind: ``"index"``, ``"mask"``, ``"weights"``, ``"annotated"`` or ``"top1"`` (see the module docstring).
        targets: ``ProbeBatch -> (B, Q, M)`` long key indices, ``-1`` padded; None for weight and
            annotated kinds (given None with a ``predicate``, built from the rule).
        probe: the generated probe that exercises it (``None`` for weight scores).
        description: one line for ``--help`` and the dashboard.
        bidirectional_only: True when the target lies to the right of the query.
        weights_fn: ``model ->`` :class:`WeightCounts` (or ``(n_layers, n_heads)`` float64 scores), for
            ``kind == "weights"``.
        params: the settings this instance was built with (recorded in the provenance).
        factory: ``**params -> Detector``, for detectors with settings (None otherwise).
        default: False for a detector scored only when asked for by name (``retrieval``: its long
            needle probe, and a top-1 lift on another scale than the mass detectors').
        windowed: True when ``targets`` honours ``batch.rows`` (returns ``(B, r1 - r0, M)``), so the
            scan can ask for a window of rows at a time: set detectors whose rows grow with T
            (duplicate token, induction) stay O(window x M) in memory at long context.
        predicate: ``(batch, q (C, 1), k (1, K)) -> (B, C, K)`` bool, the same targets as a rule (module
            docstring); with ``targets=None`` the index lists are built from it.
        gate: a :class:`Gate` on what the head writes, which the label also needs (name movers), or None.
        threshold: this detector's default cut-off (None: the default of its kind: κ = 0.4 on the strength
            scale for a pattern detector, :func:`headlens.scoring.stats.strength_label`; τ on the score for a
            weight detector).

    >>> two_back = Detector("two_back", "mask", None, "random_tokens", "attends two tokens back",
    ...                     predicate=lambda batch, q, k: k == q - 2)
    >>> t = torch.tensor([[9, 1, 2, 3]]); v = torch.ones(1, 4, dtype=torch.bool)
    >>> two_back.targets(ProbeBatch(t, torch.tensor([4]), v, t == 9, causal=True))[0, :, 0].tolist()
    [-1, -1, 0, 1]
    """

    name: str
    kind: Literal["index", "mask", "weights", "annotated", "top1"]
    targets: TargetFn | None
    probe: str | None
    description: str
    bidirectional_only: bool = False
    weights_fn: Callable[[Any], WeightCounts | torch.Tensor] | None = None
    params: Mapping[str, Any] = field(default_factory=dict)
    factory: Callable[..., Detector] | None = None
    windowed: bool = False
    default: bool = True
    predicate: Predicate | None = None
    gate: Gate | None = None
    threshold: float | None = None

    def __post_init__(self) -> None:
        if self.targets is None and self.predicate is not None:  # index lists from the rule, row window by window
            object.__setattr__(self, "targets", functools.partial(predicate_targets, self.predicate))
            object.__setattr__(self, "windowed", True)


def as_targets(t: torch.Tensor, batch: ProbeBatch) -> torch.Tensor:
    """Any accepted target form -> ``(B, Q, M)`` long, ``-1`` padded.

    ``(B, Q, M)`` long passes through; ``(B, Q)`` long becomes ``M = 1``; a ``(B, Q, K)`` bool
    mask (the pre-issue-13 form, still accepted from user detectors) is converted.
    """
    B, T = batch.tokens.shape
    if t.dtype == torch.bool:
        if t.shape != (B, T, T):
            raise ValueError(f"a mask target must be (B, Q, K) = {(B, T, T)}, got {tuple(t.shape)}")
        return mask_to_targets(t)
    if t.ndim == 2:
        t = t[:, :, None]  # (B, Q, 1)
    if t.ndim != 3 or t.shape[:2] != (B, T):
        raise ValueError(f"targets must be (B, Q, M) with (B, Q) = {(B, T)}, got {tuple(t.shape)}")
    return t.long()


def mask_to_targets(mask: torch.Tensor) -> torch.Tensor:
    """``(B, Q, K)`` bool -> ``(B, Q, M)`` key indices, ``-1`` padded, M = the largest row."""
    M = max(int(mask.sum(-1).max()) if mask.numel() else 0, 1)
    K = mask.shape[-1]
    keys = torch.arange(K, device=mask.device).expand_as(mask)  # (B, Q, K)
    ranked = torch.where(mask, keys, torch.full_like(keys, K))  # targets first, then K sentinels
    idx = ranked.topk(M, dim=-1, largest=False).values  # (B, Q, M), ascending
    return torch.where(idx < K, idx, torch.full_like(idx, -1))


def targets_to_mask(idx: torch.Tensor, K: int) -> torch.Tensor:
    """``(B, Q, M)`` key indices -> ``(B, Q, K)`` bool (tests and small references only: O(T^2))."""
    B, Q, _ = idx.shape
    out = torch.zeros(B, Q, K + 1, dtype=torch.bool, device=idx.device)
    out.scatter_(2, torch.where(idx >= 0, idx, torch.full_like(idx, K)), True)
    return out[:, :, :K]


def finish_targets(idx: torch.Tensor, batch: ProbeBatch) -> torch.Tensor:
    """``(B, Q, M)``: set ``-1`` where the row must not count or the key is not a visible real key.

    ``Q`` is the batch's row window (``batch.row_range``) when ``idx`` has that many rows.
    """
    T = batch.tokens.shape[1]
    r0, r1 = batch.row_range if idx.shape[1] != T else (0, T)
    q = torch.arange(r0, r1, device=idx.device)[None, :, None]  # (1, Q, 1)
    ok = batch.query_ok[:, r0:r1, None] & (idx >= 0) & (idx < batch.lengths[:, None, None])
    if batch.causal:
        ok &= idx <= q
    return torch.where(ok, idx, torch.full_like(idx, -1))


def finish_index(idx: torch.Tensor, batch: ProbeBatch) -> torch.Tensor:
    """``(B, Q)`` one candidate key per row -> ``(B, Q, 1)`` targets (see :func:`finish_targets`)."""
    return finish_targets(idx[:, :, None], batch)


def finish_mask(mask: torch.Tensor, batch: ProbeBatch) -> torch.Tensor:
    """``(B, Q, K)`` bool -> ``(B, Q, M)`` targets: only real query rows (non-special) and real, visible keys.

    Builds the ``(Q, K)`` mask: fine for short prompts; long-context detectors build indices directly.
    """
    mask = mask & batch.query_ok[:, :, None] & batch.valid[:, None, :]  # (B, Q, K)
    if batch.causal:
        mask &= lower(mask.shape[-1], mask.device)[None]
    return mask_to_targets(mask)


def same_token_targets(keys: torch.Tensor, queries: torch.Tensor, key_ok: torch.Tensor, batch: ProbeBatch,
                       max_key_offset: int | None) -> torch.Tensor:
    """``(B, Q, M)``: for each countable row q, the positions j with ``keys[j] == queries[q]``.

    Args:
        keys, queries: ``(B, T)`` long values to match (token ids, or shifted ids).
        key_ok: ``(B, T)`` bool, the positions that may be a match.
        max_key_offset: keep ``j <= q + max_key_offset`` (``-1``: strictly earlier); None: any
            ``j != q``.

    Never builds the ``(Q, K)`` comparison: per prompt, the key positions are sorted by
    ``(value, position)`` and each row reads the run of its value, so memory is O(T + Q·M) for
    the ``Q`` rows of ``batch.row_range``.
    """
    B, T = keys.shape
    r0, r1 = batch.row_range
    dev = keys.device
    rows = torch.arange(r0, r1, device=dev)  # (Q,)
    out = []
    for b in range(B):
        pos = torch.nonzero(key_ok[b]).reshape(-1)  # (N,) candidate key positions, ascending
        code = keys[b, pos] * (T + 1) + pos  # (N,) sort key: value, then position
        code, order = code.sort()
        spos = pos[order]  # (N,) key positions grouped by value
        qv = queries[b, r0:r1] * (T + 1)  # (Q,)
        lo = torch.searchsorted(code, qv)  # (Q,) start of the row's value group
        if max_key_offset is None:
            hi = torch.searchsorted(code, qv + T + 1)  # (Q,) end of the group (self removed below)
        else:
            last = rows + max_key_offset  # (Q,) the largest allowed j
            hi = torch.searchsorted(code, qv + last.clamp_min(-1), right=True)
            hi = torch.maximum(hi, lo)
        n = hi - lo  # (Q,)
        M = max(int(n.max()) if len(n) else 0, 1)
        slot = lo[:, None] + torch.arange(M, device=dev)[None, :]  # (Q, M)
        ok = torch.arange(M, device=dev)[None, :] < n[:, None]
        j = spos[slot.clamp_max(max(len(spos) - 1, 0))] if len(spos) else torch.zeros_like(slot)
        j = torch.where(ok, j, torch.full_like(j, -1))  # (Q, M)
        if max_key_offset is None:
            j = torch.where(j == rows[:, None], torch.full_like(j, -1), j)
        out.append(j)
    M = max(o.shape[1] for o in out)
    idx = torch.full((B, r1 - r0, M), -1, dtype=torch.long, device=dev)
    for b, o in enumerate(out):
        idx[b, :, : o.shape[1]] = o
    return finish_targets(idx, batch)


def predicate_mask(pred: Predicate, batch: ProbeBatch, q0: int, q1: int, k0: int, k1: int) -> torch.Tensor:
    """``(B, C, K)`` bool: the predicate on query rows ``q0 .. q1-1`` and keys ``k0 .. k1-1``, limited like
    :func:`finish_targets` (countable rows, real keys, ``k <= q`` in causal models).

    >>> t = torch.tensor([[9, 1, 2, 1]]); v = torch.ones(1, 4, dtype=torch.bool)
    >>> b = ProbeBatch(t, torch.tensor([4]), v, t == 9, causal=True)
    >>> predicate_mask(lambda b, q, k: k <= q, b, 2, 4, 0, 4).int().tolist()  # row 0 (BOS) would not count
    [[[1, 1, 1, 0], [1, 1, 1, 1]]]
    """
    B = batch.tokens.shape[0]
    dev = batch.tokens.device
    q = torch.arange(q0, q1, device=dev)[:, None]  # (C, 1)
    k = torch.arange(k0, k1, device=dev)[None, :]  # (1, K)
    hit = torch.as_tensor(pred(batch, q, k), device=dev).bool()
    if batch.causal:
        hit = hit & (k <= q)  # (C, K), or (B, C, K) when the rule reads tokens
    return (hit & batch.valid[:, None, k0:k1] & batch.query_ok[:, q0:q1, None]).expand(B, q1 - q0, k1 - k0)


def predicate_rows(B: int, T: int, budget: int = PREDICATE_BYTES) -> int:
    """How many query rows of a predicate block ``(B, C, T)`` fit ``budget`` (8 bytes an entry: int64 intermediates)."""
    return max(1, budget // max(1, 8 * B * T))


def predicate_targets(pred: Predicate, batch: ProbeBatch) -> torch.Tensor:
    """``(B, Q, M)`` key indices of the rows ``batch.row_range`` from a predicate, a block of rows at a time."""
    B, T = batch.tokens.shape
    r0, r1 = batch.row_range
    step = predicate_rows(B, T)
    parts = []
    for c0 in range(r0, r1, step):
        c1 = min(r1, c0 + step)
        kend = c1 if batch.causal else T  # a causal block has no target past its last row
        hit = mask_to_targets(predicate_mask(pred, batch, c0, c1, 0, kend))  # (B, C, M_block)
        parts.append(hit)
    if not parts:
        return torch.full((B, 0, 1), -1, dtype=torch.long, device=batch.tokens.device)
    M = max(p.shape[2] for p in parts)
    return torch.cat([torch.nn.functional.pad(p, (0, M - p.shape[2]), value=-1) for p in parts], 1)  # (B, Q, M)


def predicate_counts(pred: Predicate, batch: ProbeBatch) -> torch.Tensor:
    """``(B, T)`` long: how many targets each row has under the predicate, never holding more than one block."""
    B, T = batch.tokens.shape
    step = predicate_rows(B, T)
    # one output up front: a small per-block result kept between the growing masks would pin the allocator's
    # heap below each freed mask, and the process would grow by every block (T^2 / 2 bytes at 32k: 0.5 GB);
    # the last rows first: a causal block's mask shrinks from block to block, so each fits the last one's hole
    out = torch.zeros(B, T, dtype=torch.long, device=batch.tokens.device)
    for c0 in reversed(range(0, T, step)):
        c1 = min(T, c0 + step)
        out[:, c0:c1] = predicate_mask(pred, batch, c0, c1, 0, c1 if batch.causal else T).sum(-1)  # causal: keys <= c1
    return out


def n_targets(idx: torch.Tensor) -> torch.Tensor:
    """``(B, Q)`` long: how many targets each row has."""
    return (idx >= 0).sum(-1)


def lower(T: int, device: torch.device | str = "cpu", diagonal: int = 0) -> torch.Tensor:
    """``(Q, K)`` bool, True where ``k <= q + diagonal`` (``torch.tril`` of ones, without its slow bool path)."""
    i = torch.arange(T, device=device)
    return i[None, :] <= i[:, None] + diagonal


def positions(batch: ProbeBatch) -> torch.Tensor:
    """``(B, T)`` long: each position's index, for offset detectors."""
    B, T = batch.tokens.shape
    return torch.arange(T, device=batch.tokens.device).expand(B, T)
