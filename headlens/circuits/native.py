"""Edge patching on native models: the fast path on cached deltas, and the naive hook-per-edge reference.

Why it looks like this:

* **One clean run, then arithmetic.** The sweep's :class:`~headlens.interventions.sweep.ResumeRunner` caches
  every layer's ``hook_resid_pre`` and ``hook_z``. An edge into head ``h`` of layer ``R`` changes only that
  head's ``z``: its patched input ``LN(resid_pre + delta)`` goes through the head's own rows of ``c_attn``,
  the head attends with its other two inputs clean, and the layer resumes from the clean ``z`` with the
  head's slice replaced. Nothing before layer ``R`` runs again.
* **A batch of edges at once.** ``K`` edges into one receiver layer are ``K`` copies of the batch along a
  new leading axis; each copy carries its own sender's delta, receiver head and input.
* **Logits receivers** are one LayerNorm and unembedding of ``resid_final + delta``.
* **The reference** (:func:`naive_logits`) runs a full hooked forward per edge: ``hook_resid_pre`` is
  observed and the receiver's ``hook_q|k|v`` slice is replaced by the projection of the patched input.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F

from headlens.circuits.nodes import INPUTS, Edge
from headlens.interventions.ablation import Replacement
from headlens.interventions.metrics import Task
from headlens.interventions.sweep import ResumeRunner


def input_rows(cfg: Any, c: str, head: int) -> slice:
    """The rows of ``c_attn`` that make ``head``'s input ``c``: q, k and v blocks of ``n_heads * d_head`` rows."""
    A, d = cfg.d_attn, cfg.d_head
    return slice(INPUTS.index(c) * A + head * d, INPUTS.index(c) * A + (head + 1) * d)


def _head_proj(block: Any, x: torch.Tensor, inputs: torch.Tensor, heads: torch.Tensor) -> torch.Tensor:
    """Per copy ``k``: ``x[k]`` ``(K, B, T, D)`` through head ``heads[k]``'s rows for input ``inputs[k]`` -> ``(K, B, T, d_head)``."""
    attn = block.attn
    H, d = attn.n_heads, attn.d_head
    w = attn.c_attn.weight.view(3, H, d, -1)[inputs, heads]  # (K, d_head, D): rows are q, k, v then heads
    b = attn.c_attn.bias.view(3, H, d)[inputs, heads]  # (K, d_head)
    return torch.einsum("kbtD,kdD->kbtd", x, w) + b[:, None, None]  # (K, B, T, d_head)


class NativePatcher:
    """Logits of edges on a native ``GPT``, ``max_tokens`` rows x positions per pass."""

    def __init__(self, model: Any, task: Task, read: torch.Tensor | None = None, max_tokens: int = 8192) -> None:
        self.model, self.task, self.max_tokens = model, task, max_tokens
        self.runner = ResumeRunner(model, task, Replacement("zero", {}), read)
        self.clean_logits = self.runner.clean_logits
        self._final: torch.Tensor | None = None

    def final_resid(self) -> torch.Tensor:
        """``(B, T, D)`` the residual stream entering the final LayerNorm (one forward, on first use)."""
        if self._final is None:
            name = f"blocks.{self.model.cfg.n_layers - 1}.hook_resid_post"
            _, cache = self.model.run_with_cache(self.task.tokens, names_filter=name)
            self._final = cache[name]
        return self._final

    def chunks(self, edges: Sequence[Edge], named: Any = None) -> list[list[Edge]]:
        """Edges grouped by receiver layer (logits last), at most ``max_tokens`` rows x positions per chunk."""
        B, T = self.task.tokens.shape
        per = max(1, self.max_tokens // (B * T))
        by_layer: dict[int, list[Edge]] = {}
        for e in edges:
            by_layer.setdefault(e.receiver.layer if e.receiver.kind == "head" else 10**9, []).append(e)
        return [group[i:i + per] for _, group in sorted(by_layer.items()) for i in range(0, len(group), per)]

    def logits(self, chunk: Sequence[Edge], deltas: torch.Tensor, recv: torch.Tensor | None = None) -> torch.Tensor:
        """``(K, B, T, V)`` logits of ``K`` edges of one chunk; ``deltas`` ``(K, B, T, D)`` their senders' deltas
        (masked to their sender positions), ``recv`` ``(K, B, T)`` the receivers' patched query positions."""
        model = self.model
        K, B, T, _ = deltas.shape  # edges, prompts, positions, d_model
        if chunk[0].receiver.kind == "logits":
            x = self.final_resid()[None] + deltas  # (K, B, T, D)
            return model.lm_head(model.transformer.ln_f(x))  # (K, B, T, V)
        layer = chunk[0].receiver.layer
        block = model.transformer.h[layer]
        H, d = model.cfg.n_heads, model.cfg.d_head
        pre = self.runner.cache[f"blocks.{layer}.hook_resid_pre"]  # (B, T, D)
        heads = torch.tensor([e.receiver.head for e in chunk], device=pre.device)
        which = torch.tensor([INPUTS.index(e.input) for e in chunk], device=pre.device)
        patched = _head_proj(block, block.ln_1(pre[None] + deltas), which, heads)  # (K, B, T, d_head)
        clean = block.attn.c_attn(block.ln_1(pre)).view(B, T, 3, H, d)  # (B, T, qkv, H, d_head)
        sel = clean[:, :, :, heads].permute(3, 2, 0, 1, 4)  # (K, qkv, B, T, d_head): each copy's receiver head
        mask = F.one_hot(which, 3).bool()[:, :, None, None, None]  # (K, qkv, 1, 1, 1): the patched input
        q, k, v = torch.where(mask, patched[:, None], sel).unbind(1)  # 3 x (K, B, T, d_head)
        z_h = F.scaled_dot_product_attention(q, k, v, is_causal=model.cfg.causal)  # (K, B, T, d_head)
        z = self.runner.cache[f"blocks.{layer}.attn.hook_z"][None].repeat(K, 1, 1, 1, 1)  # (K, B, T, H, d_head)
        if recv is not None:  # clean output at the query positions the edge is not restricted to
            z_h = torch.where(recv[..., None], z_h, z[torch.arange(K), :, :, heads])  # (K, B, T, d_head)
        z[torch.arange(K), :, :, heads] = z_h
        logits = self.runner._finish(layer, z.view(K * B, T, H, d), pre.repeat(K, 1, 1))  # (K*B, T, V)
        return logits.view(K, B, T, -1)


def naive_logits(model: Any, task: Task, edge: Edge, delta: torch.Tensor, recv: torch.Tensor | None = None,
                 clean_z: torch.Tensor | None = None) -> torch.Tensor:
    """``(B, T, V)``: one full forward with hooks that patch ``edge`` alone (the reference). ``recv`` ``(B, T)``:
    the receiver's query positions that keep the patched output; elsewhere its ``hook_z`` is ``clean_z``."""
    r = edge.receiver
    if r.kind == "logits":
        hooks = [(f"blocks.{model.cfg.n_layers - 1}.hook_resid_post", lambda x, hook: x + delta)]
    else:
        block = model.transformer.h[r.layer]
        seen: dict[str, torch.Tensor] = {}

        def keep(x: torch.Tensor, hook: Any) -> None:
            seen["pre"] = x  # (B, T, D): the receiver layer's clean input

        def patch(x: torch.Tensor, hook: Any) -> torch.Tensor:  # (B, T, H, d_head)
            rows = input_rows(model.cfg, edge.input, r.head)
            w, b = block.attn.c_attn.weight[rows], block.attn.c_attn.bias[rows]  # (d_head, D), (d_head,)
            out = x.clone()
            out[:, :, r.head] = F.linear(block.ln_1(seen["pre"] + delta), w, b)  # (B, T, d_head)
            return out

        def splice(z: torch.Tensor, hook: Any) -> torch.Tensor:  # (B, T, H, d_head)
            out = z.clone()
            out[:, :, r.head] = torch.where(recv[..., None], z[:, :, r.head], clean_z[:, :, r.head])
            return out

        hooks = [(f"blocks.{r.layer}.hook_resid_pre", keep), (f"blocks.{r.layer}.attn.hook_{edge.input}", patch)]
        if recv is not None:
            hooks.append((f"blocks.{r.layer}.attn.hook_z", splice))
    with model.hooks(hooks):
        return model(task.tokens, attention_mask=task.attention_mask)
