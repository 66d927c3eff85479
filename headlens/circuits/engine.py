"""Which patcher runs the edges, and the per-prompt metric values it yields.

Native models take the cached fast path (:mod:`~headlens.circuits.native`) or, with ``fast=False``,
one hooked forward per edge. A bridged plain GPT-2 takes the fast path on its native twin
(:mod:`~headlens.circuits.twin`); other Hugging Face models resume the bridge's own blocks from the
receiver's layer (:mod:`~headlens.circuits.resume`) or, with ``fast=False``, run one forward per edge
through the bridge's forks (:mod:`~headlens.circuits.bridge`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from headlens.circuits.bridge import BridgePatcher
from headlens.circuits.native import NativePatcher, naive_logits
from headlens.circuits.nodes import Edge
from headlens.circuits.positions import NamedPositions, edge_masks
from headlens.circuits.recorded import resumable
from headlens.circuits.resume import ResumePatcher
from headlens.circuits.twin import native_twin
from headlens.interventions.metrics import Task, get_metric
from headlens.models.gpt import GPT


class NaiveNative:
    """The reference on native models: one full hooked forward per edge."""

    def __init__(self, model: Any, task: Task) -> None:
        self.model, self.task = model, task
        names = [f"blocks.{layer}.attn.hook_z" for layer in range(model.cfg.n_layers)]
        self.clean_logits, cache = model.run_with_cache(task.tokens, names_filter=names,
                                                        attention_mask=task.attention_mask)
        self.clean_z = [cache[n] for n in names]  # (B, T, H, d_head) per layer

    def chunks(self, edges: Sequence[Edge], named: Any = None) -> list[list[Edge]]:
        return [[e] for e in edges]

    def logits(self, chunk: Sequence[Edge], deltas: torch.Tensor, recv: torch.Tensor | None = None) -> torch.Tensor:
        e = chunk[0]
        z = self.clean_z[e.receiver.layer] if e.receiver.kind == "head" else None
        out = naive_logits(self.model, self.task, e, deltas[0], None if recv is None else recv[0], z)
        return out[None]  # (1, B, T, V)


def make_patcher(model: Any, task: Task, fast: bool = True, max_tokens: int = 8192, resume_tokens: int = 8192,
                 metrics: Sequence[str] = (), run: Any = None) -> Any:
    """The patcher for ``model``: cached fast path, the resumed bridge, or a forward per edge. ``max_tokens``:
    rows x positions of ``(K, B, T, V)`` logits per chunk; ``resume_tokens``: of hidden states, for the resumed
    bridge (it unembeds one edge at a time; for ``logit_diff`` alone, at the answers' columns only). ``run``: the
    task's clean run already recorded (:class:`~headlens.circuits.recorded.CleanRun`), for the resumed bridge."""
    if isinstance(model, GPT):  # the fast path resumes blocks without a padding mask: padded bidirectional goes naive
        fast = fast and not model.padded(task.attention_mask)
        return NativePatcher(model, task, task.positions, max_tokens) if fast else NaiveNative(model, task)
    twin = native_twin(model) if fast else None  # a bridged plain GPT-2 runs on the native fast path
    if twin is not None:
        return NativePatcher(twin, task, task.positions, max_tokens)
    if fast and resumable(model):
        return ResumePatcher(model, task, resume_tokens, answer_columns(task, metrics), run=run)
    return BridgePatcher(model, task, fast, max_tokens)


def answer_columns(task: Task, metrics: Sequence[str]) -> torch.Tensor | None:
    """``(B, 2)`` the vocabulary ids ``metrics`` read per prompt when they read only the answers (``logit_diff``);
    None when they read more."""
    return task.answers if metrics and set(metrics) <= {"logit_diff"} and task.answers is not None else None


LOGIT_BUDGET = 256 * 2**20  # bytes of float32 logits ``(K, B, T, V)`` one pass may hold
# rows x positions of hidden states a resumed chunk runs at once: 8192 held 0.4 GB more at SmolLM2's IOI discovery
# peak (an MLP's 1536 channels over K*B*S rows, several such tensors live) for no gain in time
RESUME_TOKENS = 4096


class RowDeltas:
    """Sender deltas of prompts ``rows`` only (a slice of the batch)."""

    def __init__(self, inner: Any, rows: slice) -> None:
        self.inner, self.rows = inner, rows

    def delta(self, node: Any) -> torch.Tensor:
        return self.inner.delta(node)[self.rows]


def chunk_inputs(chunk: Sequence[Edge], deltas: Any, named: NamedPositions | None,
                 like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(K, B, T, D)`` each edge's sender delta masked to its ``sender_pos``, and ``(K, B, T)`` its
    ``receiver_pos`` mask (None when no edge of the chunk is restricted)."""
    ds: torch.Tensor | None = None
    recv = []
    for k, e in enumerate(chunk):  # written in place: a list then a stack held the chunk's deltas twice
        d = deltas.delta(e.sender)  # (B, T, D)
        if ds is None:
            ds = d.new_empty(len(chunk), *d.shape)  # (K, B, T, D)
        s_mask, r_mask = edge_masks(e, named)
        ds[k] = d if s_mask is None else d * s_mask[:, :, None].to(d)
        recv.append(r_mask)
    if all(r is None for r in recv):
        return ds, None
    full = torch.ones(like.shape, dtype=torch.bool, device=like.device)  # (B, T)
    return ds, torch.stack([full if r is None else r for r in recv])  # (K, B, T, D), (K, B, T)


def _rows(task: Task, rows: slice) -> Task:
    return task.rows(rows)  # every per-prompt field (IOI's answers too)


def rows_per_block(model: Any, task: Task, max_tokens: int = 8192) -> tuple[int, int]:
    """``(prompts, budget)``: how many prompts :func:`edge_values` patches at once (their logits fit
    :data:`LOGIT_BUDGET`: a 50k vocabulary makes ``(B, T, V)`` the largest tensor of a run), and its rows x positions."""
    T = task.tokens.shape[1]
    budget = min(max_tokens, max(T, LOGIT_BUDGET // (4 * model.cfg.d_vocab)))
    return max(1, budget // T), budget


def edge_values(model: Any, task: Task, metrics: Sequence[str], edges: Sequence[Edge], deltas: Any,
                fast: bool = True, progress: Callable[[int], None] | None = None, max_tokens: int = 8192,
                named: NamedPositions | None = None, patchers: dict | None = None, run: Any = None
                ) -> tuple[dict[str, np.ndarray], dict[tuple[Edge, str], np.ndarray]]:
    """Per-prompt values ``(B,)`` of ``metrics``, clean and with each edge patched.

    Prompts go through in blocks whose logits fit :data:`LOGIT_BUDGET` (a 50k vocabulary makes
    ``(B, T, V)`` the largest tensor of a run); each block caches its own clean run. ``named``: the
    prompts' named positions, for edges restricted to them (:mod:`~headlens.circuits.positions`).
    ``patchers``: where each block's patcher is kept for the next call on the same prompts (discovery's tables):
    its clean run is recorded once, not once per call. ``run``: the clean run of all prompts already recorded
    (discovery's setup), for a block that holds them all.

    Returns:
        ``(clean, values)``: ``clean[metric]`` and ``values[edge, metric]``, float64 arrays over prompts.
    """
    B = task.tokens.shape[0]
    per, budget = rows_per_block(model, task, max_tokens)
    parts = [_block(model, _rows(task, slice(i, i + per)), metrics, edges, RowDeltas(deltas, slice(i, i + per)),
                    fast, progress if i == 0 else None, budget, None if named is None else named.rows(slice(i, i + per)),
                    max_tokens, patchers, (i, per, fast, budget, max_tokens, tuple(metrics)), run if per >= B else None)
             for i in range(0, B, per)]
    clean = {m: np.concatenate([p[0][m] for p in parts]) for m in metrics}
    values = {k: np.concatenate([p[1][k] for p in parts]) for k in parts[0][1]}
    return clean, values


def _block(model: Any, task: Task, metrics: Sequence[str], edges: Sequence[Edge], deltas: Any, fast: bool,
           progress: Callable[[int], None] | None, budget: int, named: NamedPositions | None,
           max_tokens: int = 8192, patchers: dict | None = None, key: tuple = (), run: Any = None) -> tuple[dict, dict]:
    with torch.no_grad():
        runner = None if patchers is None else patchers.get(key)
        if runner is None:
            runner = make_patcher(model, task, fast, budget, min(max_tokens, RESUME_TOKENS), metrics, run)
            if patchers is not None:
                patchers[key] = runner
        clean_logits = runner.clean_logits
        read = getattr(runner, "metric_task", task)  # how the metrics read its logits (the resumed: compact ones)
        clean = {m: get_metric(m)(clean_logits, read, clean_logits).cpu().numpy() for m in metrics}
        values: dict[tuple[Edge, str], np.ndarray] = {}
        for chunk in runner.chunks(list(dict.fromkeys(edges)), named):
            d, recv = chunk_inputs(chunk, deltas, named, task.tokens)  # (K, B, T, D), (K, B, T) or None
            logits = runner.logits(chunk, d, recv)  # (K, B, T, V)
            for e, lg in zip(chunk, logits, strict=True):
                for m in metrics:
                    values[e, m] = get_metric(m)(lg, read, clean_logits).cpu().numpy()
            if progress is not None:
                progress(len(chunk))
    return clean, values
