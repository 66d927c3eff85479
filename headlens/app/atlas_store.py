"""The atlas the dashboard's head page reads, kept on disk like the scores (:mod:`headlens.app.score_store`).

The head page needs every head's exemplars, reads and tested description: one
:func:`headlens.atlas.build.build_atlas` over a small sample of the built-in prose corpus (:data:`CONFIG`), once per
model. It is written under :func:`headlens.models.hf.gguf.cache_root` ``/dashboard-atlas/`` and read back by
every later start. The key is what the atlas depends on: the model's files (path, size and mtime), the atlas
settings, precision and device, a digest of the source of the packages it comes from (:data:`ATLAS_PACKAGES`),
and the headlens, torch and transformers versions; a file whose key does not match is built again, never
shown stale (``rm -r ~/.cache/headlens/dashboard-atlas`` clears them).

The file is gzipped JSON, never a pickle (headlens unpickles nothing: a cache file must not be able to run
code): the atlas' dataclasses as plain fields, the offset profile as nested lists. The exemplars' write
vectors are left out (the page shows the promoted and suppressed tokens read from them, not the vectors).

Model calls: none (this module reads and writes files; :mod:`headlens.app.cache` builds the atlas).
"""

from __future__ import annotations

import dataclasses
import gzip
import json
from pathlib import Path
from typing import Any

from headlens.app import score_store
from headlens.app.picker import fingerprint
from headlens.atlas.exemplars import AtlasConfig
from headlens.errors import OutputError
from headlens.models.files import atomic_write

FORMAT = 2  # bump when the key or the file layout changes
FOLDER = "dashboard-atlas"
ATLAS_PACKAGES = ("atlas", "detectors", "models", "probes", "readout")  # headlens' packages an atlas depends on
# 48 windows of 128 tokens (36 for exemplars, 12 held out): 29 s on SmolLM2 on two threads, 0.1 s on a
# zoo model; enough for the named heads' descriptions (docs/atlas.md); `headlens atlas` reads more. A model
# that cannot read the prose corpus (a zoo model over a few letters) reads the `repeats` corpus instead, in windows
# of 64 tokens: a vocabulary of a few dozen tokens then holds the planted repeat and no accidental ones.
CONFIG = AtlasConfig(n_windows=48, seq_len=128, k=20)
CONFIGS = (CONFIG, AtlasConfig(corpus="repeats", n_windows=48, seq_len=64, k=20))


def key(ref: str, placement: tuple[str, str], config: AtlasConfig = CONFIG) -> dict[str, Any]:
    """What a stored atlas must have been built from to be read back."""
    return {"format": FORMAT, "model": fingerprint(ref), "config": dataclasses.asdict(config),
            "dtype": placement[0], "device": placement[1], "code": score_store.source_digest(ATLAS_PACKAGES),
            **score_store.versions()}


def path(ref: str, placement: tuple[str, str], config: AtlasConfig = CONFIG) -> Path:
    """The file the atlas of ``ref`` is kept in (whether or not it exists)."""
    return score_store.path_for(ref, key(ref, placement, config), FOLDER, ".json.gz")


def read(ref: str, placement: tuple[str, str], config: AtlasConfig = CONFIG) -> Any | None:
    """The stored atlas (:class:`headlens.atlas.build.Atlas`), or None (none stored, another key, unreadable)."""
    want = key(ref, placement, config)
    try:
        with gzip.open(path(ref, placement, config), "rt", encoding="utf-8") as f:
            stored = json.load(f)
        if not isinstance(stored, dict) or stored.get("key") != want:
            return None
        return from_json(stored["atlas"])
    except (OSError, EOFError, ValueError, KeyError, TypeError):  # gzip, JSON and a layout of another version
        return None


def write(ref: str, atlas: Any, placement: tuple[str, str]) -> Path | None:
    """Store ``atlas`` under its own config (write vectors dropped); None when the cache folder cannot be written."""
    config = atlas.config
    target = path(ref, placement, config)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        stored = {"key": key(ref, placement, config), "atlas": to_json(atlas)}
        atomic_write(target, lambda tmp: _gzip_json(tmp, stored))  # a reader never sees half a file
    except (OSError, OutputError):
        return None
    return target


def _gzip_json(path: str, data: dict[str, Any]) -> None:
    with gzip.open(path, "wt", encoding="utf-8") as f:
        json.dump(data, f)


def to_json(atlas: Any) -> dict[str, Any]:
    """The atlas as plain JSON values (write vectors left out)."""
    ex = atlas.exemplars
    top = {name: [[{f.name: getattr(e, f.name) for f in dataclasses.fields(e) if f.name != "write"} for e in kept]
                  for kept in heads] for name, heads in ex.top.items()}
    return {"model": atlas.model, "strings": atlas.strings, "config": dataclasses.asdict(atlas.config),
            "seen": atlas.seen, "descriptions": [dataclasses.asdict(d) for d in atlas.descriptions],
            "exemplars": {"n_layers": ex.n_layers, "n_heads": ex.n_heads, "n_tokens": ex.n_tokens, "top": top,
                          "profile": {"mass": ex.profile.mass.tolist(), "first": ex.profile.first.tolist(),
                                      "rows": ex.profile.rows}}}


def from_json(d: dict[str, Any]) -> Any:
    """The :class:`headlens.atlas.build.Atlas` :func:`to_json` wrote."""
    import torch

    from headlens.atlas.build import Atlas
    from headlens.atlas.describe import Description
    from headlens.atlas.exemplars import Exemplar, Exemplars
    from headlens.atlas.reads import OffsetProfile

    e = d["exemplars"]
    top = {name: [[Exemplar(**x) for x in kept] for kept in heads] for name, heads in e["top"].items()}
    p = e["profile"]
    profile = OffsetProfile(torch.tensor(p["mass"], dtype=torch.float64), torch.tensor(p["first"], dtype=torch.float64),
                            p["rows"])
    descriptions = [Description(**{**x, "ci": tuple(x["ci"])}) for x in d["descriptions"]]
    return Atlas(d["model"], d["strings"], Exemplars(e["n_layers"], e["n_heads"], top, profile, e["n_tokens"]),
                 descriptions, AtlasConfig(**d["config"]), d["seen"])
