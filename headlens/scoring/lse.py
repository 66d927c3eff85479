"""Exact attention mass on target keys without the attention pattern (a ``(B, H, T, T)`` pattern does not fit at long contexts).

For a query row q the attention on key k is ``p(q -> k) = exp(s_qk - LSE_q)``, with ``s_qk`` the
scaled, soft-capped, masked score and ``LSE_q = log sum_k exp(s_qk)`` the row's log-sum-exp (plus
the head's sink logit, for attention-sink models). A
detector's targets are a few keys per row (``(B, Q, M)`` indices), so the scan needs q, k and the
LSE, never the ``(Q, K)`` pattern.

How: the backend says, per layer, which hooks carry q and k (after RoPE) and how its scores are
made (:class:`AttentionSpec`: scale, causal, sliding window, soft-capping, grouped KV heads). The
scan captures q and k from those hooks and calls :func:`target_mass`, which walks the query rows
in blocks: a block's scores ``(B, H, C, K)`` give both the LSE (``logsumexp``, exact) and the
target scores (a ``gather``), then the block is dropped. The block height C is picked so a block
stays under ``budget`` bytes, so memory is O(budget + T·(M + d_head)) per layer, never O(T²);
the work is the same ``q·k`` products the attention itself does. The forward pass itself runs the
backend's fused kernel (``scaled_dot_product_attention``), which never stores the pattern either.

``p`` is formed in float64 from the float32 scores and LSE and summed in float64; it agrees with
the softmax the dense path reads to ~1e-7.

Targets come in two forms (a list stops fitting when every key is a target). :class:`PackedTargets` lists the (query, key) pairs: cheapest
while they are few. :class:`PredicateTargets` keeps the detector's rule over (query, key) instead: each
block's ``p = exp(s - LSE)`` is formed once, the rule's ``(B, C, K)`` mask is made for the same block,
the mass under it is summed (in float64) and both are dropped, so memory stays O(block + T) even when
the pairs number ~T²/100 (duplicate tokens in byte-level code).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import torch

from headlens.detectors.base import Predicate, predicate_mask
from headlens.models.attention import AttentionSpec
from headlens.probes.base import ProbeBatch

BLOCK_BYTES = 16 * 2**20  # the largest scores block the LSE path holds at once


@dataclass
class PackedTargets:
    """One detector's targets on one batch, packed row by row (CSR): O(number of targets) memory.

    Rows are ordered ``(query position, prompt)``, so the rows of a query block are contiguous.
    The entries of row ``(q, b)`` are ``keys[row_ptr[q*B + b] : row_ptr[q*B + b + 1]]``.
    """

    keys: torch.Tensor  # (nnz,) int32 key positions
    row_ptr: torch.Tensor  # (T*B + 1,) long
    B: int
    T: int
    # (b, q, k) long per entry and row_ptr on the host, expanded once on the first entries() call:
    # every layer and query block reads the same targets (no per-block rebuild, no device syncs)
    _expanded: tuple[list[int], torch.Tensor, torch.Tensor, torch.Tensor] | None = field(
        default=None, init=False, repr=False, compare=False)

    @classmethod
    def pack(cls, windows: Iterable[torch.Tensor], B: int, T: int) -> PackedTargets:
        """From ``(B, C, M)`` target windows covering rows ``0 .. T-1`` in order."""
        keys, counts = [], []
        for t in windows:
            tt = t.transpose(0, 1)  # (C, B, M): row order (q, b)
            has = tt >= 0
            counts.append(has.sum(-1).reshape(-1))  # (C*B,)
            keys.append(tt[has].to(torch.int32))
        n = torch.cat(counts)
        if len(n) != T * B:
            raise ValueError(f"target windows cover {len(n) // max(B, 1)} rows, expected {T}")
        row_ptr = torch.zeros(T * B + 1, dtype=torch.long, device=n.device)
        row_ptr[1:] = n.cumsum(0)
        return cls(torch.cat(keys), row_ptr, B, T)

    def counts(self) -> torch.Tensor:
        """``(B, T)`` long: targets per row."""
        return self.row_ptr.diff().view(self.T, self.B).T

    def entries(self, q0: int, q1: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(b, q - q0, k)`` long, one per target of the rows ``q0 .. q1-1``."""
        if self._expanded is None:
            n = self.row_ptr.diff()  # (T*B,) targets per row
            row = torch.repeat_interleave(torch.arange(len(n), device=n.device), n)  # (nnz,): row (q, b) of each entry
            self._expanded = (self.row_ptr.tolist(), row % self.B, row // self.B, self.keys.long())
        ptr, b, q, k = self._expanded
        lo, hi = ptr[q0 * self.B], ptr[q1 * self.B]
        return b[lo:hi], q[lo:hi] - q0, k[lo:hi]


@dataclass
class PredicateTargets:
    """One detector's targets on one batch as its rule over (query, key): a block's mask is made when asked.

    Attributes:
        predicate: the detector's predicate (:mod:`headlens.detectors.base`).
        batch: the batch it is evaluated on.
        n: ``(B, T)`` long targets per row (counted once, block by block).
    """

    predicate: Predicate
    batch: ProbeBatch
    n: torch.Tensor

    def counts(self) -> torch.Tensor:
        """``(B, T)`` long: targets per row."""
        return self.n

    def mask(self, q0: int, q1: int, k0: int, k1: int) -> torch.Tensor:
        """``(B, C, K)`` bool: the targets among rows ``q0 .. q1-1`` and keys ``k0 .. k1-1``."""
        return predicate_mask(self.predicate, self.batch, q0, q1, k0, k1)


Targets = PackedTargets | PredicateTargets


def mass_under(p: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``(B, H)`` float64: the attention ``p`` ``(B, H, C, K)`` summed where ``mask`` ``(B, C, K)`` holds.

    Each row is summed in p's dtype (a row's mass is at most 1; torch sums pairwise), the rows in float64:
    as close as an all-float64 sum (~1e-9), at a sixth of its time; a matrix-vector product over the whole
    block would be faster still but drifts by ~1e-5. A row that sees no key at all (NaN) has no mass.
    """
    return (p * mask[:, None]).sum(-1).nan_to_num_(0.0).sum(-1, dtype=torch.float64)  # (B, H, C) -> (B, H)


def gather_heads(x: torch.Tensor, b: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """``x[b, :, q, k]`` for every entry: ``(B, H, C, K)`` -> ``(H, nnz)``."""
    _, H, C, K = x.shape
    base = (b * H * C + q) * K + k  # (nnz,): offset of head 0
    offs = torch.arange(H, device=x.device)[:, None] * (C * K)  # (H, 1)
    flat = (base[None, :] + offs).reshape(-1)  # (H*nnz,)
    return x.contiguous().view(-1).index_select(0, flat).view(H, -1)  # (H, nnz)


def add_by_prompt(out: torch.Tensor, values: torch.Tensor, b: torch.Tensor, d: int) -> None:
    """``out[b, :, d] += values[:, entry]`` summed per prompt: out ``(B, H, D)``, values ``(H, nnz)``."""
    if out.shape[0] == 1:
        out[0, :, d] += values.sum(1, dtype=out.dtype)
        return
    acc = torch.zeros(out.shape[1], out.shape[0], dtype=out.dtype, device=out.device)  # (H, B)
    acc.index_add_(1, b, values.to(out.dtype))
    out[:, :, d] += acc.T


def heads_first(x: torch.Tensor, layout: str) -> torch.Tensor:
    """q or k in the spec's layout -> ``(B, H, T, d)``."""
    return x.transpose(1, 2) if layout == "BTHD" else x


def block_rows(B: int, H: int, K: int, budget: int = BLOCK_BYTES) -> int:
    """How many query rows a block of ``(B, H, C, K)`` float32 scores may hold."""
    return max(1, budget // max(1, 4 * B * H * K))


def expand_kv(k: torch.Tensor, n_heads: int) -> torch.Tensor:
    """``(B, H_kv, T, d)`` keys -> ``(B, H, T, d)``: under grouped-query attention each KV head serves
    ``H / H_kv`` query heads in a row."""
    return k if k.shape[1] == n_heads else k.repeat_interleave(n_heads // k.shape[1], dim=1)


def scores(q: torch.Tensor, k: torch.Tensor, spec: AttentionSpec) -> torch.Tensor:
    """``(..., Q, d) @ (..., K, d)^T`` scaled as the layer scales (default ``1/sqrt(d)``), soft-capped when it is."""
    scale = spec.scale if spec.scale is not None else 1.0 / math.sqrt(q.shape[-1])
    s = (q @ k.transpose(-2, -1)) * scale
    if spec.softcap is not None:
        s = spec.softcap * torch.tanh(s / spec.softcap)
    return s


def out_of_view(gap: torch.Tensor, spec: AttentionSpec) -> torch.Tensor:
    """Bool, True where a key ``gap = q - k`` positions back is hidden from the query: a future key
    (causal) or one past the sliding window; any shape."""
    hidden = torch.zeros_like(gap, dtype=torch.bool)
    if spec.causal:
        hidden |= gap < 0
    if spec.window is not None:
        hidden |= gap >= spec.window
    return hidden


def target_mass(q: torch.Tensor, k: torch.Tensor, spec: AttentionSpec, targets: Sequence[Targets],
                key_valid: torch.Tensor | None, budget: int = BLOCK_BYTES) -> torch.Tensor:
    """Attention mass of every head on every detector's targets, summed over query rows.

    Args:
        q: ``(B, H, T, d)`` queries; k: ``(B, H_kv, T, d)`` keys (``H_kv`` divides ``H``: GQA).
        spec: how the scores are made.
        targets: one :class:`PackedTargets` or :class:`PredicateTargets` per detector.
        key_valid: ``(B, T)`` bool, False at keys the model masks out (padding); None: all real.
        budget: bytes a block of scores may take.

    Returns:
        ``(B, H, D)`` float64: ``sum_q sum_{k in T_d(q)} p(q -> k)`` per prompt, head, detector.
    """
    B, H, T, _ = q.shape
    if q.dtype in (torch.float16, torch.bfloat16):  # a half-precision model: scores and LSE in float32
        q, k = q.float(), k.float()
    k = expand_kv(k, H)  # (B, H, T, d)
    out = torch.zeros(B, H, len(targets), dtype=torch.float64, device=q.device)
    sinks = _sink_logits(spec, q.device)
    rows = block_rows(B, H, T, budget)
    keys = torch.arange(T, device=q.device)
    for q0 in reversed(range(0, T, rows)):  # last rows first: causal blocks shrink, each fits the freed one's place
        q1 = min(T, q0 + rows)
        kend = q1 if spec.causal else T  # a causal block sees no key past its last row
        kbeg = 0 if spec.window is None else max(0, q0 - spec.window + 1)  # keys before it: outside every row's window
        s = scores(q[:, :, q0:q1], k[:, :, kbeg:kend], spec)  # (B, H, C, K'): keys kbeg .. kend-1
        k0 = q0 if spec.causal and spec.window is None and key_valid is None else kbeg  # keys < k0: all visible
        gap = torch.arange(q0, q1, device=q.device)[:, None] - keys[None, k0:kend]  # (C, kend-k0): q - k
        hidden = out_of_view(gap, spec)[None, None]  # (1, 1, C, kend-k0)
        if key_valid is not None:
            hidden = hidden | ~key_valid[:, None, None, k0:kend]  # (B, 1, C, kend-k0)
        s[..., k0 - kbeg:].masked_fill_(hidden, float("-inf"))
        lse = _with_sinks(torch.logsumexp(s, dim=-1, keepdim=True), sinks)  # (B, H, C, 1)
        for i, tg in enumerate(targets):
            if isinstance(tg, PredicateTargets):
                continue
            b, qr, kk = tg.entries(q0, q1)
            if kbeg:  # targets before the window get no attention
                seen = kk >= kbeg
                b, qr, kk = b[seen], qr[seen], kk[seen]
            if not len(kk):
                continue
            g = gather_heads(s, b, qr, kk - kbeg).double()  # (H, nnz): the target scores
            p = torch.exp(g - gather_heads(lse, b, qr, torch.zeros_like(kk)).double())  # (H, nnz)
            add_by_prompt(out, p.nan_to_num(0.0), b, i)
        rules = [(i, tg) for i, tg in enumerate(targets) if isinstance(tg, PredicateTargets)]
        if rules:
            p = s.sub_(lse).exp_()  # (B, H, C, K'): the block's attention, in place (its scores are read)
            for i, tg in rules:
                out[:, :, i] += mass_under(p, tg.mask(q0, q1, kbeg, kend))
        del s
    return out


def implied_pattern(q: torch.Tensor, k: torch.Tensor, spec: AttentionSpec,
                    key_valid: torch.Tensor | None = None) -> torch.Tensor:
    """The ``(B, H, Q, K)`` pattern a spec implies, built the O(T²) way: a reference for tests and
    for checking a backend's :class:`AttentionSpec` against its real attention."""
    _, H, T, _ = q.shape
    s = scores(q, expand_kv(k, H), spec)  # (B, H, Q, K)
    gap = torch.arange(T, device=q.device)[:, None] - torch.arange(T, device=q.device)[None, :]  # (Q, K)
    hidden = out_of_view(gap, spec)
    hidden = hidden[None, None] if key_valid is None else hidden[None, None] | ~key_valid[:, None, None, :]
    s = s.masked_fill(hidden, float("-inf"))
    if spec.sinks is None:
        return s.softmax(-1)
    lse = _with_sinks(torch.logsumexp(s, dim=-1, keepdim=True), _sink_logits(spec, s.device))
    return torch.exp(s - lse).to(s.dtype)  # rows sum to < 1


def _sink_logits(spec: AttentionSpec, device: torch.device) -> torch.Tensor | None:
    """Each head's sink logit ``(1, H, 1, 1)`` float64 on ``device``, or None without sinks."""
    if spec.sinks is None:
        return None
    return torch.tensor(spec.sinks, dtype=torch.float64, device=device)[None, :, None, None]  # (1, H, 1, 1)


def _with_sinks(lse: torch.Tensor, sinks: torch.Tensor | None) -> torch.Tensor:
    """A row's ``(B, H, C, 1)`` log-sum-exp over keys, plus each head's sink logit (in float64) when there are sinks."""
    if sinks is None:
        return lse
    return torch.logaddexp(lse.double(), sinks)  # float64 (B, H, C, 1): no second float32 rounding
