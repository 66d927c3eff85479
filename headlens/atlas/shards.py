"""The exemplar pass shared out under ``torchrun``, and the merge that puts shards back together.

Each rank streams its contiguous block of whole batches (:meth:`headlens.scoring.distributed.Rank.batch_block`,
so every window sits in the batch it has in one process and its scores are the same bits), keeps its own
top-k, and rank 0 merges the ranks' top-k lists once after the loop: the k best of the union of per-shard
top-k lists are the k best overall. One rank's error ends every rank (``run_everywhere``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from headlens.atlas.exemplars import AtlasConfig, Exemplars, exemplar_pass
from headlens.atlas.reads import OffsetProfile


def merge(parts: list[Exemplars], k: int) -> Exemplars:
    """One :class:`Exemplars` from shards in corpus order: per head and ranking the k best of all shards'
    exemplars (ties keep the earlier shard, as the streamed merge keeps the earlier batch)."""
    first = parts[0]
    top = {}
    for name in first.top:
        top[name] = [sorted((e for p in parts for e in p.top[name][head]), key=lambda e: -e.score)[:k]
                     for head in range(len(first.top[name]))]
    profile = OffsetProfile(sum((p.profile.mass for p in parts), torch.zeros_like(first.profile.mass)),
                            sum((p.profile.first for p in parts), torch.zeros_like(first.profile.first)),
                            sum(p.profile.rows for p in parts))
    return Exemplars(first.n_layers, first.n_heads, top, profile, sum(p.n_tokens for p in parts))


def sharded_pass(model: Any, windows: list[torch.Tensor], config: AtlasConfig,
                 progress: Callable[[int, int], None] | None = None) -> Exemplars | None:
    """The exemplar pass over this rank's block of ``windows``, merged on rank 0 (None on the other ranks);
    in one process, the plain pass."""
    from headlens.scoring.distributed import current, gather_objects, run_everywhere

    rank = current()
    rows = rank.batch_block(len(windows), config.batch_size)
    mine = run_everywhere(rank, exemplar_pass, model, windows[rows.start:rows.stop], config, progress, rows.start)
    if rank.world_size == 1:
        return mine
    parts = gather_objects(rank, [mine])
    return None if parts is None else merge(parts, config.k)
