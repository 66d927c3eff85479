"""Receiver patterns on Hugging Face models (the fast path of :mod:`~headlens.circuits.local`), and the
full-forward references on every backend.

The fast path calls the receiver's own block on the clean residual stream recorded by
:class:`~headlens.circuits.recorded.CleanRun`, ``K`` copies of the batch at once, with each copy's receiver
q or k replaced by the projection of ``LN(resid + delta)`` (:func:`~headlens.circuits.resume.input_hooks`:
the block's own input norm and the head's rows; then the family's own rotary embedding, q/k norms,
soft-cap and window), and stops at the layer's ``hook_pattern``. The clean pattern comes from the same call
without a delta, so clean and patched share their numerics.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from headlens.circuits.bridge import forks
from headlens.circuits.nodes import Edge, kv_head
from headlens.circuits.recorded import StopBlock
from headlens.interventions.metrics import Task


def _grab(seen: dict[str, torch.Tensor]) -> Any:
    def hook(p: torch.Tensor, hook: Any) -> None:  # (N, H, Q, K)
        seen["p"] = p
        raise StopBlock  # at the receiver layer's pattern: nothing after it is needed

    return hook


def _block_pattern(model: Any, run: Any, layer: int, hooks: list, x: torch.Tensor, B: int, K: int) -> torch.Tensor:
    """``(K*B, H, Q, K)``: block ``layer``'s pattern on ``x`` under ``hooks`` (the block stops there)."""
    seen: dict[str, torch.Tensor] = {}
    try:
        with model.hooks([*hooks, (f"blocks.{layer}.attn.hook_pattern", _grab(seen))]):
            run.block(model, layer, x, K)
    except StopBlock:
        pass
    return seen["p"]


def clean_pattern(model: Any, run: Any, layer: int) -> torch.Tensor:
    """``(B, H, Q, K)`` the clean pattern of ``layer`` through the fast path's own call."""
    x = run.calls[layer][0][0]  # (B, T, D)
    return _block_pattern(model, run, layer, [], x, x.shape[0], 1)


def bridge_patterns(model: Any, run: Any, chunk: Sequence[Edge], d: torch.Tensor) -> torch.Tensor:
    """``(K, B, Q, K)``: each edge's receiver pattern, ``d`` ``(K, B, T, D)`` the (masked) sender deltas."""
    from headlens.circuits.resume import input_hooks

    K, B = d.shape[:2]
    layer = chunk[0].receiver.layer
    resid = run.calls[layer][0][0]  # (B, T, D): the clean residual stream entering the block
    p = _block_pattern(model, run, layer, input_hooks(model, chunk, d, resid), resid.repeat(K, 1, 1), B, K)
    p = p.view(K, B, *p.shape[1:])  # (K, B, H, Q, K)
    heads = torch.tensor([e.receiver.head for e in chunk], device=p.device)
    return p[torch.arange(K, device=p.device), :, heads]  # (K, B, Q, K)


def naive_pattern(model: Any, task: Task, edge: Edge, delta: torch.Tensor) -> torch.Tensor:
    """``(B, Q, K)``: the receiver's pattern in one full forward with ``edge`` patched (the reference)."""
    seen: dict[str, torch.Tensor] = {}
    r = edge.receiver

    def keep(p: torch.Tensor, hook: Any) -> None:  # (B, H, Q, K)
        seen.setdefault("p", p)

    name = f"blocks.{r.layer}.attn.hook_pattern"
    if not hasattr(model, "bridge"):
        from headlens.circuits.native import naive_logits

        with torch.no_grad(), model.hooks([(name, keep)]):
            naive_logits(model, task, edge, delta)
        return seen["p"][:, r.head]
    idx = r.head if edge.input == "q" else kv_head(model, r.head)

    def add(x: torch.Tensor, hook: Any) -> torch.Tensor:  # (B, T, n_copies, D): per-head pre-norm copies
        out = x.clone()
        out[:, :, idx] = out[:, :, idx] + delta.to(x)
        return out

    kwargs = {} if task.attention_mask is None else {"attention_mask": task.attention_mask}
    with torch.no_grad(), forks(model), model.hooks([(f"blocks.{r.layer}.attn.hook_{edge.input}_input", add),
                                                     (name, keep)]):
        model(task.tokens, **kwargs)
    return seen["p"][:, r.head]
