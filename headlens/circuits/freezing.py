"""Path patching by freezing: an edge's effect from the model's own forward, without the write-path rule.

The reference every edge type is checked against (tests, and the run-time check of every ``circuit`` run,
:mod:`headlens.circuits.check`). It never computes a sender's write: it replaces the sender's *activation*
in the model's own forward and lets the family's modules carry it (output projection, post-attention
norm, soft-caps, whatever the family has), so it cannot share a bug with :mod:`headlens.readout.write`.

For an edge ``S -> R.c`` two forwards run (one for a logits receiver):

1. **To the receiver.** ``S``'s activation replaced (``hook_z`` of its head, its MLP's output before any
   post-norm, or the embedding ``blocks.0.hook_resid_pre``), masked to ``sender_pos``; every other
   component that could carry the change (every other layer's ``hook_z``, every MLP's ``hook_mlp_out``)
   frozen at its clean value, so the residual stream ``R`` reads is the clean one plus ``S``'s change alone;
   at ``R``'s layer the inputs other than ``c`` (``hook_q|k|v``) frozen clean. ``R``'s ``z`` (or its
   pattern, for a receiver metric) is read there. For ``logits`` this run's logits are the answer.
2. **Downstream.** A clean forward with ``R``'s ``z`` replaced by the one just read (at ``receiver_pos``
   query positions; under grouped-query attention only ``R``, or its whole group for a per-group edge),
   everything downstream recomputed: the metric is read from its logits.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from headlens.circuits.bridge import kept_heads
from headlens.circuits.nodes import INPUTS, Edge, Node
from headlens.interventions.metrics import Task, get_metric
from headlens.interventions.sweep import task_logits


def sender_hook(model: Any, node: Node) -> str:
    """The hook of a sender's own activation: a head's ``hook_z``, an MLP's output before any post-norm."""
    if node.kind == "head":
        return f"blocks.{node.layer}.attn.hook_z"
    if node.kind == "embed":
        return "blocks.0.hook_resid_pre"
    raw = f"blocks.{node.layer}.ln2_post.hook_in"
    return raw if raw in model.hook_dict else f"blocks.{node.layer}.hook_mlp_out"


def _set(value: torch.Tensor) -> Callable[[torch.Tensor, Any], torch.Tensor]:
    return lambda x, hook: value.to(x)


def _keep(store: dict[str, torch.Tensor]) -> Callable[[torch.Tensor, Any], None]:
    def hook(x: torch.Tensor, hook: Any) -> None:
        store[hook.name] = x.detach()

    return hook


class _Reached(Exception):
    """Raised from a hook to end a forward once the layer an edge needs has run."""


class Freezer:
    """One clean run's activations, and each edge's patched run by freezing (see the module docstring).

    Args:
        model: a native GPT or a bridged model.
        task: the prompts (``tokens``, ``attention_mask``) and what the metric reads.
        replaced: sender -> its activation as the run's method replaces it, over the whole batch (a head's
            layer ``hook_z`` ``(B, T, H, d_head)``, an MLP's output before any post-norm or the embedding
            ``(B, T, D)``): :meth:`~headlens.circuits.senders.SenderDeltas.replacement`.
        named: the prompts' named positions, for edges restricted to them.
        upto: the last layer the edges need (head receivers under a receiver-local metric): forwards stop
            there. None: every layer runs and the clean logits are kept.
        patterns: layers whose clean ``hook_pattern`` to keep (receivers of a receiver-local metric).
    """

    def __init__(self, model: Any, task: Task, replaced: Callable[[Node], torch.Tensor], named: Any = None,
                 upto: int | None = None, patterns: Sequence[int] = ()) -> None:
        self.model, self.task, self.replaced, self.named = model, task, replaced, named
        L = model.cfg.n_layers if upto is None else upto + 1
        names = [f"blocks.{layer}.attn.hook_{c}" for layer in range(L) for c in (*INPUTS, "z")]
        names += [f"blocks.{layer}.hook_mlp_out" for layer in range(L) if f"blocks.{layer}.hook_mlp_out" in model.hook_dict]
        names += [f"blocks.{layer}.attn.hook_pattern" for layer in patterns]
        self.clean: dict[str, torch.Tensor] = {}
        self.clean_logits = self._run([(n, _keep(self.clean)) for n in names], None if upto is None
                                      else f"blocks.{upto}.attn.hook_z")  # (B, T, V), or None when stopped early
        self.patterns = {n: self.clean.pop(n) for n in [*self.clean] if n.endswith("hook_pattern")}

    def _run(self, hooks: list[tuple[str, Any]], stop: str | None = None) -> torch.Tensor | None:
        """The model's forward with ``hooks``; ended after hook ``stop`` when given (then None)."""
        def reached(x: torch.Tensor, hook: Any) -> None:
            raise _Reached

        extra = [] if stop is None else [(stop, reached)]  # after the hooks that read it
        with torch.no_grad(), self.model.hooks(hooks + extra):
            try:
                return task_logits(self.model, self.task, 0)  # (B, T, V)
            except _Reached:
                return None

    def _sender(self, edge: Edge) -> list[tuple[str, Any]]:
        """The hook that puts the sender's replaced activation in, at ``sender_pos`` only."""
        from headlens.circuits.positions import edge_masks

        s, name = edge.sender, sender_hook(self.model, edge.sender)
        new = self.replaced(s)  # (B, T, H, d_head) or (B, T, D)
        s_mask, _ = edge_masks(edge, self.named)

        def hook(x: torch.Tensor, hook: Any) -> torch.Tensor:
            out = x.clone()
            src = new.to(x)
            if s.kind == "head":
                out[:, :, s.head] = src[:, :, s.head]
            else:
                out = src.clone()
            if s_mask is not None:  # (B, T): elsewhere the sender stays clean
                m = s_mask.reshape(*s_mask.shape, *([1] * (x.dim() - 2)))
                out = torch.where(m, out, x)
            return out

        return [(name, hook)]

    def _frozen(self, edge: Edge) -> list[tuple[str, Any]]:
        """Every other component held at its clean output; at the receiver's layer its other inputs too."""
        s, r = edge.sender, edge.receiver
        skip_z = {s.layer} if s.kind == "head" else set()
        if r.kind == "head":
            skip_z.add(r.layer)
        hooks = [(n, _set(v)) for n, v in self.clean.items()
                 if (n.endswith("hook_z") and int(n.split(".")[1]) not in skip_z)
                 or (n.endswith("hook_mlp_out") and not (s.kind == "mlp" and int(n.split(".")[1]) == s.layer))]
        if r.kind == "head":
            hooks += [(f"blocks.{r.layer}.attn.hook_{c}", _set(self.clean[f"blocks.{r.layer}.attn.hook_{c}"]))
                      for c in INPUTS if c != edge.input]
        return hooks

    def to_receiver(self, edge: Edge, read: str = "z") -> torch.Tensor:
        """Run 1: the logits ``(B, T, V)`` (a logits receiver), or the receiver layer's ``hook_z`` / ``hook_pattern``."""
        seen: dict[str, torch.Tensor] = {}
        hooks = self._sender(edge) + self._frozen(edge)
        r = edge.receiver
        if r.kind == "logits":
            return self._run(hooks)
        name = f"blocks.{r.layer}.attn.hook_{read}"
        self._run([*hooks, (name, _keep(seen))], name)  # nothing after the receiver's layer runs
        return seen[name]

    def logits(self, edge: Edge) -> torch.Tensor:
        """``(B, T, V)``: the model's logits with ``edge`` patched by freezing."""
        from headlens.circuits.positions import edge_masks

        if edge.receiver.kind == "logits":
            return self.to_receiver(edge)
        r = edge.receiver
        z_new = self.to_receiver(edge)  # (B, T, H, d_head): the receiver layer, read with the edge patched
        heads = kept_heads(self.model, edge)
        _, r_mask = edge_masks(edge, self.named)

        def hook(z: torch.Tensor, hook: Any) -> torch.Tensor:  # (B, T, H, d_head)
            out = z.clone()
            new = z_new[:, :, heads].to(z)
            if r_mask is not None:  # (B, T): the receiver's patched query positions
                new = torch.where(r_mask[:, :, None, None], new, z[:, :, heads])
            out[:, :, heads] = new
            return out

        return self._run([(f"blocks.{r.layer}.attn.hook_z", hook)])

    def effect(self, edge: Edge, metric: str) -> np.ndarray:
        """``(B,)`` per prompt: ``metric(patched) - metric(clean)``, as the edge table's ``effect`` averages."""
        from headlens.circuits.local import is_receiver_metric

        if is_receiver_metric(metric):
            return self._receiver_effect(edge, metric)
        m = get_metric(metric)
        patched = m(self.logits(edge), self.task, self.clean_logits)
        clean = m(self.clean_logits, self.task, self.clean_logits)
        return (patched - clean).double().cpu().numpy()

    def _receiver_effect(self, edge: Edge, metric: str) -> np.ndarray:
        from headlens.circuits.local import receiver_detector, score, target_mask
        from headlens.circuits.positions import edge_masks

        h = edge.receiver.head
        targets = target_mask(self.model, self.task, receiver_detector(metric))  # (B, Q, K)
        _, rows = edge_masks(edge, self.named)
        patched = self.to_receiver(edge, "pattern")[:, h]  # (B, Q, K)
        name = f"blocks.{edge.receiver.layer}.attn.hook_pattern"
        if name not in self.patterns:
            self._run([(name, _keep(self.patterns))], name)
        clean = self.patterns[name][:, h]  # (B, Q, K)
        rows = None if rows is None else rows[None]
        both = score(torch.stack([patched, clean]).double(), targets, rows)  # (2, B)
        return (both[0] - both[1]).cpu().numpy()
