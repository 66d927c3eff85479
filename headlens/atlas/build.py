"""One atlas of one model: corpus -> exemplar pass -> held-out descriptions -> a table of exemplars.

Orchestration only: the pass is :mod:`headlens.atlas.exemplars`, the descriptions
:mod:`headlens.atlas.describe`, the site :mod:`headlens.atlas.site`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from headlens.atlas.corpus import corpus_windows, heldout_rows, split
from headlens.atlas.describe import Description, describe
from headlens.atlas.exemplars import AtlasConfig, Exemplars
from headlens.atlas.shards import sharded_pass


@dataclass
class Atlas:
    """A model's atlas: its name, ``strings`` (readable text of every token id), the pass's exemplars,
    every head's description (layer-major), and ``seen``: each pass window's index in the corpus (exemplars
    count windows of the pass; the table gives the corpus index)."""

    model: str
    strings: list[str]
    exemplars: Exemplars
    descriptions: list[Description]
    config: AtlasConfig
    seen: list[int] | None = None

    def frame(self) -> Any:
        """The exemplars as one tidy pandas table (one row per head x ranking x rank), for Parquet."""
        import pandas as pd

        rows = []
        H = self.exemplars.n_heads
        for ranking, heads in self.exemplars.top.items():
            for flat, kept in enumerate(heads):
                layer, head = divmod(flat, H)
                for rank, e in enumerate(kept):
                    rows.append({"model": self.model, "layer": layer, "head": head, "ranking": ranking, "rank": rank,
                                 "score": e.score,
                                 "window": e.window if self.seen is None else self.seen[e.window], "position": e.position, "tokens": e.tokens,
                                 "text": [self.strings[t] for t in e.tokens], "query": e.query, "key": e.key,
                                 "attention": e.attention, "promoted": [self.strings[t] for t in e.promoted],
                                 "suppressed": [self.strings[t] for t in e.suppressed]})
        return pd.DataFrame(rows)


def build_atlas(model: Any, config: AtlasConfig | None = None, windows: list[torch.Tensor] | None = None,
                progress: Callable[[int, int], None] | None = None, resume: Any = None) -> Atlas | None:
    """The exemplars and descriptions of every head of ``model`` over ``config.corpus`` (or ``windows``: 1-D
    token tensors, specials included; a quarter of them, at most 256, are held out to score the descriptions).

    Under ``torchrun`` the pass is shared out by rank (:mod:`headlens.atlas.shards`); rank 0 describes the heads
    and returns the atlas, the other ranks return None. ``resume``: a folder where each chunk of the pass is
    saved as it is done; a rerun with the same model, corpus and settings loads those chunks.

    >>> import headlens
    >>> build_atlas(headlens.load("smollm2"), AtlasConfig(n_windows=32)).descriptions[0].role  # doctest: +SKIP
    'resting'
    """
    from headlens.models.token_text import readable_tokens

    config = config or AtlasConfig()
    if windows is None:
        windows = corpus_windows(model, config.corpus, config.n_windows, config.seq_len, config.seed).prompts
    seen, held = split(windows)
    exemplars = sharded_pass(model, seen, config, progress, resume)
    if exemplars is None:
        return None
    descriptions = describe(model, exemplars, held, config.batch_size)
    strings = readable_tokens(model, torch.arange(int(model.cfg.d_vocab)))
    held = set(heldout_rows(len(windows)))
    return Atlas(str(getattr(model, "name", type(model).__name__)), strings, exemplars, descriptions, config,
                 [i for i in range(len(windows)) if i not in held])
