"""The head grid of a start's first paint, kept on disk as the figure it was, so the next start sends it unbuilt.

Why: a start whose scores are stored (:mod:`headlens.app.score_store`, a zoo model's shipped table) drew its first
grid by reading the table into pandas and building the figure with plotly, and pandas' import alone held the
page for half a second on a 2-core CPU (``benchmarks/dashboard_first_paint.py``). The grid a page opens on (each
head coloured by its strongest label, the strongest head selected) only changes with the scores, so the page
keeps it here the first time it draws it from them: the figure as plotly's JSON, the sidebar's colouring options
and the selected heads. The next start reads it with :mod:`json` and hands the figure to Streamlit as a dict;
pandas and torch are imported after the grid is sent.

The key is the stored table's file (path, size, mtime: a rescan or a regenerated shipped table is a new file),
the model's files (:func:`headlens.app.picker.fingerprint`), the scan settings, precision and device, the
headlens version and a digest of the source that draws the grid (:data:`GRID_SOURCES`). A record whose key does
not match is a miss: the page draws from the table as before and writes a new one.

Model calls: none; no pandas, no plotly (reads and writes JSON).
"""

from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path
from typing import Any

from headlens.app import score_store
from headlens.app.picker import fingerprint
from headlens.errors import OutputError
from headlens.models.files import write_text
from headlens.zoo import ZOO

FORMAT = 1  # bump when the record's layout changes
# headlens' modules whose code decides what the stored grid looks like (relative to the package)
GRID_SOURCES = ("viz/grid.py", "scoring/primary.py", "scoring/table.py", "app/views/grid.py", "app/page.py",
                "app/helpers.py", "app/grid_store.py")


@functools.cache
def code_digest() -> str:
    """A digest of :data:`GRID_SOURCES`: an edited grid, colouring rule or page is a new key."""
    root = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for name in GRID_SOURCES:
        h.update(name.encode())
        h.update((root / name).read_bytes())
    return h.hexdigest()[:16]


def table_file(ref: str, n_prompts: int, seed: int, corpus: str | None, placement: tuple[str, str]) -> Path | None:
    """The stored scores file the page reads for this scan (as :func:`headlens.app.cache.get_stored_scores`:
    a zoo model's shipped table for its default float32 scan, else the dashboard's own), or None."""
    from headlens.zoo import scores as shipped

    if not corpus and placement[0] == "float32" and ref in ZOO and shipped.scores_path(ref).is_file():
        return shipped.scores_path(ref)
    path = score_store.path_for(ref, score_store.key(ref, n_prompts, seed, corpus, placement))
    return path if path.is_file() else None


def key(ref: str, n_prompts: int, seed: int, corpus: str | None, placement: tuple[str, str]) -> dict[str, Any] | None:
    """What a stored grid must have been drawn from to be sent for this scan; None when no table is stored."""
    table = table_file(ref, n_prompts, seed, corpus, placement)
    if table is None:
        return None
    stat = table.stat()
    return {"format": FORMAT, "table": f"{table.resolve()}:{stat.st_size}:{stat.st_mtime_ns}",
            "model": fingerprint(ref), "n_prompts": int(n_prompts), "seed": int(seed), "corpus": corpus,
            "dtype": placement[0], "device": placement[1], "code": code_digest(),
            "headlens": score_store._version("headlens")}


def path_for(ref: str, key_: dict[str, Any]) -> Path:
    """The record's file: beside the stored tables (``rm -r .../dashboard-scores`` clears both)."""
    table = score_store.path_for(ref, key_)  # the model's name and the key's digest
    return table.with_name(table.stem + ".grid.json")


def read(ref: str, n_prompts: int, seed: int, corpus: str | None, placement: tuple[str, str]) -> dict[str, Any] | None:
    """The stored grid for this scan (``name``, ``n_layers``, ``n_heads``, ``options``, ``choice``, ``heads``,
    ``title``, ``figure``), or None: none stored, a key that does not match, a file that cannot be read."""
    try:
        want = key(ref, n_prompts, seed, corpus, placement)
        if want is None:
            return None
        record = json.loads(path_for(ref, want).read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and record.get("key") == want else None


def write(ref: str, record: dict[str, Any], n_prompts: int, seed: int, corpus: str | None,
          placement: tuple[str, str]) -> Path | None:
    """Keep ``record`` (:func:`read`'s fields but the key) for this scan; None when nothing is stored to key it
    by or the cache folder cannot be written."""
    try:
        want = key(ref, n_prompts, seed, corpus, placement)
        if want is None:
            return None
        path = path_for(ref, want)
        path.parent.mkdir(parents=True, exist_ok=True)
        return write_text(path, json.dumps({"key": want, **record}))  # whole or not at all
    except (OSError, OutputError):
        return None
