"""One atlas of one model: corpus -> exemplar pass -> held-out descriptions -> a table of exemplars.

Orchestration only: the pass is :mod:`headlens.atlas.exemplars`, the descriptions
:mod:`headlens.atlas.describe` (mixtures fit on :data:`FIT_WINDOWS` pass windows at most, spread evenly,
scored on the held-out ones), the substitution test :mod:`headlens.atlas.substitute`, the site
:mod:`headlens.atlas.site`.
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
from headlens.atlas.substitute import SUBST_MODES, SUBST_WINDOWS, Substitution

FIT_WINDOWS = 64  # pass windows the descriptions' mixtures are fit on (at most; spread evenly over the pass)


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
    substitution: Substitution | None = None

    def descriptions_frame(self) -> Any:
        """One row per head (``descriptions.csv``): ``model, layer, head, role, rule, agreement, ci_low, ci_high,
        mixture, coverage, share_kept, share_low, share_high, ablation_delta, share_how, subst_windows,
        description`` (``share_how``: ``exact`` where the substitution ran the head, ``estimated`` where its share
        kept and ablation effect are first-order estimates, with no interval; ``no_effect`` where it ran and its
        mean ablation moved the loss by no more than its interval, so it was not put back; empty where it did not
        run)."""
        import pandas as pd

        nan = float("nan")
        return pd.DataFrame([{"model": self.model, "layer": d.layer, "head": d.head, "role": d.role, "rule": d.rule,
                              "agreement": d.agreement, "ci_low": d.ci[0], "ci_high": d.ci[1],
                              "mixture": d.mixture_text(), "coverage": d.coverage,
                              "share_kept": nan if d.share_kept is None else d.share_kept,
                              "share_low": nan if d.share_ci is None else d.share_ci[0],
                              "share_high": nan if d.share_ci is None else d.share_ci[1],
                              "ablation_delta": nan if d.ablation_delta is None else d.ablation_delta,
                              "share_how": d.evidence.get("share_how", ""), "subst_windows": d.subst_windows,
                              "description": d.text}
                             for d in self.descriptions])

    def substitution_frame(self) -> Any:
        """``substitution.csv``: the loss with every described head substituted at once, then per layer
        (:meth:`headlens.atlas.substitute.Substitution.frame`); None when the test did not run."""
        return None if self.substitution is None else self.substitution.frame(self.model)

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
                progress: Callable[[int, int], None] | None = None, resume: Any = None,
                stage: Callable[[str], None] | None = None, subst_windows: int = SUBST_WINDOWS,
                subst: str = "estimate", subst_exact: int | None = None) -> Atlas | None:
    """The exemplars and descriptions of every head of ``model`` over ``config.corpus`` (or ``windows``: 1-D
    token tensors, specials included; a quarter of them, at most 256, are held out to score the descriptions).

    Under ``torchrun`` the pass is shared out by rank (:mod:`headlens.atlas.shards`); rank 0 describes the heads
    and returns the atlas, the other ranks return None. ``resume``: a folder where each chunk of the pass is
    saved as it is done; a rerun with the same model, corpus and settings loads those chunks. ``stage(name)``
    is told when each phase begins (``"reading the corpus"``, ``"describing the heads"``, ``"weighing the
    keys"`` (:mod:`headlens.atlas.keypref`), ``"substituting the descriptions"``); ``progress(done, total)``
    counts within each. ``subst_windows``: held-out windows the
    substitution test runs on (0: none); ``subst``, ``subst_exact``: how each head's share kept is obtained
    (:func:`headlens.atlas.substitute.substitute`'s ``subst`` and ``n_exact``).

    >>> import headlens
    >>> build_atlas(headlens.load("smollm2"), AtlasConfig(n_windows=32)).descriptions[0].role  # doctest: +SKIP
    'resting'
    """
    from headlens.models.token_text import readable_tokens

    config = config or AtlasConfig()
    if subst not in SUBST_MODES:  # before the pass, not after it
        from headlens.errors import ConfigError

        raise ConfigError(f"subst={subst!r} is not a substitution mode; expected one of {', '.join(SUBST_MODES)}")
    if windows is None:
        windows = corpus_windows(model, config.corpus, config.n_windows, config.seq_len, config.seed).prompts
    from headlens.atlas.describe import _classes
    from headlens.atlas.keypref import key_preferences
    from headlens.atlas.rules import candidate_rules
    from headlens.atlas.substitute import substitute

    tell = stage or (lambda name: None)
    seen, held = split(windows)
    tell("reading the corpus")
    exemplars = sharded_pass(model, seen, config, progress, resume)
    if exemplars is None:
        return None
    strings = readable_tokens(model, torch.arange(int(model.cfg.d_vocab)))
    n_fit = min(len(seen), FIT_WINDOWS)
    fit = [seen[(j * len(seen)) // n_fit] for j in range(n_fit)]
    tell("describing the heads")
    descriptions = describe(model, exemplars, held, config.batch_size, fit, strings, progress)
    tell("weighing the keys")
    descriptions = key_preferences(model, descriptions, fit, held, config.batch_size, _classes(model, strings),
                                   strings, progress)
    substitution = None
    if subst_windows > 0 and getattr(model, "is_causal", True):
        tell("substituting the descriptions")
        descriptions, substitution = substitute(model, descriptions, held, candidate_rules(),
                                                _classes(model, strings), subst_windows, progress, subst=subst,
                                                n_exact=subst_exact)
    held_rows = set(heldout_rows(len(windows)))
    return Atlas(str(getattr(model, "name", type(model).__name__)), strings, exemplars, descriptions, config,
                 [i for i in range(len(windows)) if i not in held_rows], substitution)
