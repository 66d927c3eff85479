"""The ablated forwards behind a sweep: one hooked forward per group (every backend), or resumed blocks (native).

Cheap by construction on native models: one clean run caches each layer's residual input
and ``hook_z``; an ablation of heads in layer ``l`` then restarts there from
``resid_pre + c_proj(z with the heads replaced)`` and runs only the MLP of block ``l`` and
blocks ``l+1..``; the last block, final LayerNorm and unembedding run only at the positions
the metrics read. Groups of one layer are stacked along the batch up to ``max_tokens``
rows x positions per pass (on CPU small passes are fastest: big stacked tensors fall out of
cache; on an accelerator raise it). The numbers are those of a full hooked forward per group
(``fast=False``, also the path for every other backend), up to float rounding.

Every runner yields logits at the positions the metrics read only (``(b, C, V)``, never a whole batch's
``(B, T, V)``): :mod:`headlens.interventions.logits`.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import torch
import torch.nn.functional as F

from headlens.interventions.ablation import Replacement, ablation_hooks
from headlens.interventions.controls import Group
from headlens.interventions.logits import logit_rows, logits_at, read_columns
from headlens.interventions.metrics import Task, get_metric
from headlens.models.gpt import GPT

PATTERN_BUDGET = 256 * 2**20  # bytes of one layer's (rows, H, T, T) float32 pattern per naive forward


def pattern_rows(model: Any, T: int) -> int:
    """Prompts of ``T`` tokens per forward whose one-layer float32 pattern fits :data:`PATTERN_BUDGET`."""
    return max(1, PATTERN_BUDGET // (4 * model.n_heads * T * T))


def task_logits(model: Any, task: Task, rows: int | None = None, cols: torch.Tensor | None = None) -> torch.Tensor:
    """Logits ``(B, T, V)`` of ``task``'s prompts, ``rows`` prompts per forward (None: as many as
    :func:`pattern_rows` allows; 0: all at once); ``cols`` ``(C,)``: at those positions only, ``(B, C, V)``."""
    return torch.cat([logits for _, logits in logit_chunks(model, task, rows, cols)])  # (B, T or C, V)


def task_metric(model: Any, task: Task, metric: str) -> torch.Tensor:
    """Per-prompt values ``(B,)`` of ``metric`` on ``task``'s prompts, unablated: the logits at the read positions
    only, a chunk of prompts at a time (never the whole batch's ``(B, T, V)``)."""
    m, cols = get_metric(metric), read_columns(task.positions)
    at = task.at(cols)
    rows = min(pattern_rows(model, task.tokens.shape[1]), logit_rows(model, len(at.columns())))
    return torch.cat([m(logits, at.rows(r), logits) for r, logits in logit_chunks(model, task, rows, cols)])  # (B,)


def logit_chunks(model: Any, task: Task, rows: int | None = None,
                 cols: torch.Tensor | None = None) -> Iterator[tuple[slice, torch.Tensor]]:
    """``(prompts, logits)`` of ``rows`` prompts per forward: :func:`task_logits` a chunk at a time."""
    if rows is None:
        rows = pattern_rows(model, task.tokens.shape[1])
    rows = rows or len(task.tokens)
    for i in range(0, len(task.tokens), rows):
        mask = None if task.attention_mask is None else task.attention_mask[i:i + rows]
        yield slice(i, i + rows), logits_at(model, task.tokens[i:i + rows], cols, mask)  # (rows, T or C, V)


class NaiveRunner:
    """One full hooked forward per group: works on every backend.

    Hooked backends (TransformerBridge) build each layer's ``(B, H, T, T)`` pattern, so long prompts
    go through in chunks of prompts whose pattern fits :data:`PATTERN_BUDGET` (20 prompts of 2,048
    tokens peaked at 8 GB in one forward). ``resample`` keeps one forward: which reference row a
    prompt draws depends on the batch it is in.
    """

    def __init__(self, model: Any, task: Task, replacement: Replacement, read: torch.Tensor | None = None,
                 keep_clean: bool = True) -> None:
        self.model, self.task, self.replacement = model, task, replacement
        self.cols = read_columns(read)  # (C,): the positions any metric reads (None: every one)
        T = task.tokens.shape[1]
        n_cols = T if self.cols is None else len(self.cols)
        self.rows = 0 if replacement.method == "resample" else min(pattern_rows(model, T), logit_rows(model, n_cols))
        self.clean_logits = task_logits(model, task, self.rows, self.cols) if keep_clean else None  # (B, C, V)

    def clean(self) -> Iterator[tuple[slice, torch.Tensor]]:
        """``(prompts, logits)`` of the clean run at the read positions, a chunk of prompts at a time."""
        if self.clean_logits is not None:
            yield slice(None), self.clean_logits
        else:
            yield from logit_chunks(self.model, self.task, self.rows, self.cols)

    def plan(self, groups: Sequence[Group]) -> list[list[Group]]:
        """Units of work in run order; ranks share them out whole (same shapes, same numbers)."""
        return [[g] for g in groups]

    def run_unit(self, unit: Sequence[Group]) -> Iterator[tuple[Group, slice, torch.Tensor]]:
        """``(group, prompts, logits)``: each group's ablated logits at the read positions, a chunk at a time."""
        for group in unit:
            with self.model.hooks(ablation_hooks(group, self.replacement)):
                for rows, logits in logit_chunks(self.model, self.task, self.rows, self.cols):
                    yield group, rows, logits


class ResumeRunner(NaiveRunner):
    """Restarts each ablated forward at its first ablated layer from the cached clean run (native GPT).

    The last block, the final LayerNorm and the unembedding run only at the query positions the
    metrics read (``read``: ``(B, T)`` bool, any row); the logits elsewhere are left at zero.
    """

    def __init__(self, model: GPT, task: Task, replacement: Replacement, read: torch.Tensor | None = None,
                 max_tokens: int = 4096) -> None:
        self.model, self.task, self.replacement, self.max_tokens = model, task, replacement, max_tokens
        kept = ("hook_resid_pre", "attn.hook_z", *(("attn.hook_v",) if replacement.needs_live else ()))
        names = [f"blocks.{layer}.{n}" for layer in range(model.n_layers) for n in kept]
        self.clean_logits, self.cache = model.run_with_cache(task.tokens, names_filter=names)
        self.cols = read_columns(read)  # None: every position is read

    def clean(self) -> Iterator[tuple[slice, torch.Tensor]]:
        yield slice(None), self.clean_logits if self.cols is None else self.clean_logits[:, self.cols]

    def _finish(self, layer: int, z: torch.Tensor, resid_pre: torch.Tensor, later: Group = (),
                compact: bool = False) -> torch.Tensor:
        """Logits from block ``layer``'s ablated ``z`` ``(N, T, H, d_head)`` onwards (``compact``: ``(N, C, V)`` at
        the read positions only, else ``(N, T, V)`` with zeros at the others)."""
        blocks = self.model.transformer.h
        last = len(blocks) - 1
        cols = self.cols if not later else None  # later ablation hooks need the plain forward
        N, T = z.shape[:2]
        if cols is not None and layer == last:  # nothing downstream: only the read positions matter
            z, resid_pre = z[:, cols], resid_pre[:, cols]
        x = resid_pre + blocks[layer].attn.c_proj(z.reshape(N, z.shape[1], -1))  # (N, T', H*d_head) -> (N, T', D)
        x = _mlp(blocks[layer], x)
        with self.model.hooks(ablation_hooks(later, self.replacement) if later else ()):
            for b in blocks[layer + 1 : last if cols is not None else last + 1]:
                x = b(x)
        if cols is not None and layer < last:
            x = _block_at(blocks[last], x, cols)  # (N, len(cols), D)
        logits = self.model.lm_head(self.model.transformer.ln_f(x))  # (N, T', d_vocab)
        if compact and self.cols is not None and cols is None:
            return logits[:, self.cols]  # (N, C, d_vocab)
        if cols is None or compact:
            return logits
        full = logits.new_zeros(N, T, logits.shape[-1])  # (N, T, d_vocab): unread positions stay 0
        full[:, cols] = logits
        return full

    def plan(self, groups: Sequence[Group]) -> list[list[Group]]:
        """Each multi-layer group alone, then one-layer groups stacked per layer, ``max_tokens`` at a time."""
        B, T = self.task.tokens.shape
        stackable: dict[int, list[Group]] = {}
        units = []
        for group in groups:
            layers = {layer for layer, _ in group}
            if len(layers) == 1:
                stackable.setdefault(layers.pop(), []).append(group)
            else:
                units.append([group])
        n_cols = T if self.cols is None else len(self.cols)
        per_chunk = max(1, min(self.max_tokens // (B * T), logit_rows(self.model, n_cols) // B))
        for _, layer_groups in sorted(stackable.items()):
            units += [layer_groups[s : s + per_chunk] for s in range(0, len(layer_groups), per_chunk)]
        return units

    def run_unit(self, unit: Sequence[Group]) -> Iterator[tuple[Group, slice, torch.Tensor]]:
        layers = {layer for group in unit for layer, _ in group}
        if len(layers) > 1:  # a multi-layer group: its own unit
            yield unit[0], slice(None), self._run_one(min(layers), unit[0])
            return
        B = self.task.tokens.shape[0]
        layer = layers.pop()
        z = self.cache[f"blocks.{layer}.attn.hook_z"]  # (B, T, H, d_head)
        repl = self.replacement.z(layer, z, self._live(layer))  # (B, T, H, d_head)
        zs = z.repeat(len(unit), 1, 1, 1)  # (K*B, T, H, d_head): group k owns rows k*B..(k+1)*B
        for k, group in enumerate(unit):
            idx = [h for _, h in group]
            zs[k * B : (k + 1) * B, :, idx] = repl[:, :, idx]
        pre = self.cache[f"blocks.{layer}.hook_resid_pre"].repeat(len(unit), 1, 1)  # (K*B, T, D)
        logits = self._finish(layer, zs, pre, compact=True)  # (K*B, C, d_vocab)
        for group, rows in zip(unit, logits.view(len(unit), B, *logits.shape[1:]), strict=True):  # (B, C, d_vocab)
            yield group, slice(None), rows

    def _live(self, layer: int) -> dict[str, torch.Tensor] | None:
        """The clean run's values of ``layer`` (what ``uniform`` averages; the layer's input is clean)."""
        return {"v": self.cache[f"blocks.{layer}.attn.hook_v"]} if self.replacement.needs_live else None

    def _run_one(self, first: int, group: Group) -> torch.Tensor:
        z = self.cache[f"blocks.{first}.attn.hook_z"].clone()  # (B, T, H, d_head)
        idx = [h for layer, h in group if layer == first]
        z[:, :, idx] = self.replacement.z(first, z, self._live(first))[:, :, idx]
        later = tuple(h for h in group if h[0] > first)
        return self._finish(first, z, self.cache[f"blocks.{first}.hook_resid_pre"], later, compact=True)


def _mlp(block: Any, x: torch.Tensor) -> torch.Tensor:
    return x if block.attn_only else x + block.mlp(block.ln_2(x))


def _block_at(block: Any, x: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """``block``'s output at query positions ``cols`` only (keys and values from every position).

    Mirrors ``Block.forward`` and ``MultiHeadAttention.forward`` (no hooks run here); the
    sweep tests compare it with the plain forward.
    """
    attn = block.attn
    N, T, _ = x.shape  # batch, positions, d_model
    H, d, A = attn.n_heads, attn.d_head, attn.d_attn  # A = H * d_head
    h = block.ln_1(x)  # (N, T, D)
    w, b = attn.c_attn.weight, attn.c_attn.bias  # (3A, D), (3A,): rows are q, k, v
    q = F.linear(h[:, cols], w[:A], b[:A]).view(N, len(cols), H, d).transpose(1, 2)  # (N, H, Q, d_head)
    k, v = F.linear(h, w[A:], b[A:]).split(A, dim=2)  # 2 x (N, T, A)
    k = k.view(N, T, H, d).transpose(1, 2)  # (N, H, T, d_head)
    v = v.view(N, T, H, d).transpose(1, 2)  # (N, H, T, d_head)
    seen = torch.arange(T, device=x.device)[None, :] <= cols[:, None]  # (Q, T): query at cols[i]
    z = F.scaled_dot_product_attention(q, k, v, attn_mask=seen if attn.causal else None)  # (N, H, Q, d_head)
    z = z.transpose(1, 2).reshape(N, len(cols), A)  # heads merged: (N, Q, H*d_head)
    return _mlp(block, x[:, cols] + attn.c_proj(z))  # (N, Q, D)
