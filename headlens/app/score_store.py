"""Scores the dashboard computed, kept on disk so that the next start draws the grid at once.

Zoo models ship their default scan (:mod:`headlens.zoo.scores`); every other model (``smollm2``, a
``gguf:`` file, ``hf:<dir>``, a checkpoint) and every other scan is scored once, and the table is written
under :func:`headlens.models.hf.gguf.cache_root` ``/dashboard-scores/`` (``$HEADLENS_CACHE``, else
``~/.cache/headlens``). The next start reads it back without torch, like a shipped table (the page's first
paint), so SmolLM2's grid is drawn before the model has loaded.

The key is everything a score depends on: the model's files (path, size and mtime of each, as
:func:`headlens.app.picker.fingerprint`), the scan settings (prompts, seed, text source), precision and
device, and what computed it: the headlens version, a digest of the source of the packages scores come
from (:data:`SCORE_PACKAGES`), and the torch and transformers versions. A file whose key does not match is a
miss, so a stale table costs one scan, never wrong numbers; ``rm -r ~/.cache/headlens/dashboard-scores``
clears them all.

Model calls: none (this module reads and writes files; :mod:`headlens.app.cache` scores).
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from collections.abc import Iterable
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

from headlens.app.picker import fingerprint
from headlens.zoo import scores as shipped

if TYPE_CHECKING:
    import pandas as pd

FORMAT = 1  # bump when the key or the file layout changes
SCORE_PACKAGES = ("detectors", "models", "probes", "readout", "scoring")  # headlens' packages a score depends on
FOLDER = "dashboard-scores"


def code_digest() -> str:
    """A digest of the source of :data:`SCORE_PACKAGES`: an edited detector or probe is a new key."""
    return source_digest(SCORE_PACKAGES)


@functools.cache
def source_digest(packages: tuple[str, ...]) -> str:
    """A digest of the source of headlens' ``packages`` (each file's path and bytes)."""
    root = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            h.update(path.relative_to(root).as_posix().encode())
            h.update(path.read_bytes())
    return h.hexdigest()[:16]


def versions() -> dict[str, str]:
    """The versions a stored result depends on besides headlens' source."""
    return {name: _version(name) for name in ("headlens", "torch", "transformers")}


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "none"


def key(ref: str, n_prompts: int, seed: int, corpus: str | None, placement: tuple[str, str]) -> dict[str, Any]:
    """What a stored table must have been computed from to be read back for this scan."""
    return {"format": FORMAT, "model": fingerprint(ref), "n_prompts": int(n_prompts), "seed": int(seed),
            "corpus": corpus, "dtype": placement[0], "device": placement[1], "code": code_digest(), **versions()}


def path_for(ref: str, key_: dict[str, Any], folder: str = FOLDER, suffix: str = ".json") -> Path:
    """The file of the table under ``key_``: the model's name for people, the key's digest for the rest."""
    from headlens.models.hf.gguf import cache_root

    digest = hashlib.sha256(json.dumps(key_, sort_keys=True).encode()).hexdigest()[:20]
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", Path(ref.removeprefix("hf:").removeprefix("gguf:")).name)[:60]
    return cache_root() / folder / f"{name or 'model'}-{digest}{suffix}"


def stamp(ref: str, n_prompts: int, seed: int, corpus: str | None, placement: tuple[str, str]) -> int:
    """The stored table's modification time (ns), 0 when there is none: a cache key for reading it back."""
    path = path_for(ref, key(ref, n_prompts, seed, corpus, placement))
    try:
        return path.stat().st_mtime_ns
    except OSError:
        return 0


def read(ref: str, n_prompts: int, seed: int, corpus: str | None, placement: tuple[str, str],
         detectors: Iterable[str] = ()) -> pd.DataFrame | None:
    """The stored table for this scan, or None (none stored, a key that does not match, a file that cannot be
    read, or one of ``detectors`` neither scored nor skipped in it)."""
    want = key(ref, n_prompts, seed, corpus, placement)
    try:
        stored = json.loads(path_for(ref, want).read_text())
    except (OSError, ValueError):
        return None
    if stored.get("key") != want:
        return None
    try:
        return shipped.decode(stored, detectors)
    except (KeyError, TypeError, ValueError):  # a file from another layout: scan again
        return None


def write(ref: str, table: pd.DataFrame, n_prompts: int, seed: int, corpus: str | None,
          placement: tuple[str, str]) -> Path | None:
    """Store ``table``; None when the cache folder cannot be written (the next start scans again)."""
    want = key(ref, n_prompts, seed, corpus, placement)
    path = path_for(ref, want)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        return shipped.write_json(path, shipped.encode(table, want))
    except OSError:
        return None
