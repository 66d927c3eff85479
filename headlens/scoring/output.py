"""The one writer of headlens' result tables: scores (classify), training series (trajectory),
ablation sweeps (ablate, :func:`headlens.sweep`) and the provenance of reports.

Every table keeps its provenance, whatever the format: a ``provenance`` block in JSON
(``{"provenance": {...}, "rows": [...]}``), schema metadata under the ``headlens`` key in Parquet
and, because CSV has no room for it, a sidecar ``<name>.csv.json`` (``{"headlens": {...}}``) next
to a CSV, which itself stays plain (header on line one, for pandas, spreadsheets and DuckDB).
:func:`read_frame` restores it into ``df.attrs``. The destination is checked before any work
(:func:`check_output`) and files get the umask's mode (:mod:`headlens.models.files`).
"""

from __future__ import annotations

import datetime
import json
import os
from pathlib import Path
from typing import Any

from headlens.errors import OutputError
from headlens.models.files import atomic_write, atomic_writes, check_writable

SUFFIXES = (".csv", ".parquet", ".json")
META_KEY = "headlens"  # sidecar / Parquet metadata key


def check_output(path: str | os.PathLike) -> Path:
    """Refuse an unknown suffix or a destination that cannot be written (``OutputError``), before any work."""
    return check_writable(path, SUFFIXES)


def sidecar_path(path: str | os.PathLike) -> Path:
    """Where a CSV table's provenance lives: ``scores.csv`` -> ``scores.csv.json``."""
    p = Path(path)
    return p.with_name(p.name + ".json")


def provenance(model: Any = None, **settings: Any) -> dict[str, Any]:
    """What made a table: headlens version, the model (name, layers, heads, dtype, device; for a GGUF its file's
    ``source``: sha256 and quantization; the ``substitutions`` said at load), the time, ``settings``.

    >>> sorted(provenance(seed=0))
    ['created', 'headlens_version', 'seed']
    """
    from headlens import __version__

    out: dict[str, Any] = {"headlens_version": __version__,
                           "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")}
    if model is not None:
        out["model"] = str(getattr(model, "name", None) or type(model).__name__)
        for key in ("n_layers", "n_heads"):
            if hasattr(model, key):
                out[key] = int(getattr(model, key))
        try:
            param = next(model.parameters())
            out["dtype"] = str(param.dtype).removeprefix("torch.")
            out["device"] = str(param.device)
        except (AttributeError, StopIteration, TypeError):
            pass
        if source := getattr(model, "source", None):  # a GGUF's file, sha256 and quantization
            out["source"] = dict(source)
        if substitutions := list(getattr(model, "substitutions", None) or []):  # what ran in place of what was asked
            out["substitutions"] = substitutions
    out.update(settings)
    return out


def jsonable(attrs: dict[str, Any]) -> dict[str, Any]:
    """``attrs`` as plain JSON types (anything else as its ``str``)."""
    return json.loads(json.dumps(attrs, default=str))


def write_frame(df: Any, path: str | os.PathLike) -> Path:
    """Write ``df`` (.csv, .parquet or .json by suffix) atomically, its ``attrs`` as the provenance.

    Returns:
        the path written. Raises ``OutputError`` for an unknown suffix or a place that cannot be written.
    """
    p = check_output(path)
    meta = jsonable(dict(df.attrs))
    suffix = p.suffix.lower()
    if suffix == ".csv":
        side = json.dumps({META_KEY: meta}, indent=1) + "\n"  # the table and its sidecar: both or neither
        atomic_writes({p: lambda tmp: df.to_csv(tmp, index=False),
                       sidecar_path(p): lambda tmp: Path(tmp).write_text(side, encoding="utf-8")})
    elif suffix == ".json":
        rows = json.loads(df.to_json(orient="records", double_precision=15))  # float64 read back to ~1e-15
        atomic_write(p, lambda tmp: Path(tmp).write_text(json.dumps({"provenance": meta, "rows": rows}),
                                                          encoding="utf-8"))
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        table = pa.Table.from_pandas(df.assign(), preserve_index=False)
        schema_meta = {**(table.schema.metadata or {}), META_KEY.encode(): json.dumps(meta).encode()}
        atomic_write(p, lambda tmp: pq.write_table(table.replace_schema_metadata(schema_meta), tmp))
    return p


def read_frame(path: str | os.PathLike) -> Any:
    """Read a table written by :func:`write_frame`, its provenance back in ``df.attrs``."""
    import pandas as pd

    p = Path(path)
    suffix = p.suffix.lower()
    meta: dict[str, Any] = {}
    if suffix == ".csv":
        df = pd.read_csv(p)
        side = sidecar_path(p)
        if side.is_file():
            meta = json.loads(side.read_text(encoding="utf-8")).get(META_KEY, {})
    elif suffix == ".json":
        data = json.loads(p.read_text(encoding="utf-8"))
        if isinstance(data, list):  # a bare list of rows (ablate before 0.2)
            data = {"rows": data}
        meta = data.get("provenance", {})
        df = pd.DataFrame(data["rows"])
    elif suffix == ".parquet":
        import pyarrow.parquet as pq

        table = pq.read_table(p)
        raw = (table.schema.metadata or {}).get(META_KEY.encode())
        meta = json.loads(raw) if raw else {}
        df = table.to_pandas()
    else:
        raise OutputError(f"unknown table suffix {p.suffix!r}; expected one of {', '.join(SUFFIXES)}")
    df.attrs.update(meta)
    return df
