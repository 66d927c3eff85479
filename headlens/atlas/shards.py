"""The exemplar pass in chunks: shared out under ``torchrun``, resumable from shards on disk, merged exactly.

Why it looks like this:

* **Chunks of whole batches.** The windows are cut into chunks of :data:`CHUNK_BATCHES` batches, counted
  from the first window, so every window sits in the batch it has in one process (the same float32 bits)
  whatever the number of ranks; rank ``r`` streams its contiguous block of chunks.
* **The merge is exact.** The k best of the union of per-chunk top-k lists are the k best overall; offset
  profiles add. A rank folds each chunk into its running list as the chunk is done (the k best of the kept
  and the new, the kept first on ties), so it holds one chunk's lists at a time, not every chunk's. Rank 0 gathers the ranks' merged lists once, after the loop (``run_everywhere`` first, so
  one rank's error ends every rank).
* **Promoted tokens once.** A chunk keeps each exemplar's write vector; the tokens it promotes and suppresses
  (a ``(D, V)`` product each) are read after the last merge, for the exemplars that survived it only.
* **Resume.** With a store, each chunk's top-k is saved (safetensors, fixed-width tensors, write vectors
  in float16) as soon as it is done, keyed by the weights, the windows and the settings; a rerun (any number of ranks) loads the
  chunks it finds and streams only the rest.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch

from headlens.atlas.exemplars import AtlasConfig, Exemplar, Exemplars, exemplar_pass, sort_key, top_tokens
from headlens.atlas.reads import OffsetProfile

CHUNK_BATCHES = 8  # batches per resumable chunk: a kill loses at most this much work


def merge(parts: list[Exemplars], k: int) -> Exemplars:
    """One :class:`Exemplars` from shards in corpus order: per head and ranking the k best of all shards'
    exemplars (ties keep the earlier shard, as the streamed merge keeps the earlier batch)."""
    first = parts[0]
    top = {}
    for name in first.top:
        top[name] = [sorted((e for p in parts for e in p.top[name][head]), key=sort_key(name, head))[:k]
                     for head in range(len(first.top[name]))]
    profile = OffsetProfile(sum((p.profile.mass for p in parts), torch.zeros_like(first.profile.mass)),
                            sum((p.profile.first for p in parts), torch.zeros_like(first.profile.first)),
                            sum(p.profile.rows for p in parts))
    return Exemplars(first.n_layers, first.n_heads, top, profile, sum(p.n_tokens for p in parts))


def sharded_pass(model: Any, windows: list[torch.Tensor], config: AtlasConfig,
                 progress: Callable[[int, int], None] | None = None, resume: Any = None) -> Exemplars | None:
    """The exemplar pass over this rank's chunks of ``windows``, merged on rank 0 (None on the other ranks).

    Args:
        resume: a folder for chunk shards (a rerun with the same model, windows and settings loads them).
    """
    from headlens.scoring.distributed import current, gather_objects, run_everywhere

    rank = current()
    size = CHUNK_BATCHES * config.batch_size
    chunks = [range(a, min(len(windows), a + size)) for a in range(0, len(windows), size)]
    mine = [chunks[i] for i in rank.block(len(chunks))]
    store = None if resume is None else run_everywhere(rank, _store, resume, model, windows, config)
    part = run_everywhere(rank, _my_chunks, model, windows, config, mine, store, progress)
    if rank.world_size > 1:
        parts = gather_objects(rank, [part])
        if parts is None:
            return None
        part = merge([p for p in parts if p is not None], config.k)
    top_tokens(model, part.top, config.n_top_tokens)  # once, for the exemplars that survived every merge
    return part


def _my_chunks(model: Any, windows: list[torch.Tensor], config: AtlasConfig, chunks: list[range], store: Any,
               progress: Callable[[int, int], None] | None) -> Exemplars | None:
    acc, done, total = None, 0, sum(len(c) for c in chunks)
    for c in chunks:
        key = f"windows-{c.start}-{c.stop}"
        got = None if store is None else store.load(key)
        if got is not None:
            part = from_tensors(*got)
        else:
            inner = None if progress is None else (lambda d, _t, base=done: progress(base + d, total))
            part = exemplar_pass(model, windows[c.start:c.stop], config, inner, c.start, read_tokens=False)
            if store is not None:
                tensors, facts = to_tensors(part, config)
                store.save(key, tensors, **facts)
        acc = part if acc is None else merge([acc, part], config.k)  # folded in as it comes: O(heads x k) kept
        done += len(c)
        if progress is not None:
            progress(done, total)
    return acc


def _store(root: Any, model: Any, windows: list[torch.Tensor], config: AtlasConfig) -> Any:
    from headlens import __version__
    from headlens.scoring.resume import ShardStore, digest, tensor_hash, weights_hash

    fp = digest(weights_hash(model), tensor_hash([(str(i), w) for i, w in enumerate(windows)]),
                dataclasses.asdict(config), CHUNK_BATCHES, __version__)
    return ShardStore(root, "atlas", fp)


FIELDS = ("window", "position", "query", "key")  # an exemplar's integer facts, one tensor each


def to_tensors(ex: Exemplars, config: AtlasConfig) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Fixed-width tensors of a chunk's exemplars (``-1`` / NaN pad) and the facts to rebuild it, for a shard."""
    W = config.before + config.after + 1
    out: dict[str, torch.Tensor] = {"mass": ex.profile.mass, "first": ex.profile.first}
    counts = {}
    for name, heads in ex.top.items():
        flat = [e for kept in heads for e in kept]
        counts[name] = [len(kept) for kept in heads]
        for f in FIELDS:
            out[f"{name}.{f}"] = torch.tensor([getattr(e, f) for e in flat], dtype=torch.long)
        out[f"{name}.score"] = torch.tensor([e.score for e in flat], dtype=torch.float64)
        out[f"{name}.tokens"] = _pad([e.tokens for e in flat], W, -1, torch.long)
        out[f"{name}.attention"] = _pad([e.attention for e in flat], W, float("nan"), torch.float32)
        writes = [e.write for e in flat if e.write is not None]  # a sampled exemplar has none
        out[f"{name}.write"] = torch.stack(writes).half() if writes and len(writes) == len(flat) else torch.zeros(0)
    return out, {"counts": counts, "shape": [ex.n_layers, ex.n_heads], "rows": ex.profile.rows,
                 "n_tokens": ex.n_tokens}


def _pad(rows: list[list[Any]], width: int, fill: float, dtype: torch.dtype) -> torch.Tensor:
    out = torch.full((len(rows), width), fill, dtype=dtype)  # (n, width)
    for i, r in enumerate(rows):
        out[i, : len(r)] = torch.tensor(r, dtype=dtype)
    return out


def from_tensors(t: dict[str, torch.Tensor], facts: dict[str, Any]) -> Exemplars:
    """The chunk :func:`to_tensors` saved."""
    top = {}
    for name, counts in facts["counts"].items():
        flat = []
        for i in range(sum(counts)):
            n = int((t[f"{name}.tokens"][i] >= 0).sum())
            ints = {f: int(t[f"{name}.{f}"][i]) for f in FIELDS}
            flat.append(Exemplar(score=float(t[f"{name}.score"][i]), tokens=t[f"{name}.tokens"][i, :n].tolist(),
                                 attention=t[f"{name}.attention"][i, :n].tolist(),
                                 write=t[f"{name}.write"][i].float() if len(t[f"{name}.write"]) else None, **ints))
        it = iter(flat)
        top[name] = [[next(it) for _ in range(c)] for c in counts]
    L, H = facts["shape"]
    return Exemplars(L, H, top, OffsetProfile(t["mass"], t["first"], facts["rows"]), facts["n_tokens"])
