"""Receiver-local metrics: how much an edge changes the receiver head's own detector score.

When the question is "what makes L18H6 an induction head" rather than "what does the circuit do for the
loss", nothing downstream of the receiver matters: an edge into its q or k changes only its attention
pattern. ``--metric receiver:induction`` (any registered detector with a predicate target:
``receiver:previous_token``, ``receiver:duplicate_token``, ...) is the receiver's score for that detector
(attention mass on the detector's targets, averaged over the query rows that have targets, per prompt),
patched minus clean. Restricted to ``receiver_pos``, only those query rows count.

Why it looks like this:

* **Nothing downstream runs.** On native models the receiver's q and k are recomputed from the cached
  residual stream for a batch of edges at once (one einsum). On Hugging Face models the receiver's own
  block is called, ``K`` copies of the batch at once, on the cached residual stream with the bridge's fork
  hooks (:mod:`~headlens.circuits.resume`): the family's norm, rotary embedding, soft-cap and window are its
  own, and the forward stops at the receiver layer's pattern.
* **The reference** is the pattern read at ``hook_pattern`` of a full forward with the edge patched
  (``fast=False``); tested equal within 1e-5, and against plain transformers' eager attentions.
* ``v`` edges do not move the pattern (their effect here is 0 by construction) and are refused.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from headlens.circuits.native import _head_proj
from headlens.circuits.nodes import INPUTS, CircuitError, Edge
from headlens.interventions.metrics import Task

PREFIX = "receiver:"


def is_receiver_metric(metric: str) -> bool:
    return isinstance(metric, str) and metric.startswith(PREFIX)


def receiver_detector(metric: str) -> Any:
    """The detector of ``receiver:<name>``; a ``CircuitError`` unless it has a predicate target."""
    from headlens.detectors import get_detector
    from headlens.errors import HeadlensError

    name = metric[len(PREFIX):].strip()
    try:
        det = get_detector(name)
    except HeadlensError as err:
        raise CircuitError(f"{metric!r}: {err}") from None
    if det.predicate is None:
        raise CircuitError(f"{metric!r}: {det.name} has no predicate target (a rule over query and key), so the "
                           f"receiver's score cannot be recomputed; try receiver:induction, receiver:previous_token "
                           f"or receiver:duplicate_token")
    return det


def check_edges(edges: Sequence[Edge]) -> None:
    if any(e.input == "v" or e.receiver.kind != "head" for e in edges):
        raise CircuitError("receiver-local metrics are about the receiver's pattern: q and k edges into heads only "
                           "(--inputs qk, receivers that are heads)")


def target_mask(model: Any, task: Task, detector: Any) -> torch.Tensor:
    """``(B, Q, K)`` bool: the detector's targets on the task's prompts (countable rows, real keys)."""
    from headlens.detectors.base import predicate_mask
    from headlens.probes.base import ProbeBatch

    tokens = task.tokens
    T = tokens.shape[1]
    valid = (torch.ones_like(tokens, dtype=torch.bool) if task.attention_mask is None
             else task.attention_mask.bool())  # (B, T)
    specials = torch.tensor(sorted(model.special_token_ids), dtype=torch.long, device=tokens.device)
    batch = ProbeBatch(tokens, valid.sum(1), valid, torch.isin(tokens, specials) | ~valid, model.is_causal)
    return predicate_mask(detector.predicate, batch, 0, T, 0, T)


def score(pattern: torch.Tensor, targets: torch.Tensor, rows: torch.Tensor | None = None) -> torch.Tensor:
    """``(N, B)`` mean attention mass on the targets over the query rows that have them (and are in ``rows``).

    ``pattern`` ``(N, B, Q, K)``; ``targets`` ``(B, Q, K)`` bool; ``rows`` ``(N, B, Q)`` bool or None.

    >>> p = torch.tensor([[[[1.0, 0.0], [0.25, 0.75]]]]); t = torch.tensor([[[False, False], [True, False]]])
    >>> score(p, t).tolist()
    [[0.25]]
    """
    mass = (pattern * targets).sum(-1)  # (N, B, Q)
    has = targets.any(-1).expand_as(mass)  # (N, B, Q)
    if rows is not None:
        has = has & rows
    return (mass * has).sum(-1) / has.sum(-1).clamp_min(1)  # (N, B)


def receiver_values(model: Any, task: Task, metric: str, edges: Sequence[Edge], deltas: Any, named: Any = None,
                    fast: bool = True, max_tokens: int = 8192, progress: Callable[[int], None] | None = None
                    ) -> tuple[dict[Edge, np.ndarray], dict[Edge, np.ndarray]]:
    """Per edge, the receiver's clean score and its patched score per prompt, ``(B,)`` each.

    The clean score is over the same query rows (``receiver_pos``) as the patched one.
    """
    from headlens.circuits.engine import chunk_inputs

    check_edges(edges)
    targets = target_mask(model, task, receiver_detector(metric))  # (B, Q, K)
    patterns = ReceiverPatterns(model, task, fast)
    B, T = task.tokens.shape
    per = max(1, max_tokens // (B * T)) if fast else 1
    clean: dict[Edge, np.ndarray] = {}
    values: dict[Edge, np.ndarray] = {}
    by_layer: dict[int, list[Edge]] = {}
    for e in dict.fromkeys(edges):
        by_layer.setdefault(e.receiver.layer, []).append(e)
    with torch.no_grad():
        for _, group in sorted(by_layer.items()):
            for i in range(0, len(group), per):
                chunk = group[i:i + per]
                d, recv = chunk_inputs(chunk, deltas, named, task.tokens)  # (K, B, T, D), (K, B, T) or None
                heads = [e.receiver.head for e in chunk]
                base = patterns.clean(chunk[0].receiver.layer)[:, heads].transpose(0, 1)  # (K, B, Q, K)
                new = patterns.patched(chunk, d)  # (K, B, Q, K)
                for e, c, v in zip(chunk, score(base, targets, recv).cpu().numpy(), score(new, targets, recv).cpu().numpy(),
                                   strict=True):
                    clean[e], values[e] = c.astype(np.float64), v.astype(np.float64)
                if progress is not None:
                    progress(len(chunk))
    return clean, values


class ReceiverPatterns:
    """The receiver heads' patterns ``(K, B, Q, K)``, clean and with edges patched, without running downstream."""

    def __init__(self, model: Any, task: Task, fast: bool = True) -> None:
        from headlens.models.gpt import GPT

        self.model, self.task, self.fast = model, task, fast
        self.native = isinstance(model, GPT)
        if not self.native:
            from headlens.circuits.bridge import forks

            with forks(model):  # raises the one-line CircuitError on a family without forks
                pass
        self._clean: dict[Any, torch.Tensor] = {}  # layer -> clean pattern; ("pre", layer) -> resid_pre
        self._run: Any = None

    def clean(self, layer: int) -> torch.Tensor:
        """``(B, H, Q, K)`` the clean pattern of ``layer`` (on the bridge's fast path: through its own call)."""
        if layer not in self._clean:
            name = f"blocks.{layer}.attn.hook_pattern"
            if self.native or not self.fast:
                from headlens.circuits.bridge import forks

                with contextlib.nullcontext() if self.native else forks(self.model):
                    kwargs = {} if self.task.attention_mask is None else {"attention_mask": self.task.attention_mask}
                    self._clean[layer] = self.model.run_with_cache(self.task.tokens, names_filter=[name], **kwargs)[1][name]
            else:
                from headlens.circuits.local_bridge import clean_pattern

                self._clean[layer] = clean_pattern(self.model, self._clean_run(), layer)
        return self._clean[layer]

    def _clean_run(self) -> Any:
        if self._run is None:
            from headlens.circuits.recorded import CleanRun

            self._run = CleanRun(self.model, self.task)
        return self._run

    def patched(self, chunk: Sequence[Edge], d: torch.Tensor) -> torch.Tensor:
        """``(K, B, Q, K)``: each edge's receiver pattern with its (masked) delta ``d[k]`` ``(B, T, D)``."""
        if not self.fast:
            from headlens.circuits.local_bridge import naive_pattern

            return torch.stack([naive_pattern(self.model, self.task, e, dk) for e, dk in zip(chunk, d, strict=True)])
        if self.native:
            layer = chunk[0].receiver.layer
            if ("pre", layer) not in self._clean:
                name = f"blocks.{layer}.hook_resid_pre"
                self._clean["pre", layer] = self.model.run_with_cache(  # type: ignore[index]
                    self.task.tokens, names_filter=[name], attention_mask=self.task.attention_mask)[1][name]
            return _native_patterns(self.model, self.task, chunk, d, self._clean["pre", layer])  # type: ignore[index]
        from headlens.circuits.local_bridge import bridge_patterns

        return bridge_patterns(self.model, self._clean_run(), chunk, d)


def _native_patterns(model: Any, task: Task, chunk: Sequence[Edge], d: torch.Tensor, pre: torch.Tensor) -> torch.Tensor:
    """``(K, B, Q, K)``: the receivers' patterns from the cached residual stream ``pre`` ``(B, T, D)``, q or k patched."""
    block = model.transformer.h[chunk[0].receiver.layer]
    B, T, _ = pre.shape
    H, dh = model.cfg.n_heads, model.cfg.d_head
    heads = torch.tensor([e.receiver.head for e in chunk])
    which = torch.tensor([INPUTS.index(e.input) for e in chunk])
    qk = block.attn.c_attn(block.ln_1(pre)).view(B, T, 3, H, dh)[:, :, :2]  # (B, T, qk, H, d_head)
    patched = _head_proj(block, block.ln_1(pre[None] + d), which, heads)  # (K, B, T, d_head)
    q = torch.where((which == 0)[:, None, None, None], patched, qk[:, :, 0, heads].permute(2, 0, 1, 3))
    k = torch.where((which == 1)[:, None, None, None], patched, qk[:, :, 1, heads].permute(2, 0, 1, 3))
    scores = (q @ k.transpose(-1, -2)) / dh**0.5  # (K, B, Q, K)
    allowed = torch.ones(T, T, dtype=torch.bool, device=pre.device)  # (Q, K)
    if model.cfg.causal:
        allowed = allowed.tril()
    if model.padded(task.attention_mask):  # a bidirectional model hides padded keys (a causal one need not)
        allowed = allowed & task.attention_mask.bool()[:, None, :]  # (B, Q, K)
    return F.softmax(scores.masked_fill(~allowed, float("-inf")), -1)  # (K, B, Q, K)
