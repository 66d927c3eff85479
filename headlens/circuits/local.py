"""Receiver-local effects: how much an edge changes the receiver head's own detector score.

When the question is "what makes L1H1 an induction head" rather than "what does the circuit do for the
loss", nothing downstream of the receiver matters: an edge into its q or k changes only its attention
pattern. The effect is the change of the receiver's induction score (attention mass from each query of
the repeated half of ``BOS + r + r`` on the token after the query token's earlier copy) when the edge is
patched, per prompt. Native models only: the receiver's q and k are recomputed from the cached
residual stream for a batch of edges at once, and no later layer runs. v edges do not move the pattern
(their effect here is 0 by construction) and are refused.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from headlens.circuits.native import _head_proj
from headlens.circuits.nodes import INPUTS, CircuitError, Edge
from headlens.interventions.metrics import Task
from headlens.models.gpt import GPT


def induction_targets(task: Task) -> torch.Tensor:
    """``(B, T)`` key index each query of the repeated half should attend to (``t - L + 1``), else -1."""
    B, T = task.tokens.shape
    L = (T - 1) // 2
    t = torch.arange(T, device=task.tokens.device)
    target = torch.where((t > L) & (t <= 2 * L), t - L + 1, -1)  # the copy of the token after t's twin
    return target.expand(B, T)


def _induction_mass(pattern: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """``(N, B)`` mean mass on the targets; ``pattern`` ``(N, B, T, T)``, ``target`` ``(B, T)``."""
    valid = target >= 0  # (B, T)
    mass = pattern.gather(-1, target.clamp_min(0)[None, :, :, None].expand(pattern.shape[0], -1, -1, 1))[..., 0]
    return (mass * valid).sum(-1) / valid.sum(-1).clamp_min(1)  # (N, B)


def receiver_effects(model: Any, task: Task, edges: Sequence[Edge], deltas: Any,
                     max_tokens: int = 8192) -> tuple[np.ndarray, dict[Edge, np.ndarray]]:
    """Clean induction score of each receiver per prompt, and each edge's patched score ``(B,)``.

    Returns:
        ``(clean, values)``: ``clean`` ``(n_layers, n_heads, B)``; ``values[edge]`` ``(B,)``.
    """
    if not isinstance(model, GPT):
        raise CircuitError("receiver-local effects need a native headlens model (the bridge recomputes everything)")
    if any(e.input == "v" or e.receiver.kind != "head" for e in edges):
        raise CircuitError("receiver-local effects are about the receiver's pattern: q and k edges into heads only")
    layers = sorted({e.receiver.layer for e in edges})
    names = [f"blocks.{layer}.hook_resid_pre" for layer in layers]
    with torch.no_grad():
        _, cache = model.run_with_cache(task.tokens, names_filter=names)
        target = induction_targets(task)
        B, T = task.tokens.shape
        H, d = model.cfg.n_heads, model.cfg.d_head
        clean = np.zeros((model.cfg.n_layers, H, B))
        values: dict[Edge, np.ndarray] = {}
        causal = torch.ones(T, T, dtype=torch.bool, device=task.tokens.device).tril()  # (Q, K)
        for layer in layers:
            block = model.transformer.h[layer]
            pre = cache[f"blocks.{layer}.hook_resid_pre"]  # (B, T, D)
            qk = block.attn.c_attn(block.ln_1(pre)).view(B, T, 3, H, d)[:, :, :2]  # (B, T, qk, H, d_head)
            base = torch.einsum("bqhd,bkhd->hbqk", qk[:, :, 0], qk[:, :, 1]) / d**0.5  # (H, B, Q, K)
            clean[layer] = _induction_mass(F.softmax(base.masked_fill(~causal, float("-inf")), -1), target).cpu().numpy()
            mine = [e for e in edges if e.receiver.layer == layer]
            per = max(1, max_tokens // (B * T))
            for i in range(0, len(mine), per):
                chunk = mine[i:i + per]
                heads = torch.tensor([e.receiver.head for e in chunk])
                which = torch.tensor([INPUTS.index(e.input) for e in chunk])
                dl = torch.stack([deltas.delta(e.sender) for e in chunk])  # (K, B, T, D)
                patched = _head_proj(block, block.ln_1(pre[None] + dl), which, heads)  # (K, B, T, d_head)
                q = torch.where((which == 0)[:, None, None, None], patched, qk[:, :, 0, heads].permute(2, 0, 1, 3))
                k = torch.where((which == 1)[:, None, None, None], patched, qk[:, :, 1, heads].permute(2, 0, 1, 3))
                scores = (q @ k.transpose(-1, -2)) / d**0.5  # (K, B, Q, K)
                mass = _induction_mass(F.softmax(scores.masked_fill(~causal, float("-inf")), -1), target)  # (K, B)
                for e, m in zip(chunk, mass.cpu().numpy(), strict=True):
                    values[e] = m
    return clean, values
