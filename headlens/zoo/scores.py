"""Pre-computed dashboard scores for the zoo models, shipped next to their weights.

Scoring every head of a zoo model takes 1-4 s on a 2-core CPU, and in ``headlens dashboard``
that time sits between starting the server and the first drawn grid. So the zoo ships the table
the dashboard's default scan computes (``weights/<name>.scores.json``), keyed by the SHA-256 of
the weights and the scan settings. A table whose key does not match is ignored and the dashboard
scores as usual, so a stale file can cost time but never show wrong numbers.
``tests/test_zoo.py`` recomputes every shipped table and fails when one is out of date;
regenerate them with::

    python -m headlens.zoo.scores [NAME ...]     # every zoo model, or the ones named

Model calls: none when reading; :func:`main` loads and scores every zoo model.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from headlens.zoo import ZOO, weights_dir

if TYPE_CHECKING:
    import pandas as pd

FORMAT = 2  # bump when the file layout changes (2: the kv_head column)


def scores_path(name: str) -> Path:
    return weights_dir() / f"{name}.scores.json"


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _key(name: str, n_prompts: int, seed: int) -> dict[str, Any]:
    return {"format": FORMAT, "weights_sha256": _sha256(ZOO[name].weights_file), "n_prompts": int(n_prompts),
            "seed": int(seed)}


def read(name: str, n_prompts: int, seed: int) -> pd.DataFrame | None:
    """The shipped scores of zoo model ``name`` for this scan, or None (not a zoo model, no file,
    a key that does not match these weights and settings, or a registered detector, e.g. a
    ``headlens.detectors`` plugin, that the stored table neither scored nor skipped)."""
    if name not in ZOO or not ZOO[name].available or not scores_path(name).is_file():
        return None
    stored = json.loads(scores_path(name).read_text())
    if stored.get("key") != _key(name, n_prompts, seed):
        return None
    from headlens.detectors import all_detectors

    covered = set(stored["columns"].get("detector", [])) | set(stored["attrs"].get("skipped", {}))
    if {n for n, d in all_detectors().items() if d.default} - covered:
        return None
    import pandas as pd

    table = pd.DataFrame(stored["columns"]).astype(stored["dtypes"])
    table.attrs.update(stored["attrs"])
    return table


def write(name: str, table: pd.DataFrame, n_prompts: int, seed: int) -> Path:
    """Store ``table`` (the dashboard's scan of zoo model ``name``) next to its weights."""
    stored = {
        "key": _key(name, n_prompts, seed),
        "dtypes": {c: str(t) for c, t in table.dtypes.items()},
        "columns": {c: table[c].tolist() for c in table.columns},  # json floats round-trip exactly
        "attrs": table.attrs,
    }
    path = scores_path(name)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(stored, indent=0, default=str) + "\n")
    os.replace(tmp, path)
    return path


def main(names: list[str] | None = None) -> None:
    import sys

    import torch

    from headlens.app import helpers as hd
    from headlens.models.loading import load

    names = names if names is not None else sys.argv[1:]
    unknown = [n for n in names if n not in ZOO]
    if unknown:
        raise SystemExit(f"unknown zoo model(s) {', '.join(unknown)}; known: {', '.join(ZOO)}")
    torch.set_num_threads(1)
    for name, entry in ZOO.items():
        if not entry.available or (names and name not in names):
            continue
        table = hd.compute_scores(load(name), n_prompts=hd.DEFAULT_N_PROMPTS, seed=0)
        print(f"{write(name, table, hd.DEFAULT_N_PROMPTS, 0)}: {len(table)} rows")


if __name__ == "__main__":
    main()
