"""A recorded forward of a bridged model, and its blocks called again on part of it.

The seams every resumed path reads (:mod:`~headlens.circuits.resume`, discovery's faithfulness, the atlas's
substitution test): what each block was called with, every layer's keys and values as attention scores them
(the ``_update_kv_cache`` seam), ``hook_z``, and how a block's arguments are taken at some positions of some
prompts for ``K`` copies of the batch.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from headlens.circuits.bridge import has_forks
from headlens.interventions.metrics import Task

_DROP = ("cache", "past_key_values", "layer_past")  # the family's own cache: the seam stands in for it


def resumable(model: Any) -> bool:
    """True when ``model`` is bridged with the blocks, input norms, projections and seam the resumed path needs
    (and forks, which its reference, one full forward per edge, patches through). Causal only: every resumed path
    runs a prompt's positions from the first that changes, and an encoder's earlier positions read its later ones."""
    if not getattr(model, "is_causal", True):
        return False
    b = getattr(model, "bridge", None)
    if b is None or not hasattr(b, "blocks") or not hasattr(b, "ln_final") or not hasattr(b, "unembed"):
        return False
    for blk in b.blocks:
        if not (hasattr(blk, "ln1") and hasattr(blk.attn, "_update_kv_cache")
                and all(getattr(blk.attn, f"W_{c}", None) is not None for c in "QKV")):
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


class NotRagged(Exception):
    """A block argument that cannot be taken per prompt at ``P``: run every position instead."""


def _fit(x: Any, T: int, K: int, P: torch.Tensor | None) -> Any:
    """A block argument for ``K`` copies of the batch at positions ``P`` ``(B, S)`` (None: all): positional
    tensors taken at ``P`` (a 4-D mask: its query rows), batch-sized ones repeated ``K`` times."""
    if isinstance(x, tuple | list):
        return type(x)(_fit(v, T, K, P) for v in x)
    if isinstance(x, dict):
        return {k: _fit(v, T, K, P) for k, v in x.items()}
    if not isinstance(x, torch.Tensor):
        return x
    B = 0 if P is None else P.shape[0]
    if P is not None and x.ndim == 1 and x.shape[0] == T:
        if not bool((P == P[:1]).all()):
            raise NotRagged
        return x[P[0]]
    if P is not None and x.ndim == 4 and x.shape[-2] == T:  # (B|1, h, Q, K) mask: the rows of the queries at P
        x = x.expand(B, *x.shape[1:])
        x = x.gather(2, P[:, None, :, None].expand(B, x.shape[1], P.shape[1], x.shape[-1]))
    elif P is not None and 2 <= x.ndim < 4 and x.shape[1] == T:  # (B|1, T, ...): cos, sin, position ids
        x = x.expand(B, *x.shape[1:])
        x = x.gather(1, P.view(B, -1, *([1] * (x.ndim - 2))).expand(B, P.shape[1], *x.shape[2:]))
    if x.ndim >= 2 and K > 1 and (P is None or x.shape[0] == B) and x.shape[0] > 1:
        x = x.repeat(K, *([1] * (x.ndim - 1)))
    return x


def _at(x: torch.Tensor, P: torch.Tensor, axis: int) -> torch.Tensor:
    """``x`` taken at positions ``P`` ``(B, S)`` along its T axis ``axis`` (the axis before it is B)."""
    B, S = P.shape
    shape = [1] * x.ndim
    shape[axis - 1], shape[axis] = B, S
    return x.gather(axis, P.view(shape).expand(*x.shape[:axis], S, *x.shape[axis + 1:]))


def _put(x: torch.Tensor, P: torch.Tensor | None, rows: torch.Tensor) -> torch.Tensor:
    """``x`` ``(B, T, D)`` with ``rows`` ``(B, S, D)`` written at positions ``P`` ``(B, S)`` (None: ``rows`` is all)."""
    return rows if P is None else x.scatter(1, P[:, :, None].expand(rows.shape), rows)


@dataclass
class Record:
    """A forward at every position: the residual stream entering each block ``(B, T, D)``, each layer's keys and
    values as attention scores them ``(B, H_kv, T, d)``, and the stream after the last block."""

    resid: list[torch.Tensor]
    kv: list[tuple[torch.Tensor, torch.Tensor] | None]
    final: torch.Tensor

    @classmethod
    def of(cls, run: CleanRun) -> Record:
        """The record of a :class:`CleanRun` recorded with its keys (``keys=True``)."""
        return cls([args[0] for args, _ in run.calls], run.kv, run.final)


class CleanRun:
    """One clean forward of a bridged model (or one under ``hooks``), recording what the resumed paths start from.

    Attributes:
        calls: per block, the ``(args, kwargs)`` it was called with (``args[0]``: the residual stream in).
        kv: per layer, the keys and values ``(B, H_kv, T, d)`` as attention scores them (``keys=True``).
        z: per layer, ``hook_z`` ``(B, T, H, d_head)``.
        final: ``(B, T, D)`` the residual stream entering the final norm.
        logits: ``(B, T, V)``.
        extra: the activations of the hook names ``extra`` asked for, by name (what else the caller needs of the
            same clean forward: discovery's sender activations and attention patterns).
    """

    def __init__(self, model: Any, task: Task, keys: bool = False, hooks: Sequence[tuple[str, Any]] = (),
                 extra: Sequence[str] = ()) -> None:
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
            with torch.no_grad(), seam, model.hooks(list(hooks)):
                self.logits, cache = model.run_with_cache(task.tokens, names_filter=list(dict.fromkeys(
                    [*names, *extra])), **kwargs)
        finally:
            for h in handles:
                h.remove()
        self.z = [cache[n] for n in names[:L]]
        self.final = cache[names[-1]]
        self.extra = {n: cache[n] for n in extra}

    def rows(self, rows: torch.Tensor) -> CleanRun:
        """This run of prompts ``rows`` only: what resuming reads (block calls, keys and values, ``z``), no logits."""
        B = self.final.shape[0]

        def cut(x: Any) -> Any:
            if isinstance(x, tuple | list):
                return type(x)(cut(v) for v in x)
            if isinstance(x, dict):
                return {k: cut(v) for k, v in x.items()}
            return x[rows] if isinstance(x, torch.Tensor) and x.ndim >= 2 and x.shape[0] == B > 1 else x

        out = copy.copy(self)
        out.calls = [(cut(a), cut(kw)) for a, kw in self.calls]
        out.kv = [None if kv is None else (kv[0][rows], kv[1][rows]) for kv in self.kv]
        out.z, out.final, out.logits, out.extra = [z[rows] for z in self.z], self.final[rows], None, {}
        return out

    def block(self, model: Any, layer: int, x: torch.Tensor, K: int, P: torch.Tensor | None = None) -> torch.Tensor:
        """Block ``layer`` on ``x`` ``(K*B, S, D)``: ``K`` copies of the batch at positions ``P`` (None: all)."""
        args, kwargs = self.calls[layer]
        T = args[0].shape[1]
        return _out(model.bridge.blocks[layer](x, *_fit(args[1:], T, K, P), **_fit(kwargs, T, K, P)))


def output_transform(model: Any) -> Any:
    """The family's own elementwise transform after the unembedding (Gemma 2's soft-cap, Cohere's logit_scale), or
    None."""
    return getattr(getattr(model.bridge, "adapter", None), "apply_output_logits_transform", None)


def final_logits(model: Any, x: torch.Tensor) -> torch.Tensor:
    """``(B, S, V)`` logits of the final residual stream ``x`` ``(B, S, D)``: the bridge's final norm and unembedding,
    then :func:`output_transform`, as its forward does."""
    b = model.bridge
    logits = b.unembed(b.ln_final(x))
    transform = output_transform(model)
    return logits if transform is None else transform(logits)


def resumed_logits(model: Any, run: CleanRun, first: int, cols: torch.Tensor | None,
                   P: torch.Tensor | None = None) -> torch.Tensor:
    """``(B, C, V)`` logits at positions ``cols`` (None: all): blocks ``first``.. called on the stream ``run``
    recorded entering block ``first`` (the forward below it is the recorded one), then :func:`final_logits`.
    Hooks in force fire in the blocks that run: a whole forward's from block ``first`` on. ``P`` ``(B, S)``: the
    blocks run at those positions only (``cols`` are then columns of ``P``), attention reading the recorded keys
    and values elsewhere (``run`` recorded with ``keys=True``): where nothing before ``P`` is differentiated."""
    x = run.calls[first][0][0] if P is None else _at(run.calls[first][0][0], P, 1)  # (B, T|S, D)
    seam = contextlib.nullcontext() if P is None else _seam(
        model.bridge.blocks, lambda layer, k, v: fold_kv(run.kv[layer], P, 1, k, v))
    with seam:
        for layer in range(first, len(run.calls)):
            x = run.block(model, layer, x, 1, P)
    return final_logits(model, x if cols is None else x[:, cols])


def fold_kv(kv: tuple[torch.Tensor, torch.Tensor], P: torch.Tensor, K: int, k: torch.Tensor, v: torch.Tensor
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(K*B, H_kv, T, d)`` each: the recorded keys and values ``kv`` ``(B, H_kv, T, d)`` for ``K`` copies of the batch,
    with the new ones ``k``, ``v`` ``(K*B, H_kv, S, d)`` at positions ``P`` ``(B, S)``."""
    ck, cv = kv
    idx = P.repeat(K, 1)[:, None, :, None].expand(k.shape)  # (K*B, H_kv, S, d)
    # in place on the fresh repeat: an out-of-place scatter copied the (K*B, H_kv, T, d) keys once more
    return ck.to(k).repeat(K, 1, 1, 1).scatter_(2, idx, k), cv.to(v).repeat(K, 1, 1, 1).scatter_(2, idx, v)


class StopBlock(Exception):
    """Raised inside a block (at a hook or the seam) once what the caller needs of it is known: the rest of it, and
    of the forward, never runs."""


def last_block_at(run: CleanRun, model: Any, x: torch.Tensor, K: int, P: torch.Tensor, J: torch.Tensor,
                  kv: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """``(K*B, S, D)``: the last block on ``x`` ``(K*B, S, D)`` at positions ``P`` ``(B, S)``, its output right only at
    ``P``'s columns ``J`` ``(B, Sr)`` (the rows the metric reads; zero elsewhere). Nothing after the last block reads
    its other rows, and they cost the most: at IOI's ``S2`` 4 of its 5 positions. Its attention there still reads
    new keys and values at every position of ``P``: the block runs up to the seam at all of them (input norm,
    projections, rotary: a sixth of a block), stops, and then runs whole at ``J`` alone, its attention reading
    those keys and values and the recorded ones ``kv`` ``(B, H_kv, T, d)`` elsewhere, as the whole block would."""
    layer = len(run.calls) - 1
    blocks = model.bridge.blocks
    box: list[tuple[torch.Tensor, torch.Tensor]] = []

    def grab(_layer: int, k: torch.Tensor, v: torch.Tensor) -> Any:
        box.append((k, v))  # (K*B, H_kv, S, d): the new keys and values at P
        raise StopBlock

    with contextlib.suppress(StopBlock), _seam(blocks, grab):
        run.block(model, layer, x, K, P)
    keys, D = fold_kv(kv, P, K, *box[0]), x.shape[-1]
    at = J.repeat(K, 1)[:, :, None].expand(-1, -1, D)  # (K*B, Sr, D)
    with _seam(blocks, lambda _layer, _k, _v: keys):
        y = run.block(model, layer, x.gather(1, at), K, P.gather(1, J))  # (K*B, Sr, D)
    return x.new_zeros(x.shape).scatter_(1, at, y)


def _out(y: Any) -> torch.Tensor:
    return y[0] if isinstance(y, tuple) else y
