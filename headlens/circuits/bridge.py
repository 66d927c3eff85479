"""Edge patching on Hugging Face models, through TransformerLens' per-head q/k/v input forks.

Why it looks like this:

* **The forks.** With ``use_split_qkv_input`` the bridge gives every attention layer a pre-LayerNorm copy
  of the residual stream per query head (``hook_q_input`` ``(B, T, H, D)``) and per key/value head
  (``hook_k_input``/``hook_v_input`` ``(B, T, H_kv, D)``), each normalised on its own. Adding a sender's
  delta to one copy is exactly ``LN(resid_clean + delta)`` for that input, whatever the family's norm,
  rotary embedding, soft-cap or window.
* **Grouped-query attention.** A key/value copy is shared by its group. The receiver head's own
  ``z`` is kept from the patched layer and every other head's ``z`` is reset to the clean run's, so a
  k/v edge is the key or value *as that one query head reads it*; with ``group=True`` the whole
  group's heads keep theirs (the same as patching the group's slice of ``k_proj``/``v_proj``'s input).
* **A batch of edges at once.** ``K`` edges run as ``K`` copies of the batch in one forward, each copy
  with its own delta, fork and heads; edges of any receiver layers can share a forward. The naive
  reference runs the same hooks one edge per forward.
* Families whose bridge has no forks (GPT-J, OPT, BERT, RoBERTa today) get logits receivers only.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from headlens.circuits.nodes import CircuitError, Edge, kv_head, n_kv_heads
from headlens.interventions.metrics import Task
from headlens.interventions.sweep import task_logits


@contextlib.contextmanager
def forks(model: Any) -> Iterator[None]:
    """Turn the bridge's per-head q/k/v input forks on for a ``with`` block (restored after)."""
    bridge = model.bridge
    saved = bool(getattr(bridge.cfg, "use_split_qkv_input", False))
    saved_in = bool(getattr(bridge.cfg, "use_attn_in", False))
    try:
        if saved_in:
            bridge.set_use_attn_in(False)
        try:
            bridge.set_use_split_qkv_input(True)
        except NotImplementedError:
            raise CircuitError(f"{model.name}: this architecture's bridge has no per-head q/k/v input forks, so "
                               "edges into q, k or v cannot be patched; receivers=logits still work") from None
        yield
    finally:
        bridge.set_use_split_qkv_input(saved)
        if saved_in:
            bridge.set_use_attn_in(True)


def has_forks(model: Any) -> bool:
    """True when ``model``'s bridge offers per-head q/k/v input forks."""
    try:
        with forks(model):
            return True
    except CircuitError:
        return False


def kept_heads(model: Any, edge: Edge) -> list[int]:
    """Query heads of the receiver layer that keep their patched ``z``."""
    r = edge.receiver
    if not edge.group or edge.input == "q":
        return [r.head]
    size = model.cfg.n_heads // n_kv_heads(model)
    g = kv_head(model, r.head)
    return list(range(g * size, (g + 1) * size))


class BridgePatcher:
    """Logits of edges on a ``BridgeModel``; ``fast``: ``max_tokens`` rows x positions per forward."""

    def __init__(self, model: Any, task: Task, fast: bool = True, max_tokens: int = 8192) -> None:
        self.model, self.task, self.fast, self.max_tokens = model, task, fast, max_tokens
        L = model.cfg.n_layers
        names = [f"blocks.{layer}.attn.hook_z" for layer in range(L)]
        self.has_forks = has_forks(model)
        kwargs = {} if task.attention_mask is None else {"attention_mask": task.attention_mask}
        with torch.no_grad(), self._forks():
            self.clean_logits, cache = model.run_with_cache(task.tokens, names_filter=names, **kwargs)
        self.clean_z = [cache[n] for n in names]  # (B, T, H, d_head) per layer

    def _forks(self) -> contextlib.AbstractContextManager[None]:
        """Forks on whenever the family has them: clean and patched runs then share their numerics."""
        return forks(self.model) if self.has_forks else contextlib.nullcontext()

    def chunks(self, edges: Sequence[Edge], named: Any = None) -> list[list[Edge]]:
        if not self.fast:
            return [[e] for e in edges]
        B, T = self.task.tokens.shape
        per = max(1, self.max_tokens // (B * T))
        return [list(edges[i:i + per]) for i in range(0, len(edges), per)]

    def logits(self, chunk: Sequence[Edge], deltas: torch.Tensor, recv: torch.Tensor | None = None) -> torch.Tensor:
        """``(K, B, T, V)`` logits of ``K`` edges run as ``K`` copies of the batch; ``deltas`` ``(K, B, T, D)``,
        ``recv`` ``(K, B, T)`` the receivers' patched query positions (None: all)."""
        K, B, T, D = deltas.shape
        if not self.has_forks and any(e.receiver.kind == "head" for e in chunk):
            with forks(self.model):  # raises the one-line CircuitError
                pass
        flat = deltas.reshape(K * B, T, D)  # copy k owns rows k*B .. (k+1)*B
        fork_add, keep, final = fork_plan(self.model, chunk, B, recv)
        hooks = [(name, _add_fork(flat, items)) for name, items in fork_add.items()]
        hooks += [(f"blocks.{layer}.attn.hook_z", _splice(self.clean_z[layer].repeat(K, 1, 1, 1), items))
                  for layer, items in keep.items()]
        if final:
            hooks.append((f"blocks.{self.model.cfg.n_layers - 1}.hook_resid_post", _add_rows(flat, final)))
        mask = self.task.attention_mask
        task = Task(self.task.tokens.repeat(K, 1), self.task.positions.repeat(K, 1),
                    None if mask is None else mask.repeat(K, 1))
        with self._forks(), self.model.hooks(hooks):
            out = task_logits(self.model, task, 0)  # (K*B, T, V)
        return out.view(K, B, T, -1)


Keep = dict[int, list[tuple[slice, list[int], torch.Tensor | None]]]


def fork_plan(model: Any, chunk: Sequence[Edge], B: int, recv: torch.Tensor | None
              ) -> tuple[dict[str, list[tuple[slice, int]]], Keep, list[slice]]:
    """Where each copy of the batch is patched: ``fork_add[hook] = [(rows, fork index)]``, ``keep[layer] =
    [(rows, heads that keep their patched z, (B, T) query positions or None)]`` and the logits' rows."""
    fork_add: dict[str, list[tuple[slice, int]]] = {}
    keep: Keep = {}
    final: list[slice] = []
    for k, e in enumerate(chunk):
        rows = slice(k * B, (k + 1) * B)
        if e.receiver.kind == "logits":
            final.append(rows)
            continue
        r = e.receiver
        idx = r.head if e.input == "q" else kv_head(model, r.head)
        fork_add.setdefault(f"blocks.{r.layer}.attn.hook_{e.input}_input", []).append((rows, idx))
        keep.setdefault(r.layer, []).append((rows, kept_heads(model, e), None if recv is None else recv[k]))
    return fork_add, keep, final


def _add_fork(flat: torch.Tensor, items: list[tuple[slice, int]]) -> Any:
    """Every head's copy of the input gets the delta, not only the receiver's: a q/k norm over all heads
    (OLMo-2) then sees the stream the receiver reads, and the splice of ``hook_z`` keeps the receiver's output."""
    def hook(x: torch.Tensor, hook: Any) -> torch.Tensor:  # (K*B, T, n_copies, D): per-head pre-norm copies
        out = x.clone()
        for rows, _ in items:
            out[rows] = out[rows] + flat[rows].to(x)[:, :, None]
        return out

    return hook


def _splice(clean_z: torch.Tensor, items: list[tuple[slice, list[int], torch.Tensor | None]]) -> Any:
    """Clean ``z`` for every head of a copy but its receivers, and for those outside their query positions."""
    def hook(z: torch.Tensor, hook: Any) -> torch.Tensor:  # (K*B, T, H, d_head)
        out = z.clone()
        for rows, heads, mask in items:
            others = [h for h in range(z.shape[2]) if h not in heads]
            if others:
                out[rows, :, others] = clean_z[rows, :, others].to(z)
            if mask is not None:  # (B, T): the receivers' patched query positions
                m = mask[:, :, None, None]  # (B, T, 1, 1)
                out[rows, :, heads] = torch.where(m, out[rows, :, heads], clean_z[rows, :, heads].to(z))
        return out

    return hook


def _add_rows(flat: torch.Tensor, rows_list: list[slice]) -> Any:
    def hook(x: torch.Tensor, hook: Any) -> torch.Tensor:  # (K*B, T, D)
        out = x.clone()
        for rows in rows_list:
            out[rows] = out[rows] + flat[rows].to(x)
        return out

    return hook
