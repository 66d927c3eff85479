"""Edge patching on Hugging Face models, resumed at the receiver's layer with the bridge's own blocks.

Why it looks like this:

* **One clean forward, then only what changes.** Through the bridge every patched edge used to cost a whole
  forward. The clean forward (forks on, as in every patched run) records what each block was called with
  (the residual stream entering it, the rotary ``cos``/``sin``, the mask: whatever the family passes),
  every layer's ``hook_z``, and every layer's keys and values as attention scores them (after the rotary
  embedding, at ``_update_kv_cache``: the seam every attention of the bridge calls before its scores, where a
  key/value cache extends the keys while generating). A chunk of ``K`` edges into layer ``R`` then runs as
  ``K`` copies of the batch from block ``R`` on: the blocks are the bridge's own modules, so the family's
  norms, rotary embedding, soft-caps, windows, post-attention norms and MLPs are its own. Block ``R`` gets
  the bridge patcher's fork hooks (:mod:`~headlens.circuits.bridge`); nothing before it runs again.
* **Positions.** A receiver patched only at query positions ``>= p0`` leaves every position before ``p0``
  clean in every later layer, so blocks after ``R`` run on positions ``p0 ..`` only and read the earlier
  positions' clean keys and values from the recorded ones through the same seam, as a key/value cache
  does. On IOI (``receiver_pos=END``, the last token) the layers after the receiver run one position.
* **Logits at the read positions only, one edge at a time.** A 50k vocabulary makes ``(K, B, T, V)`` the
  largest tensor of a run; the final norm and unembedding run per edge, at the positions the metric reads,
  into one buffer of clean logits.

Equal to one full forward per edge through the forks (:class:`~headlens.circuits.bridge.BridgePatcher`,
``fast=False``) within float rounding; tested on every forked family.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from headlens.circuits.bridge import _add_fork, _splice, fork_plan, forks, has_forks
from headlens.circuits.nodes import Edge
from headlens.circuits.positions import suffix_start
from headlens.interventions.metrics import Task

_DROP = ("cache", "past_key_values", "layer_past")  # the family's own cache: the seam stands in for it


def resumable(model: Any) -> bool:
    """True when ``model`` is bridged with forks, blocks and the seam the resumed path needs."""
    b = getattr(model, "bridge", None)
    if b is None or not hasattr(b, "blocks") or not hasattr(b, "ln_final") or not hasattr(b, "unembed"):
        return False
    if not all(hasattr(blk.attn, "_update_kv_cache") for blk in b.blocks):
        return False
    return has_forks(model)


@contextlib.contextmanager
def _seam(blocks: Sequence[Any], fn: Any) -> Iterator[None]:
    """Every block's attention calls ``fn(layer, k, v)`` for its keys and values ``(B, H_kv, S, d)``."""
    saved = [blk.attn.__dict__.get("_update_kv_cache") for blk in blocks]
    try:
        for layer, blk in enumerate(blocks):
            blk.attn._update_kv_cache = lambda k, v, _layer=layer, **kw: fn(_layer, k, v)
        yield
    finally:
        for blk, old in zip(blocks, saved, strict=True):
            if old is None:
                blk.attn.__dict__.pop("_update_kv_cache", None)
            else:
                blk.attn._update_kv_cache = old


def _fit(x: Any, B: int, T: int, K: int, p0: int) -> Any:
    """A block argument for ``K`` copies of the batch from position ``p0``: batch-sized tensors repeated,
    positional ones cut (a 4-D mask keeps its key axis: attention takes its last query rows)."""
    if isinstance(x, tuple | list):
        return type(x)(_fit(v, B, T, K, p0) for v in x)
    if isinstance(x, dict):
        return {k: _fit(v, B, T, K, p0) for k, v in x.items()}
    if not isinstance(x, torch.Tensor):
        return x
    if x.ndim == 1 and x.shape[0] == T and p0:
        return x[p0:]
    if 2 <= x.ndim < 4 and x.shape[1] == T and p0:
        x = x[:, p0:]
    if x.ndim >= 2 and x.shape[0] == B and B > 1 and K > 1:
        x = x.repeat(K, *([1] * (x.ndim - 1)))
    return x


class CleanRun:
    """One clean forward of a bridged model (forks on), recording what the resumed paths start from.

    Attributes:
        calls: per block, the ``(args, kwargs)`` it was called with (``args[0]``: the residual stream in).
        kv: per layer, the keys and values ``(B, H_kv, T, d)`` as attention scores them (``keys=True``).
        z: per layer, ``hook_z`` ``(B, T, H, d_head)``.
        final: ``(B, T, D)`` the residual stream entering the final norm.
        logits: ``(B, T, V)``.
    """

    def __init__(self, model: Any, task: Task, keys: bool = False) -> None:
        blocks = list(model.bridge.blocks)
        L = len(blocks)
        self.calls: list[tuple[tuple, dict]] = [((), {})] * L
        self.kv: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * L

        def record(layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            self.kv[layer] = (k, v)  # (B, H_kv, T, d) each
            return k, v

        def pre(layer: int) -> Any:
            def hook(mod: Any, args: tuple, kwargs: dict) -> None:
                kept = {k: v for k, v in kwargs.items() if k not in _DROP}
                self.calls[layer] = (args, kept | ({"use_cache": False} if "use_cache" in kept else {}))
            return hook

        names = [f"blocks.{layer}.attn.hook_z" for layer in range(L)] + [f"blocks.{L - 1}.hook_resid_post"]
        handles = [blk.register_forward_pre_hook(pre(i), with_kwargs=True) for i, blk in enumerate(blocks)]
        kwargs = {} if task.attention_mask is None else {"attention_mask": task.attention_mask}
        seam = _seam(blocks, record) if keys else contextlib.nullcontext()
        try:
            with torch.no_grad(), forks(model), seam:
                self.logits, cache = model.run_with_cache(task.tokens, names_filter=names, **kwargs)
        finally:
            for h in handles:
                h.remove()
        self.z = [cache[n] for n in names[:L]]
        self.final = cache[names[-1]]

    def block(self, model: Any, layer: int, x: torch.Tensor, B: int, K: int, p0: int = 0) -> torch.Tensor:
        """Block ``layer`` on ``x`` ``(K*B, T - p0, D)``: ``K`` copies of the batch from position ``p0``."""
        args, kwargs = self.calls[layer]
        T = args[0].shape[1]
        return _out(model.bridge.blocks[layer](x, *_fit(args[1:], B, T, K, p0), **_fit(kwargs, B, T, K, p0)))


class ResumePatcher:
    """Logits of edges on a bridged model, resumed at each chunk's receiver layer (see the module docstring)."""

    def __init__(self, model: Any, task: Task, max_tokens: int = 8192) -> None:
        self.model, self.task, self.max_tokens = model, task, max_tokens
        b = model.bridge
        self.blocks = list(b.blocks)
        self.run = run = CleanRun(model, task, keys=True)
        self.kv, self.clean_z, self.final = run.kv, run.z, run.final
        self.clean_logits = run.logits
        self.read = task.positions.any(0)  # (T,): the columns any metric row reads
        soft = float(getattr(b.cfg, "output_logits_soft_cap", -1.0) or -1.0)
        self.softcap = soft if soft > 0 else None

    def chunks(self, edges: Sequence[Edge], named: Any = None) -> list[list[Edge]]:
        """Edges grouped by receiver layer and first changed position, ``max_tokens`` rows x positions each."""
        B, T = self.task.tokens.shape
        groups: dict[tuple[int, int], list[Edge]] = {}
        for e in edges:
            layer = e.receiver.layer if e.receiver.kind == "head" else len(self.blocks)
            groups.setdefault((layer, suffix_start([e], named)), []).append(e)
        out = []
        for (_, p0), group in sorted(groups.items()):
            per = max(1, self.max_tokens // (B * max(1, T - p0)))
            out += [group[i:i + per] for i in range(0, len(group), per)]
        return out

    def _unembed(self, x: torch.Tensor) -> torch.Tensor:
        b = self.model.bridge
        logits = b.unembed(b.ln_final(x))  # (B, n, V)
        if self.softcap is not None:
            logits = self.softcap * torch.tanh(logits / self.softcap)
        return logits

    def logits(self, chunk: Sequence[Edge], deltas: torch.Tensor, recv: torch.Tensor | None = None) -> Iterator[torch.Tensor]:
        """Each edge's ``(B, T, V)`` logits in turn (one shared buffer: read each before the next);
        ``deltas`` ``(K, B, T, D)``, ``recv`` ``(K, B, T)`` the receivers' patched query positions."""
        K, B, T, D = deltas.shape
        hit = None if recv is None else recv.flatten(0, 1).any(0).nonzero()  # columns any copy patches
        p0 = 0 if hit is None or not len(hit) else int(hit.min())
        if chunk[0].receiver.kind == "logits":
            x = self.final[None] + deltas  # (K, B, T, D)
        else:
            x = self._resume(chunk, deltas, recv, p0).view(K, B, T - p0, D)  # (K, B, T - p0, D)
            x = torch.cat([self.final[None, :, :p0].expand(K, -1, -1, -1), x], dim=2)  # (K, B, T, D)
        cols = (self.read & (torch.arange(T, device=self.read.device) >= p0)).nonzero().flatten()
        buf = self.clean_logits.clone()  # (B, T, V): unread and unchanged positions stay clean
        for k in range(K):
            buf[:, cols] = self._unembed(x[k][:, cols]).to(buf)
            yield buf

    def _resume(self, chunk: Sequence[Edge], deltas: torch.Tensor, recv: torch.Tensor | None, p0: int) -> torch.Tensor:
        """``(K*B, T - p0, D)``: the residual stream after the last block, from the receiver layer on."""
        K, B, T, D = deltas.shape
        R = chunk[0].receiver.layer
        flat = deltas.reshape(K * B, T, D)  # copy k owns rows k*B .. (k+1)*B
        fork_add, keep, _ = fork_plan(self.model, chunk, B, recv)
        hooks = [(name, _add_fork(flat, items)) for name, items in fork_add.items()]
        hooks += [(f"blocks.{R}.attn.hook_z", _splice(self.clean_z[R].repeat(K, 1, 1, 1), keep[R]))]
        x = self.run.calls[R][0][0].repeat(K, 1, 1)  # (K*B, T, D): the clean residual stream entering block R
        with forks(self.model), self.model.hooks(hooks):
            x = self.run.block(self.model, R, x, B, K)[:, p0:]

        def prefix(layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            ck, cv = self.kv[layer]  # (B, H_kv, T, d): the clean keys and values of this layer
            ck, cv = ck[:, :, :p0].repeat(K, 1, 1, 1), cv[:, :, :p0].repeat(K, 1, 1, 1)
            return torch.cat([ck.to(k), k], dim=2), torch.cat([cv.to(v), v], dim=2)  # (K*B, H_kv, T, d)

        seam = _seam(self.blocks, prefix) if p0 else contextlib.nullcontext()
        with forks(self.model), seam:
            for layer in range(R + 1, len(self.blocks)):
                x = self.run.block(self.model, layer, x, B, K, p0)
        return x


def _out(y: Any) -> torch.Tensor:
    return y[0] if isinstance(y, tuple) else y
