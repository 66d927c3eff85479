"""Exact attention mass on target keys without the attention pattern (issue 13).

For a query row q the attention on key k is ``p(q -> k) = exp(s_qk - LSE_q)``, with ``s_qk`` the
scaled, soft-capped, masked score and ``LSE_q = log sum_k exp(s_qk)`` the row's log-sum-exp. A
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
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

BLOCK_BYTES = 64 * 2**20  # the largest scores block the LSE path holds at once


@dataclass(frozen=True)
class AttentionSpec:
    """How one layer's attention scores are made, as the LSE scan needs to redo them.

    Attributes:
        q_hook, k_hook: hook names carrying q and k (after any rotary embedding).
        layout: ``"BTHD"`` (native hooks, ``(B, T, H, d)``) or ``"BHTD"`` (``(B, H, T, d)``).
        scale: multiplies ``q·k`` (``1/sqrt(d_head)`` unless the model says otherwise).
        causal: keys ``k <= q`` only.
        window: sliding window: key k is visible from q only when ``q - k < window``; None: all.
        softcap: Gemma-2 style ``cap * tanh(s / cap)`` on the scaled scores; None: none.
    """

    q_hook: str
    k_hook: str
    layout: str = "BTHD"
    scale: float | None = None
    causal: bool = True
    window: int | None = None
    softcap: float | None = None


def heads_first(x: torch.Tensor, layout: str) -> torch.Tensor:
    """q or k in the spec's layout -> ``(B, H, T, d)``."""
    return x.transpose(1, 2) if layout == "BTHD" else x


def block_rows(B: int, H: int, K: int, M: int, budget: int = BLOCK_BYTES) -> int:
    """How many query rows a block may hold: scores ``(B, H, C, K)`` float32 plus ``(B, H, C, M)`` float64."""
    return max(1, budget // max(1, B * H * (4 * K + 16 * M)))


def target_mass(q: torch.Tensor, k: torch.Tensor, spec: AttentionSpec, targets: torch.Tensor,
                key_valid: torch.Tensor | None, budget: int = BLOCK_BYTES) -> torch.Tensor:
    """Attention mass of every head on every target column, summed over query rows.

    Args:
        q: ``(B, H, T, d)`` queries; k: ``(B, H_kv, T, d)`` keys (``H_kv`` divides ``H``: GQA).
        spec: how the scores are made.
        targets: ``(B, Q, M)`` long key indices, ``-1`` = none.
        key_valid: ``(B, T)`` bool, False at keys the model masks out (padding); None: all real.
        budget: bytes a block of scores may take.

    Returns:
        ``(B, H, M)`` float64: ``sum_q p(q -> targets[b, q, m])`` for every column m.
    """
    B, H, T, d = q.shape
    if k.shape[1] != H:  # grouped-query attention: each KV head serves H / H_kv query heads
        k = k.repeat_interleave(H // k.shape[1], dim=1)  # (B, H, T, d)
    M = targets.shape[2]
    scale = spec.scale if spec.scale is not None else 1.0 / math.sqrt(d)
    has = targets >= 0  # (B, Q, M)
    out = torch.zeros(B, H, M, dtype=torch.float64, device=q.device)
    rows = block_rows(B, H, T, M, budget)
    keys = torch.arange(T, device=q.device)
    for q0 in range(0, T, rows):
        q1 = min(T, q0 + rows)
        kend = q1 if spec.causal else T  # a causal block sees no key past its last row
        s = (q[:, :, q0:q1] @ k[:, :, :kend].transpose(-2, -1)) * scale  # (B, H, C, K')
        if spec.softcap is not None:
            s = spec.softcap * torch.tanh(s / spec.softcap)
        gap = torch.arange(q0, q1, device=q.device)[:, None] - keys[None, :kend]  # (C, K'): q - k
        hidden = torch.zeros_like(gap, dtype=torch.bool)
        if spec.causal:
            hidden |= gap < 0
        if spec.window is not None:
            hidden |= gap >= spec.window
        hidden = hidden[None, None]  # (1, 1, C, K')
        if key_valid is not None:
            hidden = hidden | ~key_valid[:, None, None, :kend]  # (B, 1, C, K')
        s = s.masked_fill(hidden, float("-inf"))
        lse = torch.logsumexp(s, dim=-1, keepdim=True)  # (B, H, C, 1)
        tg = targets[:, None, q0:q1].clamp(0, kend - 1).expand(B, H, -1, -1)  # (B, H, C, M)
        g = s.gather(3, tg)  # (B, H, C, M): the target scores
        del s
        p = torch.exp(g.double() - lse.double())  # (B, H, C, M)
        p = torch.where(has[:, None, q0:q1], p, torch.zeros((), dtype=p.dtype, device=p.device))
        out += p.nan_to_num(0.0).sum(2)
    return out
