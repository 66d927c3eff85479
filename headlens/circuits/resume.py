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
  cos and sin are taken at ``P``. Block ``R`` itself changes only at the patched queries (elsewhere its
  ``hook_z`` is the recorded one), so it runs there and at the positions a key or value is sent from (IOI's
  ``S2 -> END`` edges: its keys and values there are the patched ones; every other position keeps its clean
  ones), and the rest of ``P`` enters block ``R + 1`` as recorded. The last block runs whole only at the rows
  the metric reads (its keys and values at all of ``P``). Prompts whose spans differ
  run in up to three groups of similar span (IOI's ``S2`` spans 3-7 positions: each group only as wide as
  its longest), on slices of the clean run.
* **Logits at the read positions only, one edge at a time.** A 50k vocabulary makes ``(K, B, T, V)`` the
  largest tensor of a run; the final norm and unembedding run per edge, at each prompt's read positions,
  into one buffer of clean logits (for ``logit_diff``, only the two answers' columns).

Equal to one full forward per edge through the forks (:class:`~headlens.circuits.bridge.BridgePatcher`,
``fast=False``) within float rounding; tested on every forked family.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from headlens.circuits.bridge import _splice, fork_plan
from headlens.circuits.nodes import Edge
from headlens.circuits.positions import span_groups, suffix_start, with_positions
from headlens.circuits.recorded import (
    CleanRun,
    NotRagged,
    Record,
    _at,
    _put,
    _seam,
    final_logits,
    fold_kv,
    last_block_at,
    output_transform,
)
from headlens.interventions.logits import read_columns
from headlens.interventions.metrics import Task

DELTAS = 16384  # rows x positions of a chunk's senders' deltas (K, B, T, D): at IOI's END 128 copies held 0.2 GB
VIEWS = 4  # sliced clean runs a patcher keeps (:meth:`ResumePatcher._view`)


class ResumePatcher:
    """Logits of edges on a bridged model, resumed at each chunk's receiver layer (see the module docstring).

    ``columns``: ``(B, n)`` the vocabulary ids the metrics read per prompt (``logit_diff``: its answers);
    None: every logit of a read position is computed. ``run``: the clean run of ``task`` already recorded with its
    keys and logits (discovery's setup records it with the senders' activations), else one is recorded here.
    """

    def __init__(self, model: Any, task: Task, max_tokens: int = 8192, columns: torch.Tensor | None = None,
                 hooks: Sequence[tuple[str, Any]] = (), run: CleanRun | None = None) -> None:
        self.model, self.task, self.max_tokens, self.columns = model, task, max_tokens, columns
        self.blocks = list(model.bridge.blocks)
        # under hooks: what "clean" means here
        self.run = CleanRun(model, task, keys=True, hooks=hooks) if run is None or hooks or run.logits is None else run
        self.metric_task, self.clean_logits = self._compact(task, columns, self.run)
        B, T = task.tokens.shape
        self.lengths = (task.attention_mask.sum(1) if task.attention_mask is not None
                        else torch.full((B,), T, device=task.tokens.device))  # (B,)
        # per-prompt positions need the mask as a tensor to take its rows; without one, a common suffix
        self.ragged = all(isinstance(kw.get("attention_mask"), torch.Tensor) and kw["attention_mask"].ndim == 4
                          for _, kw in self.run.calls)
        self.transform = output_transform(model)
        self._buf: torch.Tensor | None = None  # the logits buffer every chunk writes its read positions into
        self._dirty: tuple[torch.Tensor, ...] | None = None  # where the last chunk wrote (its index)
        self._views: dict[tuple[int, ...], ResumePatcher] = {}  # per group of prompts (:meth:`_view`)

    @staticmethod
    def _compact(task: Task, columns: torch.Tensor | None, run: CleanRun) -> tuple[Task, torch.Tensor]:
        """The task the metrics read this patcher's logits with, and the clean logits: ``(B, T, V)`` and ``task``;
        with ``columns`` ``(B, n)``, only the read positions' ``(C,)`` columns of those ids, ``(B, C, n)``, and
        the task narrowed to them, its answers renumbered ``0..n-1`` (logit_diff reads nothing else): a 50k
        vocabulary made the clean logits and the buffer each 132 MB on IOI's 32 prompts, for 2 numbers a prompt."""
        if columns is None:
            return task, run.logits
        B, n = columns.shape
        cols = task.columns() if (c := read_columns(task.positions)) is None else c  # (C,)
        clean = run.logits[:, cols].gather(-1, columns[:, None, :].expand(B, len(cols), n))  # (B, C, n)
        run.logits = None  # the full (B, T, V) is not read again
        answers = torch.arange(n, device=columns.device).expand(B, n)
        return dataclasses.replace(task.at(cols), answers=answers), clean

    @property
    def record(self) -> Record:
        """The recorded run as :meth:`_blocks` reads it (a view's: its prompts' rows)."""
        return Record.of(self.run)

    def chunks(self, edges: Sequence[Edge], named: Any = None) -> list[list[Edge]]:
        """Edges grouped by receiver layer, first changed position and whether they patch queries only (their block
        runs at the patched queries alone, :meth:`_queries_only`), ``max_tokens`` rows x positions each."""
        B, T = self.task.tokens.shape
        groups: dict[tuple[int, int, bool], list[Edge]] = {}
        for e in edges:
            layer = e.receiver.layer if e.receiver.kind == "head" else len(self.blocks)
            groups.setdefault((layer, suffix_start([e], named), e.input == "q"), []).append(e)
        out = []
        for (_, p0, _), group in sorted(groups.items()):
            span = max(self._span(e.pos, named, p0) for e in group)
            per = max(1, min(self.max_tokens // (B * max(1, span)), DELTAS // (B * T)))  # its (K, B, T, D) deltas too
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
        """Each edge's ``(B, T, V)`` logits in turn (one shared buffer: read each before the next; with ``columns``
        ``(B, C, n)``, read with :attr:`metric_task`);
        ``deltas`` ``(K, B, T, D)``, ``recv`` ``(K, B, T)`` the receivers' patched query positions."""
        P = self.positions(recv)
        try:
            if chunk[0].receiver.kind == "logits":
                x = (self.run.final[None] + deltas if P is None  # (K, B, T, D)
                     else _at(self.run.final, P, 1)[None] + _at(deltas, P, 2))  # (K, B, S, D)
            else:
                x = self._grouped(chunk, deltas, recv, P)
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
        """Each copy's ``(B, T, V)`` logits in turn (one shared buffer: read each before the next; with ``columns``
        ``(B, C, n)``) from the final residual stream ``x`` ``(K*B, S, D)`` at ``P``, the recorded run's outside ``P``
        and the read positions."""
        (B, T), D = self.task.tokens.shape, x.shape[-1]
        S = T if P is None else P.shape[1]
        x = x.reshape(K, B, S, D)
        Pf = torch.arange(T, device=x.device).expand(B, T) if P is None else P
        b, j = self._reads(Pf).nonzero(as_tuple=True)
        t = Pf[b, j]
        buf = self._clean_buffer()  # (B, T, V) or (B, C, n): unread and unchanged positions stay clean
        cols = self.metric_task.cols
        at = (b, t if cols is None else torch.searchsorted(cols, t))
        self._dirty = at
        for k in range(K):
            h = x[k][b, j]  # (r, D): one row per read (prompt, position)
            buf[at] = self._unembed(h, None if self.columns is None else self.columns[b]).to(buf)
            yield buf

    def _clean_buffer(self) -> torch.Tensor:
        """The one logits buffer of every chunk (like :attr:`clean_logits`), clean again where the last chunk
        wrote: a fresh copy of the clean logits per chunk (132 MB on IOI with a 49k vocabulary) churned the heap."""
        if self._buf is None:
            self._buf = self.clean_logits.clone()
        elif self._dirty is not None:
            self._buf[self._dirty] = self.clean_logits[self._dirty]
        self._dirty = None
        return self._buf

    def _unembed(self, h: torch.Tensor, cols: torch.Tensor | None = None) -> torch.Tensor:
        """``(r, V)`` logits of final residual rows ``h`` ``(r, D)``, or ``(r, n)`` at vocabulary ids ``cols`` ``(r, n)``."""
        if cols is None:
            return final_logits(self.model, h[None])[0]
        b = self.model.bridge
        x = b.ln_final(h[None])[0]  # (r, D)
        w = b.W_U.detach()  # (D, V)
        logits = torch.einsum("rD,Drn->rn", x, w[:, cols].to(x))
        bias = getattr(b, "b_U", None)
        if bias is not None:
            logits = logits + bias.detach()[cols].to(x)
        return logits if self.transform is None else self.transform(logits)  # elementwise: the ids' own

    def _grouped(self, chunk: Sequence[Edge], deltas: torch.Tensor, recv: torch.Tensor | None,
                 P: torch.Tensor | None) -> torch.Tensor:
        """:meth:`_resume` over groups of prompts of similar spans (:func:`span_groups`), joined ``(K*B, S, D)``:
        ragged prompts padded to the longest span resume positions nobody reads (IOI's S2: 7 for a mean of 5)."""
        groups = span_groups(self.lengths - P[:, 0]) if P is not None and self.ragged else []
        if len(groups) < 2:
            return self._resume(chunk, deltas, recv, P)
        K, B, _, D = deltas.shape
        out: torch.Tensor | None = None
        for rows, s in groups:
            x = self._view(rows)._resume(chunk, deltas[:, rows], None if recv is None else recv[:, rows], P[rows, :s])
            if out is None:
                out = x.new_zeros(K, B, P.shape[1], D)  # (K, B, S, D): past a group's span, positions nobody reads
            out[:, rows, :s] = x.view(K, len(rows), s, D)
        return out.view(K * B, P.shape[1], D)

    def _view(self, rows: torch.Tensor) -> ResumePatcher:
        """This patcher on prompts ``rows`` only (its clean run sliced), for :meth:`_resume`; the last few are kept
        (each holds its prompts' share of the clean run: a grouping of SmolLM2's 32 IOI prompts, 0.12 GB)."""
        key = tuple(rows.tolist())
        if key not in self._views:
            if len(self._views) >= VIEWS:
                self._views.pop(next(iter(self._views)))
            view = copy.copy(self)
            view.run, view.lengths, view._views = self.run.rows(rows), self.lengths[rows], {}
            view.task = self.task.rows(rows)  # what its last block reads (:meth:`_read_columns`)
            self._views[key] = view
        return self._views[key]

    def _resume(self, chunk: Sequence[Edge], deltas: torch.Tensor, recv: torch.Tensor | None,
                P: torch.Tensor | None) -> torch.Tensor:
        """``(K*B, S, D)``: the residual stream after the last block at ``P``, from the receiver layer on."""
        K, B, T, _ = deltas.shape
        if P is not None and recv is not None:
            x = self._queries_only(chunk, deltas, recv, P)
            if x is not None:
                return self._blocks(x, chunk[0].receiver.layer + 1, K, P)
        PR = P  # block R runs at P, and where a key or value is patched before a prompt's first position, there too
        if P is not None:
            before = torch.arange(T, device=P.device)[None] < P[:, :1]  # (B, T)
            sent = torch.zeros_like(before)
            for d in deltas:  # one copy at a time, not K
                sent |= (d.abs().sum(-1) > 0) & before
            if bool(sent.any()):
                PR = with_positions(P, sent) if self.ragged else None
        # the chunk is sized for S positions (``chunks``); block R on all T of them holds K*B*T rows (IOI's k and
        # v edges at END: T/S times more), so it runs in slices of ``max_tokens`` rows, each taken at P at once
        wide = P is not None and PR is not P
        per = max(1, self.max_tokens // (B * (T if PR is None else PR.shape[1]))) if wide else K
        x = torch.cat([self._receiver(chunk[i:i + per], deltas[i:i + per], None if recv is None else recv[i:i + per],
                                      PR, P) for i in range(0, K, per)])  # (K*B, S, D)
        return self._blocks(x, chunk[0].receiver.layer + 1, K, P)

    def _queries_only(self, chunk: Sequence[Edge], deltas: torch.Tensor, recv: torch.Tensor,
                      P: torch.Tensor) -> torch.Tensor | None:
        """``(K*B, S, D)`` after block ``R`` at ``P`` for a chunk patched at some query positions only: the block's
        output changes only there (elsewhere its ``hook_z`` is the recorded one), so block ``R`` runs there alone
        (IOI's S2: 1 of the 3-7 positions resumed) and where a key or value is sent from (its new keys and values),
        and the rest of ``P`` is the recorded stream entering block ``R + 1``. None when prompts patch different
        numbers of positions."""
        K, B, T, D = deltas.shape
        at = recv.any(0)  # (B, T): a copy patches this query
        n = at.sum(1)
        if not bool((n == n[0]).all()) or not int(n[0]):
            return None
        Q = at.nonzero()[:, 1].view(B, -1)  # (B, Sq): each prompt's patched positions, in order
        if bool((Q >= self.lengths[:, None]).any()):  # a query in a prompt's padding: outside P, the general path
            return None
        R = chunk[0].receiver.layer
        sent = torch.zeros_like(at)
        if any(e.input != "q" for e in chunk):
            for d in deltas:  # one copy at a time, not K
                sent |= d.abs().sum(-1) > 0
            sent &= ~at & (torch.arange(T, device=at.device) < Q[:, -1:])  # keys a patched query can read
        PR = with_positions(Q, sent) if bool(sent.any()) else Q
        x = self._receiver(chunk, deltas, recv, PR, Q)  # (K*B, Sq, D)
        after = self.run.calls[R + 1][0][0] if R + 1 < len(self.blocks) else self.run.final  # (B, T, D)
        out = _at(after, P, 1).repeat(K, 1, 1)  # (K*B, S, D): the recorded stream after block R, at P
        idx = torch.searchsorted(P, Q).repeat(K, 1)  # (K*B, Sq): where each patched position sits in P
        return out.scatter_(1, idx[..., None].expand(-1, -1, D), x)  # in place: out is a fresh copy

    def _blocks(self, x: torch.Tensor, first: int, K: int, P: torch.Tensor | None, base: Record | None = None,
                new: Record | None = None) -> torch.Tensor:
        """``(K*B, S, D)``: blocks ``first``.. on ``x`` at ``P``, reading ``base``'s keys and values elsewhere (None:
        the recorded run's); ``new`` (``K`` = 1): becomes ``base`` with this run's rows at ``P``."""
        base, last = self.record if base is None else base, len(self.blocks) - 1
        J = self._read_columns(P) if new is None and first <= last else None  # the last block at the read rows only
        with self._keys(P, K, base.kv, None if new is None else new.kv):
            for layer in range(first, last if J is not None else last + 1):
                if new is not None:
                    new.resid[layer] = _put(base.resid[layer], P, x)
                x = self.run.block(self.model, layer, x, K, P)
        if J is not None:
            return last_block_at(self.run, self.model, x, K, P, J, base.kv[last])
        if new is not None:
            new.final = _put(base.final, P, x)
        return x

    def _reads(self, P: torch.Tensor) -> torch.Tensor:
        """``(B, S)`` bool: which of positions ``P`` ``(B, S)`` the metric reads, a position repeated past a prompt's
        end counted once."""
        first = torch.ones_like(P, dtype=torch.bool)
        first[:, 1:] = P[:, 1:] != P[:, :-1]
        return first & self.task.positions.gather(1, P)

    def _read_columns(self, P: torch.Tensor | None) -> torch.Tensor | None:
        """``(B, Sr)`` the columns of ``P`` ``(B, S)`` the metric reads (:meth:`read`'s rows), when every prompt reads
        as many and fewer than ``S`` (IOI's END: 1 of up to 7); else None."""
        if P is None or P.shape[1] < 2:
            return None
        reads = self._reads(P)  # (B, S)
        n = reads.sum(1)
        if not bool((n == n[0]).all()) or not 0 < int(n[0]) < P.shape[1]:
            return None
        return reads.nonzero()[:, 1].view(P.shape[0], -1)

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
        elif PR is not P:  # block R ran at P and the positions sent from: take P's rows of them
            x = _at(x.view(K, B, PR.shape[1], D), torch.searchsorted(PR, P), 2).reshape(K * B, -1, D)
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
                k, v = fold_kv(kv[layer], P, K, k, v)
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
