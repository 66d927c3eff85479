"""Which patcher runs the edges, and the per-prompt metric values it yields.

Native models take the cached fast path (:mod:`~headlens.circuits.native`) or, with ``fast=False``,
one hooked forward per edge; Hugging Face models go through the bridge's forks
(:mod:`~headlens.circuits.bridge`), batched or one edge per forward.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from headlens.circuits.bridge import BridgePatcher
from headlens.circuits.native import NativePatcher, naive_logits
from headlens.circuits.nodes import Edge
from headlens.circuits.senders import SenderDeltas
from headlens.interventions.metrics import Task, get_metric
from headlens.models.gpt import GPT


class NaiveNative:
    """The reference on native models: one full hooked forward per edge."""

    def __init__(self, model: Any, task: Task) -> None:
        self.model, self.task = model, task
        self.clean_logits = model(task.tokens)

    def chunks(self, edges: Sequence[Edge]) -> list[list[Edge]]:
        return [[e] for e in edges]

    def logits(self, chunk: Sequence[Edge], deltas: torch.Tensor) -> torch.Tensor:
        return naive_logits(self.model, self.task, chunk[0], deltas[0])[None]  # (1, B, T, V)


def make_patcher(model: Any, task: Task, fast: bool = True, max_tokens: int = 8192) -> Any:
    """The patcher for ``model``: cached fast path, batched bridge forks, or a forward per edge."""
    if isinstance(model, GPT):
        return NativePatcher(model, task, task.positions, max_tokens) if fast else NaiveNative(model, task)
    return BridgePatcher(model, task, fast, max_tokens)


def edge_values(model: Any, task: Task, metrics: Sequence[str], edges: Sequence[Edge], deltas: SenderDeltas,
                fast: bool = True, progress: Callable[[int], None] | None = None,
                max_tokens: int = 8192) -> tuple[dict[str, np.ndarray], dict[tuple[Edge, str], np.ndarray]]:
    """Per-prompt values ``(B,)`` of ``metrics``, clean and with each edge patched.

    Returns:
        ``(clean, values)``: ``clean[metric]`` and ``values[edge, metric]``, float64 arrays over prompts.
    """
    with torch.no_grad():
        runner = make_patcher(model, task, fast, max_tokens)
        clean_logits = runner.clean_logits
        clean = {m: get_metric(m)(clean_logits, task, clean_logits).cpu().numpy() for m in metrics}
        values: dict[tuple[Edge, str], np.ndarray] = {}
        for chunk in runner.chunks(list(dict.fromkeys(edges))):
            d = torch.stack([deltas.delta(e.sender) for e in chunk])  # (K, B, T, D)
            logits = runner.logits(chunk, d)  # (K, B, T, V)
            for e, lg in zip(chunk, logits, strict=True):
                for m in metrics:
                    values[e, m] = get_metric(m)(lg, task, clean_logits).cpu().numpy()
            if progress is not None:
                progress(len(chunk))
    return clean, values
