"""Edge patching on Hugging Face models, resumed at the receiver's layer with the bridge's own blocks.

Why it looks like this:

* **One clean forward, then only what changes.** Through the bridge every patched edge used to cost a whole
  forward. The clean forward records what each block was called with (the residual stream entering it, the
  rotary ``cos``/``sin``, the mask: whatever the family passes), every layer's ``hook_z``, and every layer's
  keys and values as attention scores them (after the rotary embedding, at ``_update_kv_cache``: the seam
  every attention of the bridge calls before its scores, where a key/value cache extends the keys while
  generating). A chunk of ``K`` edges into layer ``R`` then runs as ``K`` copies of the batch from block
  ``R`` on: the blocks are the bridge's own modules, so the family's norms, rotary embedding, soft-caps,
  windows, post-attention norms and MLPs are its own. In block ``R`` the receiver's q, k or v
  (``hook_q|k|v``, before the rotary embedding and any q/k norm) becomes the projection of
  ``LN(resid + delta)`` (the block's own input norm, the head's rows of ``W_Q|W_K|W_V``): what the forks
  compute for that one head, without a normed copy of the residual stream for every head.
* **Only the positions that change, per prompt.** A receiver patched only at query positions
  ``receiver_pos`` leaves every earlier position clean in every later layer. So the blocks run, for each
  prompt, only its positions from its first patched one to its end (``P``, ``(B, S)``: IOI's END is one
  position, wherever each prompt's END is), and attention reads every other position's clean keys and
  values: the new ones are scattered into the recorded ones at the seam, and the rows of the recorded mask,
  cos and sin are taken at ``P``. Block ``R`` runs on all positions when a key or value is patched before,
  in slices of ``max_tokens`` rows (a chunk is sized for ``P``), each taken at ``P`` at once.
* **Logits at the read positions only, one edge at a time.** A 50k vocabulary makes ``(K, B, T, V)`` the
  largest tensor of a run; the final norm and unembedding run per edge, at each prompt's read positions,
  into one buffer of clean logits (for ``logit_diff``, only the two answers' columns).

Equal to one full forward per edge through the forks (:class:`~headlens.circuits.bridge.BridgePatcher`,
``fast=False``) within float rounding; tested on every forked family.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from headlens.circuits.bridge import _splice, fork_plan, has_forks
from headlens.circuits.nodes import Edge
from headlens.circuits.positions import suffix_start
from headlens.interventions.metrics import Task

_DROP = ("cache", "past_key_values", "layer_past")  # the family's own cache: the seam stands in for it


def resumable(model: Any) -> bool:
    """True when ``model`` is bridged with the blocks, input norms, projections and seam the resumed path needs
    (and forks, which its reference, one full forward per edge, patches through)."""
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


class CleanRun:
    """One clean forward of a bridged model (or one under ``hooks``), recording what the resumed paths start from.

    Attributes:
        calls: per block, the ``(args, kwargs)`` it was called with (``args[0]``: the residual stream in).
        kv: per layer, the keys and values ``(B, H_kv, T, d)`` as attention scores them (``keys=True``).
        z: per layer, ``hook_z`` ``(B, T, H, d_head)``.
        final: ``(B, T, D)`` the residual stream entering the final norm.
        logits: ``(B, T, V)``.
    """

    def __init__(self, model: Any, task: Task, keys: bool = False, hooks: Sequence[tuple[str, Any]] = ()) -> None:
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
                self.logits, cache = model.run_with_cache(task.tokens, names_filter=names, **kwargs)
        finally:
            for h in handles:
                h.remove()
        self.z = [cache[n] for n in names[:L]]
        self.final = cache[names[-1]]

    def block(self, model: Any, layer: int, x: torch.Tensor, K: int, P: torch.Tensor | None = None) -> torch.Tensor:
        """Block ``layer`` on ``x`` ``(K*B, S, D)``: ``K`` copies of the batch at positions ``P`` (None: all)."""
        args, kwargs = self.calls[layer]
        T = args[0].shape[1]
        return _out(model.bridge.blocks[layer](x, *_fit(args[1:], T, K, P), **_fit(kwargs, T, K, P)))


def _out(y: Any) -> torch.Tensor:
    return y[0] if isinstance(y, tuple) else y


class ResumePatcher:
    """Logits of edges on a bridged model, resumed at each chunk's receiver layer (see the module docstring).

    ``columns``: ``(B, n)`` the vocabulary ids the metrics read per prompt (``logit_diff``: its answers);
    None: every logit of a read position is computed.
    """

    def __init__(self, model: Any, task: Task, max_tokens: int = 8192, columns: torch.Tensor | None = None,
                 hooks: Sequence[tuple[str, Any]] = ()) -> None:
        self.model, self.task, self.max_tokens, self.columns = model, task, max_tokens, columns
        b = model.bridge
        self.blocks = list(b.blocks)
        self.run = CleanRun(model, task, keys=True, hooks=hooks)  # under hooks: what "clean" means here
        self.clean_logits = self.run.logits
        self.record = Record([args[0] for args, _ in self.run.calls], self.run.kv, self.run.final)
        B, T = task.tokens.shape
        self.lengths = (task.attention_mask.sum(1) if task.attention_mask is not None
                        else torch.full((B,), T, device=task.tokens.device))  # (B,)
        # per-prompt positions need the mask as a tensor to take its rows; without one, a common suffix
        self.ragged = all(isinstance(kw.get("attention_mask"), torch.Tensor) and kw["attention_mask"].ndim == 4
                          for _, kw in self.run.calls)
        # the family's own transform after the unembedding (Gemma 2's soft-cap, Cohere's logit_scale), elementwise
        self.transform = getattr(getattr(b, "adapter", None), "apply_output_logits_transform", None)
        self._buf: torch.Tensor | None = None  # the logits buffer every chunk writes its read positions into
        self._dirty: tuple[torch.Tensor, ...] | None = None  # where the last chunk wrote (its index)

    def chunks(self, edges: Sequence[Edge], named: Any = None) -> list[list[Edge]]:
        """Edges grouped by receiver layer and first changed position, ``max_tokens`` rows x positions each."""
        B = self.task.tokens.shape[0]
        groups: dict[tuple[int, int], list[Edge]] = {}
        for e in edges:
            layer = e.receiver.layer if e.receiver.kind == "head" else len(self.blocks)
            groups.setdefault((layer, suffix_start([e], named)), []).append(e)
        out = []
        for (_, p0), group in sorted(groups.items()):
            span = max(self._span(e.pos, named, p0) for e in group)
            per = max(1, self.max_tokens // (B * max(1, span)))
            out += [group[i:i + per] for i in range(0, len(group), per)]
        return out

    def _span(self, pos: str, named: Any, p0: int) -> int:
        """Positions a chunk of edges patched at ``pos`` resumes (``S`` of :meth:`positions`): per prompt from its
        own ``pos`` to its end where positions are taken per prompt (IOI's END: one), else from ``p0`` on."""
        T = self.task.tokens.shape[1]
        idx = None if named is None else named.index.get(pos)
        if not self.ragged or idx is None:
            return T - p0
        return int(torch.where(idx >= 0, self.lengths - idx, 1).max())  # a prompt without pos: its last one

    def positions(self, recv: torch.Tensor | None) -> torch.Tensor | None:
        """``(B, S)`` the positions that can change, per prompt: from its first patched one to its end (None: all)."""
        if recv is None:
            return None
        B, T = recv.shape[1:]
        any_ = recv.any(0)  # (B, T): a copy patches this position
        first = torch.where(any_.any(1), any_.float().argmax(1), self.lengths - 1)  # (B,)
        if not self.ragged:
            first = first.min().expand(B)
        S = int((self.lengths - first).max())
        if S >= T:
            return None
        P = first[:, None] + torch.arange(S, device=recv.device)  # (B, S)
        return torch.minimum(P, (self.lengths - 1)[:, None])  # past a prompt's end: its last position again

    def logits(self, chunk: Sequence[Edge], deltas: torch.Tensor, recv: torch.Tensor | None = None) -> Iterator[torch.Tensor]:
        """Each edge's ``(B, T, V)`` logits in turn (one shared buffer: read each before the next);
        ``deltas`` ``(K, B, T, D)``, ``recv`` ``(K, B, T)`` the receivers' patched query positions."""
        P = self.positions(recv)
        try:
            if chunk[0].receiver.kind == "logits":
                x = (self.run.final[None] + deltas if P is None  # (K, B, T, D)
                     else _at(self.run.final, P, 1)[None] + _at(deltas, P, 2))  # (K, B, S, D)
            else:
                x = self._resume(chunk, deltas, recv, P)
        except NotRagged:
            self.ragged = False
            yield from self.logits(chunk, deltas, recv)
            return
        yield from self.read(x, P, deltas.shape[0])

    def suffix(self, layer: int, recv: torch.Tensor, hooks: Any, base: Record | None = None) -> Record:
        """One run resumed at block ``layer`` from ``base`` (None: the recorded run), equal to it except at the
        positions ``P`` that ``recv`` ``(B, T)`` can change, which run under the hooks ``hooks(P)`` gives."""
        base = self.record if base is None else base
        P = self.positions(recv[None])  # (B, S) or None: all
        new = Record(list(base.resid), list(base.kv), base.final)
        try:
            with self.model.hooks(hooks(P)):
                self._blocks(base.resid[layer] if P is None else _at(base.resid[layer], P, 1), layer, 1, P, base, new)
        except NotRagged:
            self.ragged = False
            return self.suffix(layer, recv, hooks, base)
        return new

    def read(self, x: torch.Tensor, P: torch.Tensor | None, K: int) -> Iterator[torch.Tensor]:
        """Each copy's ``(B, T, V)`` logits in turn (one shared buffer: read each before the next) from the final
        residual stream ``x`` ``(K*B, S, D)`` at ``P``, the recorded run's outside ``P`` and the read positions."""
        (B, T), D = self.task.tokens.shape, x.shape[-1]
        S = T if P is None else P.shape[1]
        x = x.reshape(K, B, S, D)
        Pf = torch.arange(T, device=x.device).expand(B, T) if P is None else P
        first = torch.ones_like(Pf, dtype=torch.bool)
        first[:, 1:] = Pf[:, 1:] != Pf[:, :-1]  # a position repeated past a prompt's end counts once
        b, j = (first & self.task.positions.gather(1, Pf)).nonzero(as_tuple=True)
        t = Pf[b, j]
        buf = self._clean_buffer()  # (B, T, V): unread and unchanged positions stay clean
        at = (b, t) if self.columns is None else (b[:, None], t[:, None], self.columns[b])  # cols (n, c)
        self._dirty = at
        for k in range(K):
            h = x[k][b, j]  # (n, D): one row per read (prompt, position)
            buf[at] = self._unembed(h, None if self.columns is None else at[2]).to(buf)
            yield buf

    def _clean_buffer(self) -> torch.Tensor:
        """The one ``(B, T, V)`` logits buffer of every chunk, clean again where the last chunk wrote: a fresh
        copy of the clean logits per chunk (132 MB on IOI with a 49k vocabulary) only churned the heap."""
        if self._buf is None:
            self._buf = self.clean_logits.clone()
        elif self._dirty is not None:
            self._buf[self._dirty] = self.clean_logits[self._dirty]
        self._dirty = None
        return self._buf

    def _unembed(self, h: torch.Tensor, cols: torch.Tensor | None = None) -> torch.Tensor:
        """``(n, V)`` logits of final residual rows ``h`` ``(n, D)``, or ``(n, c)`` at vocabulary ids ``cols``."""
        b = self.model.bridge
        if cols is None:
            logits = b.unembed(b.ln_final(h[None]))[0]
        else:
            x = b.ln_final(h[None])[0]  # (n, D)
            w = b.W_U.detach()  # (D, V)
            logits = torch.einsum("nD,Dnc->nc", x, w[:, cols].to(x))
            bias = getattr(b, "b_U", None)
            if bias is not None:
                logits = logits + bias.detach()[cols].to(x)
        return logits if self.transform is None else self.transform(logits)

    def _resume(self, chunk: Sequence[Edge], deltas: torch.Tensor, recv: torch.Tensor | None,
                P: torch.Tensor | None) -> torch.Tensor:
        """``(K*B, S, D)``: the residual stream after the last block at ``P``, from the receiver layer on."""
        K, B, T, _ = deltas.shape
        PR = P  # block R runs at P too unless a key or value is patched before a prompt's first position
        if P is not None:
            before = torch.arange(T, device=P.device)[None] < P[:, :1]  # (B, T)
            if any(bool((d.abs().sum(-1) * before).any()) for d in deltas):  # one copy at a time, not K
                PR = None
        # the chunk is sized for S positions (``chunks``); block R on all T of them holds K*B*T rows (IOI's k and
        # v edges at END: T/S times more), so it runs in slices of ``max_tokens`` rows, each taken at P at once
        per = max(1, self.max_tokens // (B * T)) if PR is None and P is not None else K
        x = torch.cat([self._receiver(chunk[i:i + per], deltas[i:i + per], None if recv is None else recv[i:i + per],
                                      PR, P) for i in range(0, K, per)])  # (K*B, S, D)
        return self._blocks(x, chunk[0].receiver.layer + 1, K, P)

    def _blocks(self, x: torch.Tensor, first: int, K: int, P: torch.Tensor | None, base: Record | None = None,
                new: Record | None = None) -> torch.Tensor:
        """``(K*B, S, D)``: blocks ``first``.. on ``x`` at ``P``, reading ``base``'s keys and values elsewhere (None:
        the recorded run's); ``new`` (``K`` = 1): becomes ``base`` with this run's rows at ``P``."""
        base = self.record if base is None else base
        with self._keys(P, K, base.kv, None if new is None else new.kv):
            for layer in range(first, len(self.blocks)):
                if new is not None:
                    new.resid[layer] = _put(base.resid[layer], P, x)
                x = self.run.block(self.model, layer, x, K, P)
        if new is not None:
            new.final = _put(base.final, P, x)
        return x

    def _receiver(self, chunk: Sequence[Edge], deltas: torch.Tensor, recv: torch.Tensor | None,
                  PR: torch.Tensor | None, P: torch.Tensor | None) -> torch.Tensor:
        """``(K*B, S, D)``: the receiver's block ``R`` with each copy's q, k or v patched, run at ``PR`` (None:
        all positions) and taken at ``P``; ``deltas`` ``(K, B, T, D)``, ``recv`` ``(K, B, T)``."""
        K, B, T, D = deltas.shape
        R = chunk[0].receiver.layer
        resid = self.run.calls[R][0][0]  # (B, T, D): the clean residual stream entering block R
        take = (lambda x, axis: x) if PR is None else (lambda x, axis: _at(x, PR, axis))
        hooks = input_hooks(self.model, chunk, take(deltas, 2), take(resid, 1))
        _, keep, _ = fork_plan(self.model, chunk, B, None if recv is None else take(recv, 2))
        hooks.append((f"blocks.{R}.attn.hook_z", _splice(take(self.run.z[R], 1).repeat(K, 1, 1, 1), keep[R])))
        with self.model.hooks(hooks), self._keys(PR, K):
            x = self.run.block(self.model, R, take(resid, 1).repeat(K, 1, 1), K, PR)
        if PR is None and P is not None:
            x = _at(x.view(K, B, T, D), P, 2).reshape(K * B, -1, D)
        return x

    def _keys(self, P: torch.Tensor | None, K: int, kv: list | None = None,
              out: list | None = None) -> contextlib.AbstractContextManager[None]:
        """Attention reads the recorded keys and values ``kv`` (None: the clean run's) except at ``P``, where the new
        ones go; ``out`` receives each layer's ``(K*B, H_kv, T, d)`` keys and values as attention scores them."""
        if P is None and out is None:
            return contextlib.nullcontext()
        kv = self.run.kv if kv is None else kv

        def scatter(layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            if P is not None:
                ck, cv = kv[layer]  # (B, H_kv, T, d): the recorded keys and values of this layer
                idx = P.repeat(K, 1)[:, None, :, None].expand(k.shape)  # (K*B, H_kv, S, d)
                k, v = ck.to(k).repeat(K, 1, 1, 1).scatter(2, idx, k), cv.to(v).repeat(K, 1, 1, 1).scatter(2, idx, v)
            if out is not None:
                out[layer] = (k, v)
            return k, v  # (K*B, H_kv, T, d)

        return _seam(self.blocks, scatter)


def input_hooks(model: Any, chunk: Sequence[Edge], deltas: torch.Tensor, resid: torch.Tensor) -> list:
    """Hooks on the receiver layer's ``hook_q|k|v`` ``(K*B, S, n, d_head)`` that replace each copy's q, k or v
    with the projection of ``LN(resid + delta)``: the block's own input norm (``ln1``), ``W_Q|W_K|W_V`` and
    bias. Every head's slice is replaced, not only the receiver's: a q/k norm over all heads (OLMo-2) then
    normalises what the receiver really computes from that stream, and the splice of ``hook_z`` keeps only
    the receiver's output. ``deltas`` ``(K, B, S, D)``."""
    K, B, S, D = deltas.shape
    block = model.bridge.blocks[chunk[0].receiver.layer]
    ln1 = block.ln1 if hasattr(block, "ln1") else torch.nn.Identity()  # OLMo-2: no norm before attention
    hooks = []
    for c in ("q", "k", "v"):
        ks = [k for k, e in enumerate(chunk) if e.input == c]
        if not ks:
            continue
        x = ln1((resid[None] + deltas[ks]).reshape(len(ks) * B, S, D)).view(len(ks), B, S, D)
        w = getattr(block.attn, f"W_{c.upper()}").detach()  # (n, D, d_head): every (key/value) head
        proj = torch.einsum("kbsD,nDd->kbsnd", x, w.to(x))  # (k, B, S, n, d_head)
        bias = getattr(block.attn, f"b_{c.upper()}", None)
        if bias is not None:
            proj = proj + bias.detach().to(x)  # (n, d_head)
        hooks.append((f"blocks.{chunk[0].receiver.layer}.attn.hook_{c}", _replace(ks, proj, K)))
    return hooks


def _replace(ks: list[int], proj: torch.Tensor, K: int) -> Any:
    def hook(x: torch.Tensor, hook: Any) -> torch.Tensor:  # (K*B, S, n, d_head): copy k owns rows k*B ..
        out = x.clone()
        view = out.view(K, -1, *x.shape[1:])  # (K, B, S, n, d_head)
        view[torch.tensor(ks)] = proj.to(x)
        return out

    return hook
