"""The streamed exemplar pass: each head's top-k contexts of a corpus under several rankings.

Why it looks like this:

* **Rankings** (docs/atlas.md): ``attention``, the strongest weight a
  query puts on a key that is neither the first token nor the query itself (its *off-rest* attention);
  ``write``, the norm of the head's write at the query; ``dla_pos`` / ``dla_neg``, its direct logit
  attribution to the token that actually comes next, both signs; ``sample``, query rows drawn uniformly at
  random (a reservoir: the k rows with the largest :func:`sample_key`, a hash of window, position and head,
  so chunks and shards merge like any ranking), each scored by its off-rest attention; a page shows them
  across the deciles of that score (:func:`deciles`), not only the top.
* **One rule each, called.** The write is :class:`headlens.readout.write.WritePath`'s (the head's whole write
  is minus its change when its ``z`` goes to zero, post-norms included); DLA is
  :func:`headlens.readout.dla.head_columns`, the head columns of :func:`headlens.readout.dla.decompose` by
  the same arithmetic, on the activations :func:`headlens.readout.dla.read_activations` reads, so the
  shares are the attribution table's.
* **O(heads x k) memory.** A batch's per-head scores ``(L*H, B*T)`` are folded into a
  :class:`~headlens.atlas.topk.RunningTopK` and dropped; only the survivors' token windows, attention rows
  and write vectors are copied out.
* **Each layer's pattern is reduced in its hook** (:meth:`_Batch.run`): its offset profile, each query
  row's strongest off-rest key and weight, and the band of weights an exemplar shows (``before`` keys back
  to ``after`` ahead); no ``(B, H, Q, K)`` outlives its layer. The forward stops at the final norm: DLA to
  the next token needs only that token's ``W_U`` column (:func:`headlens.readout.dla.head_columns`), never
  the ``(B, T, V)`` logits. The promoted/suppressed tokens are read from the kept write vectors
  once, after the pass (through the folded unembedding of :mod:`headlens.readout.ov`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from headlens.atlas.reads import OffsetProfile
from headlens.atlas.topk import RunningTopK

RANKINGS = ("attention", "write", "dla_pos", "dla_neg", "sample")
SAMPLED = "sample"  # the ranking by a random key: a uniform reservoir of query rows, shown across its deciles


@dataclass(frozen=True)
class AtlasConfig:
    """How an atlas reads its corpus.

    Attributes:
        corpus: ``"prose"``, ``"code"`` or a ``.txt`` / JSONL path.
        n_windows: windows of text read (a quarter of them, at most 256, held out to score descriptions).
        seq_len: tokens per window (capped at the model's context).
        k: exemplars kept per head and ranking (Neuronpedia-style pages show about 20).
        batch_size: windows per forward (speed only).
        before, after: tokens of context kept around an exemplar's query (the page shows them).
        n_top_tokens: promoted and suppressed tokens listed per exemplar.
        seed: which windows are drawn.
    """

    corpus: str = "prose"
    n_windows: int = 64
    seq_len: int = 128
    k: int = 20
    batch_size: int = 8
    before: int = 24
    after: int = 4
    n_top_tokens: int = 5
    seed: int = 0


@dataclass
class Exemplar:
    """One kept context: ``tokens`` of the window around the query, ``query`` and ``key`` indices into them,
    the head's ``attention`` over those tokens, the ranking's ``score``, and what it writes there."""

    window: int
    position: int
    score: float
    tokens: list[int]
    query: int
    key: int
    attention: list[float]
    write: torch.Tensor | None = None
    promoted: list[int] = field(default_factory=list)
    suppressed: list[int] = field(default_factory=list)


@dataclass
class Exemplars:
    """What the pass kept: ``top[ranking][layer * n_heads + head]`` is a head's exemplars, best first, and
    ``profile`` its attention by relative offset."""

    n_layers: int
    n_heads: int
    top: dict[str, list[list[Exemplar]]]
    profile: OffsetProfile
    n_tokens: int


def exemplar_pass(model: Any, windows: list[torch.Tensor], config: AtlasConfig | None = None,
                  progress: Callable[[int, int], None] | None = None, first: int = 0,
                  read_tokens: bool = True) -> Exemplars:
    """Stream ``windows`` (1-D token tensors, specials included) through ``model`` once (``first``: the index of
    ``windows[0]`` in the whole corpus, which exemplars record; a shard of a sharded pass starts past 0).
    ``read_tokens=False`` keeps each exemplar's write vector and leaves its promoted and suppressed tokens to
    :func:`top_tokens` (a sharded pass reads them once, for the exemplars that survive the merge).

    >>> import headlens
    >>> from headlens.atlas.corpus import corpus_windows
    >>> m = headlens.load("code")
    >>> ex = exemplar_pass(m, corpus_windows(m, "prose", 4, 32).prompts, AtlasConfig(k=3))
    >>> len(ex.top["attention"][0])
    3
    """
    from headlens.readout.parts import model_parts
    from headlens.readout.write import write_path

    config = config or AtlasConfig()
    L, H = model.cfg.n_layers, model.cfg.n_heads
    parts, write = model_parts(model), write_path(model)
    tops = {r: RunningTopK(L * H, config.k) for r in RANKINGS}
    profile = OffsetProfile.empty(L, H)
    done, n_tokens = 0, 0
    for start in range(0, len(windows), config.batch_size):
        rows = list(range(start, min(len(windows), start + config.batch_size)))
        batch = _Batch.run(model, parts, write, [windows[i] for i in rows], [first + i for i in rows], profile,
                           config)
        profile.count(batch.valid)
        for name, scores in batch.rankings().items():
            tops[name].merge(scores, lambda n, j, b=batch, s=name == SAMPLED: b.exemplar(n, j, config, s))
        batch.fill_writes()
        done, n_tokens = done + len(rows), n_tokens + int(batch.valid.sum())
        del batch  # before the next forward: two batches' activations are never alive at once
        if progress is not None:
            progress(done, len(windows))
    top = {name: t.payloads for name, t in tops.items()}
    for name, t in tops.items():  # each exemplar's score under its ranking (a sampled one has its own already)
        if name == SAMPLED:
            continue
        for row, kept in enumerate(t.payloads):
            for e, score in zip(kept, t.scores[row].tolist(), strict=False):
                e.score = score
    if read_tokens:
        top_tokens(model, top, config.n_top_tokens)
    return Exemplars(L, H, top, profile, n_tokens)


@dataclass
class _Batch:
    """One forward's reductions, every head's ranking scores and what an exemplar copies out of them."""

    rows: list[int]
    tokens: torch.Tensor  # (B, T)
    valid: torch.Tensor  # (B, T)
    best: torch.Tensor  # (B, L, H, Q): the strongest off-rest attention of each query row
    key: torch.Tensor  # (B, L, H, Q): where it is (the first such key)
    band: torch.Tensor  # (B, L, H, Q, before + after + 1): weights on keys q - before .. q + after
    before: int
    z: list[torch.Tensor]  # per layer (B, T, H, d_head): each head's output before W_O
    post: dict[int, torch.Tensor]  # layer -> (B, T, D): the post-attention norm's input, where there is one
    write: Any  # the model's WritePath
    w_o: list[torch.Tensor]  # per layer (H, d_head, D)
    write_norm: torch.Tensor  # (B, T, L, H): the norm of each head's whole write
    dla: torch.Tensor  # (B, T, L, H): DLA to the next token (NaN at the last real position)
    made: list[tuple[Exemplar, int, int, int]] = field(default_factory=list)  # (exemplar, head, b, q): no write yet
    ids: list[list[int]] | None = None  # tokens as python lists, made on the first exemplar
    lengths: list[int] | None = None  # each window's real length

    @classmethod
    def run(cls, model: Any, parts: Any, write: Any, seqs: list[torch.Tensor], rows: list[int],
            profile: OffsetProfile, config: AtlasConfig) -> _Batch:
        from headlens.readout.dla import head_columns, read_activations, reads

        B, T = len(seqs), max(len(s) for s in seqs)
        L, H, dev = model.cfg.n_layers, model.cfg.n_heads, model.device
        ids = torch.zeros(B, T, dtype=torch.long)
        mask = torch.zeros(B, T, dtype=torch.long)
        for b, s in enumerate(seqs):
            ids[b, : len(s)], mask[b, : len(s)] = s, 1
        keep = ~torch.eye(T, dtype=torch.bool, device=dev)  # (Q, K): not the query itself
        keep[:, 0] = False  # nor the first token
        at = (torch.arange(T, device=dev)[:, None] + torch.arange(-config.before, config.after + 1, device=dev)
              ).clamp(0, T - 1)  # (Q, W): the band's keys (clamped ones are never shown)
        W = at.shape[1]
        best = torch.zeros(B, L, H, T, device=dev)  # (B, L, H, Q)
        key = torch.zeros(B, L, H, T, dtype=torch.long, device=dev)  # (B, L, H, Q)
        band = torch.zeros(B, L, H, T, W, device=dev)  # (B, L, H, Q, W)

        def fold(layer: int) -> Any:
            def reduce(pattern: torch.Tensor) -> None:  # (B, H, Q, K)
                pattern = pattern.float()
                off = pattern * keep  # (B, H, Q, K): off-rest weights only
                best[:, layer], key[:, layer] = off.max(-1)
                band[:, layer] = pattern.gather(-1, at.expand(B, H, T, W))  # (B, H, Q, W)
                profile.add_layer(layer, pattern, mask)
            return reduce

        names = reads(parts, heads_only=True)
        names += [n for k, n in write.activations().items() if k.startswith("attn")]
        reduce = {f"blocks.{layer}.attn.hook_pattern": fold(layer) for layer in range(L)}
        got = read_activations(model, parts, ids.to(dev), mask.to(dev), None, names=names, reduce=reduce,
                               logits=False)
        nxt = torch.cat([ids[:, 1:], ids[:, :1]], dim=1)  # (B, T): the actual next token (wraps at the end)
        pair = torch.stack([nxt, torch.full_like(nxt, -1)], -1).to(dev)  # (B, T, 2)
        dla = head_columns(parts, got, pair).float()  # (B, T, L, H): query heads in table order
        has_next = torch.arange(T)[None, :] < (mask.sum(1, keepdim=True) - 1)  # (B, T)
        dla = torch.where(has_next[..., None, None].to(dla.device), dla, float("nan"))
        z = [got[name] for name in parts.z]  # per layer (B, T, H, d_head)
        post = {layer: got[f"blocks.{layer}.ln1_post.hook_in"] for layer in range(L)
                if f"blocks.{layer}.ln1_post.hook_in" in got}
        w_o = [write.w_o(layer) for layer in range(L)]  # (H, d_head, D) each, read once per batch
        norms = torch.stack([_write_norms(write, layer, z[layer], post.get(layer), w_o[layer])
                             for layer in range(L)], 2)  # (B, T, L, H)
        return cls(rows, ids, mask.bool(), best.cpu(), key.cpu(), band.cpu(), config.before, z, post, write, w_o,
                   norms.float().cpu(), dla.cpu())

    def rankings(self) -> dict[str, torch.Tensor]:
        """ranking -> ``(L*H, B*T)`` float64 scores, ``-inf`` where a position is not a candidate."""
        q = torch.arange(self.valid.shape[1])
        ok = (self.valid & (q >= 1))[:, None, None, :]  # (B, 1, 1, Q): the first token's row is every window's
        has_off = ok & (q >= 2)  # a row with a key that is neither the first token nor the query
        dla = self.dla.permute(0, 2, 3, 1)  # (B, L, H, Q)
        scores = {
            "attention": torch.where(has_off, self.best, float("-inf")),
            "write": torch.where(ok, self.write_norm.permute(0, 2, 3, 1), float("-inf")),
            "dla_pos": torch.where(ok, dla, float("-inf")),
            "dla_neg": torch.where(ok, -dla, float("-inf")),
        }
        B, L, H, Q = self.best.shape
        heads = torch.arange(L * H).reshape(L, H)
        key = sample_key(torch.tensor(self.rows)[:, None, None, None], q[None, None, None, :], heads[None, :, :, None])
        scores[SAMPLED] = torch.where(has_off, key, float("-inf"))  # (B, L, H, Q)
        return {k: v.permute(1, 2, 0, 3).reshape(L * H, B * Q) for k, v in scores.items()}  # (L*H, B*Q)

    def exemplar(self, head: int, j: int, config: AtlasConfig, sampled: bool = False) -> Exemplar:
        """Exemplar ``j`` (``b * T + q``) of flat head ``head`` (``layer * H + h``); ``sampled``: scored by its
        off-rest attention (its ranking's own score is a random key)."""
        if self.ids is None:  # python lists once per batch, not per exemplar
            self.ids, self.lengths = self.tokens.tolist(), self.valid.sum(1).tolist()
        b, q = divmod(j, len(self.ids[0]))
        layer, h = divmod(head, self.best.shape[2])
        lo, hi = max(0, q - config.before), min(self.lengths[b], q + 1 + config.after)
        shown = self.band[b, layer, h, q, lo - (q - self.before): hi - (q - self.before)]  # keys lo .. hi - 1
        key = int(self.key[b, layer, h, q]) if q > 1 else 0  # rows 0 and 1 have no off-rest key (write or DLA only)
        score = float(self.best[b, layer, h, q]) if sampled else 0.0
        e = Exemplar(self.rows[b], q, score, self.ids[b][lo:hi], q - lo, key - lo, shown.tolist())
        if not sampled:  # a sampled row shows where the head attends; its write is not read (the pass's cost)
            self.made.append((e, head, b, q))
        return e

    def fill_writes(self) -> None:
        """The write vector of each exemplar made since the last call, float16 as a resume shard keeps it.

        Head by head: one batched product where the write is linear (per exemplar the same bits as
        :meth:`~headlens.readout.write.WritePath.head` on one row), the write path itself where a post-norm follows.
        """
        by: dict[int, list[tuple[Exemplar, int, int]]] = {}
        for e, head, b, q in self.made:
            by.setdefault(head, []).append((e, b, q))
        for head, got in by.items():
            layer, h = divmod(head, self.best.shape[2])
            bs, qs = torch.tensor([b for _, b, _ in got]), torch.tensor([q for _, _, q in got])
            post = self.post.get(layer)
            if self.write.post_attn[layer] is None:
                z = self.z[layer][bs, qs, h]  # (n, d_head)
                w = self.w_o[layer][h].to(z).expand(len(got), *self.w_o[layer][h].shape)  # (n, d_head, D)
                vecs = -torch.bmm(-z[:, None, :], w)[:, 0]  # (n, D)
            else:
                vecs = torch.stack([-self.write.head(layer, h, -self.z[layer][b:b + 1, q:q + 1, h],
                                                     post[b:b + 1, q:q + 1], self.w_o[layer])[0, 0]
                                    for _, b, q in got])  # (n, D)
            for (e, _, _), vec in zip(got, vecs.half().float().cpu(), strict=True):
                e.write = vec.clone()  # its own storage: a view would keep the whole (n, D) block alive
        self.made.clear()


def sample_key(window: Any, position: Any, head: Any) -> torch.Tensor:
    """A uniform pseudo-random key in [0, 1) per (window, position, head) (broadcast tensors or ints): the same
    row gets the same key in any batch, chunk or shard, so the k largest keys are a uniform sample of rows."""
    x = (torch.as_tensor(window, dtype=torch.long) * 1_000_003 + torch.as_tensor(position, dtype=torch.long)) \
        * 65_537 + torch.as_tensor(head, dtype=torch.long)
    x = (x ^ (x >> 31)) & 0x7FFFFFFF  # fold the high bits in: 31 bits times the 30-bit constant fits int64
    for _ in range(3):  # a multiply-xorshift mix
        x = ((x ^ (x >> 15)) * 0x2C1B3C6D) & 0x7FFFFFFF
    return x.double() / float(1 << 31)


def sort_key(name: str, head: int) -> Callable[[Exemplar], float]:
    """How a merge orders ``name``'s exemplars of flat head ``head``, best first (:mod:`headlens.atlas.shards`)."""
    if name == SAMPLED:
        return lambda e: -float(sample_key(e.window, e.position, head))
    return lambda e: -e.score


def deciles(kept: list[Exemplar], n: int = 10) -> list[tuple[int, Exemplar]]:
    """``n`` of a sampled ranking's exemplars spread over the deciles of their score, highest first: for decile
    ``i`` (1 = top tenth) the exemplar at its middle rank. Fewer exemplars than ``n``: each with its own decile.

    >>> ex = [Exemplar(0, p, p / 20, [], 0, 0, []) for p in range(20)]
    >>> [(i, e.position) for i, e in deciles(ex, 4)]
    [(2, 17), (4, 12), (7, 7), (9, 2)]
    """
    ranked = sorted(kept, key=lambda e: -e.score)
    m = len(ranked)
    picks = sorted({int((i + 0.5) * m / n) for i in range(n)}) if m > n else list(range(m))
    return [(1 + 10 * r // max(m, 1), ranked[r]) for r in picks]


def _write_norms(write: Any, layer: int, z: torch.Tensor, attn: torch.Tensor | None, w_o: torch.Tensor
                 ) -> torch.Tensor:
    """``(B, T, H)``: the norm of each head's whole write in ``layer`` (minus its change when its ``z`` goes to
    zero, :meth:`~headlens.readout.write.WritePath.head`), from ``z`` ``(B, T, H, d_head)`` and the
    post-attention norm's input ``attn`` ``(B, T, D)`` (or None); one head's ``(B, T, D)`` write alive at a time."""
    return torch.stack([write.head(layer, h, -z[:, :, h], attn, w_o).norm(dim=-1)  # |-x| = |x|, bit for bit
                        for h in range(z.shape[2])], -1)


def top_tokens(model: Any, top: dict[str, list[list[Exemplar]]], n: int) -> None:
    """Each kept exemplar's most promoted and suppressed tokens, read from its write vector once.

    An exemplar kept under several rankings (same head, window and position: the same write) is read once. A
    sampled exemplar keeps no write: it gets the tokens of another ranking's exemplar of its row, else none.
    The ``(rows, V)`` product goes by :data:`COLUMNS` tokens of the folded unembedding at a time, each slice's
    extremes kept: a column of a product does not depend on the other columns computed with it, so the
    values (and their order) are the whole product's, without a ``(D, V)`` copy or a ``(rows, V)`` block.
    Rows go in chunks of :data:`CHUNK`, never one alone (a one-row product takes another kernel, other bits).
    """
    from headlens.readout.ov import folded_unembed

    rows: dict[tuple[int, int, int], list[Exemplar]] = {}
    for name, heads in sorted(top.items(), key=lambda kv: kv[0] == SAMPLED):  # the sampled ranking last
        for head, kept in enumerate(heads):
            for e in kept:
                if name != SAMPLED or (head, e.window, e.position) in rows:  # a sampled row has no write of its own
                    rows.setdefault((head, e.window, e.position), []).append(e)
    same, chunks, i = list(rows.values()), [], 0
    while i < len(same):
        chunks.append(same[i:i + (CHUNK - 1 if len(same) - i == CHUNK + 1 else CHUNK)])
        i += len(chunks[-1])
    writes = [torch.stack([es[0].write for es in chunk]) for chunk in chunks]  # (rows, D) each
    for es in same:  # the stacks hold them now
        for e in es:
            e.write = None
    best: list[list[tuple[torch.Tensor, torch.Tensor]]] = [[] for _ in chunks]  # per chunk, per slice: (values, ids)
    V = int(model.cfg.d_vocab)
    for start in range(0, V, COLUMNS):
        unembed = folded_unembed(model, slice(start, min(V, start + COLUMNS)))  # (D, <= COLUMNS)
        for c, x in enumerate(writes):
            logits = x.to(unembed) @ unembed  # (rows, <= COLUMNS)
            for sign, ids in zip((1.0, -1.0), _extremes(logits, n), strict=True):  # (rows, n) each
                best[c].append((sign * logits.gather(1, ids), ids + start))
    for chunk, found in zip(chunks, best, strict=True):
        up, down = (_merge(found[side::2], n) for side in (0, 1))
        for es, u, d in zip(chunk, up, down, strict=True):
            for e in es:
                e.promoted, e.suppressed = u, d


CHUNK = 256  # exemplar writes per product
COLUMNS = 8192  # tokens of the folded unembedding per product (a multiple of _extremes' block width)


def _merge(found: list[tuple[torch.Tensor, torch.Tensor]], n: int) -> list[list[int]]:
    """The n best of per-slice ``(values, ids)`` ``(rows, n)`` lists, best first, as ``topk`` orders them."""
    values, ids = torch.cat([v for v, _ in found], 1), torch.cat([i for _, i in found], 1)  # (rows, n * slices)
    return ids.gather(1, values.topk(n, -1).indices).tolist()


def _extremes(logits: torch.Tensor, n: int, width: int = 128) -> tuple[torch.Tensor, torch.Tensor]:
    """``logits.topk(n)`` and ``(-logits).topk(n)`` indices ``(rows, n)`` without a sort of every row: a row's
    n largest entries lie in the n blocks of ``width`` columns with the largest maxima (each such entry's
    block has a maximum at least the n-th largest entry, and at most n blocks do)."""
    rows, V = logits.shape
    if V < 4 * n * width:
        return logits.topk(min(n, V), -1).indices, (-logits).topk(min(n, V), -1).indices
    whole = V - V % width
    blocks = logits[:, :whole].reshape(rows, -1, width)  # (rows, V // width, width)
    out = []
    for sign, ends in ((1.0, blocks.amax(-1)), (-1.0, -blocks.amin(-1))):  # (rows, V // width) each
        cols = (ends.topk(n, -1).indices[..., None] * width + torch.arange(width)).reshape(rows, -1)  # (rows, n*w)
        if whole < V:  # the ragged tail: always a candidate
            cols = torch.cat([cols, torch.arange(whole, V).expand(rows, V - whole)], 1)
        out.append(cols.gather(1, (sign * logits.gather(1, cols)).topk(n, -1).indices))
    return out[0], out[1]
