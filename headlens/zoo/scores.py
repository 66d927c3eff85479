"""Pre-computed dashboard scores for the zoo models, shipped next to their weights.

Scoring every head of a zoo model takes 1-4 s on a 2-core CPU, and in ``headlens dashboard``
that time sits between starting the server and the first drawn grid. So the zoo ships the table
the dashboard's default scan computes (``weights/<name>.scores.json``), keyed by the SHA-256 of
the weights and the scan settings. A table whose key does not match is ignored and the dashboard
scores as usual, so a stale file can cost time but never show wrong numbers.
``tests/training/test_zoo.py`` recomputes every shipped table and fails when one is out of date;
regenerate them with::

    python -m headlens.app.ship_scores [NAME ...]     # every zoo model, or the ones named

Model calls: none (this module reads and writes the files; :mod:`headlens.app.ship_scores` scores).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from headlens.zoo import ZOO, weights_dir

if TYPE_CHECKING:
    import pandas as pd

FORMAT = 3  # bump when the file layout changes (2: the kv_head column; 3: the rest column, sink only by name)


def scores_path(name: str) -> Path:
    return weights_dir() / f"{name}.scores.json"


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _key(name: str, n_prompts: int, seed: int) -> dict[str, Any]:
    return {"format": FORMAT, "weights_sha256": _sha256(ZOO[name].weights_file), "n_prompts": int(n_prompts),
            "seed": int(seed)}


def read(name: str, n_prompts: int, seed: int, detectors: Iterable[str] = ()) -> pd.DataFrame | None:
    """The shipped scores of zoo model ``name`` for this scan, or None (not a zoo model, no file,
    a key that does not match these weights and settings, or one of ``detectors`` (the scan's: the
    registered defaults, a ``headlens.detectors`` plugin among them) that the stored table neither
    scored nor skipped)."""
    stored = load(name, n_prompts, seed)
    return None if stored is None else decode(stored, detectors)


def load(name: str, n_prompts: int, seed: int) -> dict[str, Any] | None:
    """The shipped file of zoo model ``name`` as stored (:func:`encode`: no pandas) when its key matches these
    weights and settings, else None."""
    if name not in ZOO or not ZOO[name].available or not scores_path(name).is_file():
        return None
    stored = json.loads(scores_path(name).read_text())
    return stored if stored.get("key") == _key(name, n_prompts, seed) else None


def decode(stored: dict[str, Any], detectors: Iterable[str] = ()) -> pd.DataFrame | None:
    """The scores table in a stored dict (:func:`encode`), or None when it lacks one of ``detectors``."""
    covered = set(stored["columns"].get("detector", [])) | set(stored["attrs"].get("skipped", {}))
    if set(detectors) - covered:
        return None
    import pandas as pd

    table = pd.DataFrame(stored["columns"]).astype(stored["dtypes"])
    table.attrs.update(stored["attrs"])
    return table


def encode(table: pd.DataFrame, key: dict[str, Any]) -> dict[str, Any]:
    """A scores table as a JSON-ready dict under ``key`` (what it was computed from)."""
    return {
        "key": key,
        "dtypes": {c: str(t) for c, t in table.dtypes.items()},
        "columns": {c: table[c].tolist() for c in table.columns},  # json floats round-trip exactly
        "attrs": table.attrs,
    }


def write_json(path: Path, stored: dict[str, Any]) -> Path:
    """Write ``stored`` to ``path`` whole or not at all (written beside it, then renamed)."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(stored, indent=0, default=str) + "\n")
    os.replace(tmp, path)
    return path


def write(name: str, table: pd.DataFrame, n_prompts: int, seed: int) -> Path:
    """Store ``table`` (the dashboard's scan of zoo model ``name``) next to its weights."""
    return write_json(scores_path(name), encode(table, _key(name, n_prompts, seed)))
