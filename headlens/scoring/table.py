"""The scores table: one schema, defined once, validated before anything is written.

Long (tidy) format, one row per head x detector::

    model, layer, head, kv_head, detector, score, ci_low, ci_high, baseline, lift, n_positions, n_prompts, label

Rows are per *query* head. ``kv_head`` is the key/value group the query head reads from under
grouped- or multi-query attention (Llama, Mistral, Qwen2, Gemma ...): query head ``h`` of ``H`` shares
key/value head ``h // (H // H_kv)`` (Hugging Face's ``repeat_kv`` order). Without GQA it equals ``head``.
``label`` is a bool: this head carries this detector's label by the rule in HEAD_SCORES.md.
Extra columns may follow the schema's (``headlens classify --confirm`` adds the ablation
columns of :mod:`headlens.interventions.confirm`). Provenance (headlens version, probe settings, seed, thresholds) lives in ``df.attrs`` and
travels with the file: a ``provenance`` key in JSON, schema metadata in Parquet and, because CSV has
no room for it, a sidecar ``<name>.csv.json`` next to a CSV (the CSV itself stays plain: header on
the first line, so ``pandas.read_csv``, spreadsheets and DuckDB read it as is). :func:`read_table`
restores it.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from headlens.errors import HeadlensError, OutputError

COLUMNS: dict[str, str] = {  # column -> pandas dtype kind: O object/str, i int, f float, b bool
    "model": "O",
    "layer": "i",
    "head": "i",
    "kv_head": "i",
    "detector": "O",
    "score": "f",
    "ci_low": "f",
    "ci_high": "f",
    "baseline": "f",
    "lift": "f",
    "n_positions": "i",
    "n_prompts": "i",
    "label": "b",
}
SUFFIXES = (".csv", ".parquet", ".json")
_META_KEY = "headlens"


def kv_heads(n_heads: int, n_kv_heads: int | None = None) -> list[int]:
    """The key/value head of each query head: ``kv_heads(4, 2) == [0, 0, 1, 1]``.

    >>> kv_heads(8, 1), kv_heads(3)
    ([0, 0, 0, 0, 0, 0, 0, 0], [0, 1, 2])
    """
    n_kv = n_heads if n_kv_heads is None else int(n_kv_heads)
    if n_kv < 1 or n_heads % n_kv:
        raise HeadlensError(f"n_heads={n_heads} is not a multiple of n_kv_heads={n_kv}")
    return [h // (n_heads // n_kv) for h in range(n_heads)]


def n_kv_heads(model: Any) -> int:
    """A model's key/value head count (``n_heads`` for models without grouped-query attention)."""
    return int(getattr(model.cfg, "n_kv_heads", None) or model.n_heads)


def empty_table() -> Any:
    """A table with the schema and no rows."""
    import pandas as pd

    return pd.DataFrame({c: pd.Series(dtype={"O": object, "i": "int64", "f": "float64", "b": bool}[k])
                         for c, k in COLUMNS.items()})


def validate(df: Any) -> Any:
    """Check ``df`` against the schema; returns it, or raises ``HeadlensError`` naming the problem."""
    cols = list(df.columns)
    if cols[: len(COLUMNS)] != list(COLUMNS):  # extra columns (e.g. ablation confirmation) may follow
        raise HeadlensError(f"scores table columns are {cols}; expected {list(COLUMNS)} first")
    for col, kind in COLUMNS.items():
        got = df[col].dtype.kind
        ok = got == kind or (kind == "O" and got in "OSUT") or (kind == "f" and got in "fi")
        if not ok and len(df):
            raise HeadlensError(f"scores table column {col!r} has dtype {df[col].dtype}; expected kind {kind!r}")
    if len(df):
        if (df["layer"] < 0).any() or (df["head"] < 0).any():
            raise HeadlensError("scores table has negative layer or head ids")
        key = ["model", "layer", "head", "detector"] + (["checkpoint"] if "checkpoint" in df.columns else [])
        if df.duplicated(key).any():  # a training series repeats each head once per checkpoint
            raise HeadlensError(f"scores table has duplicate ({', '.join(key)}) rows")
    return df


def check_output_path(path: str | os.PathLike) -> Path:
    """Fail early (``OutputError``) on an unknown suffix or a folder we cannot write to."""
    p = Path(path)
    if p.suffix.lower() not in SUFFIXES:
        raise OutputError(f"unknown output suffix {p.suffix or '(none)'!r} in {str(path)!r}; expected one of "
                          f"{', '.join(SUFFIXES)}")
    parent = p.parent if str(p.parent) else Path(".")
    if not parent.is_dir():
        raise OutputError(f"cannot write {str(path)!r}: folder {str(parent)!r} does not exist")
    if not os.access(parent, os.W_OK) or (p.exists() and not os.access(p, os.W_OK)):
        raise OutputError(f"cannot write {str(path)!r}: permission denied")
    if p.is_dir():
        raise OutputError(f"cannot write {str(path)!r}: it is a folder")
    return p


def sidecar_path(path: str | os.PathLike) -> Path:
    """Where a CSV table's provenance lives: ``scores.csv`` -> ``scores.csv.json``."""
    p = Path(path)
    return p.with_name(p.name + ".json")


def _write_atomic_text(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent if str(path.parent) else ".", prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def _jsonable(attrs: dict[str, Any]) -> dict[str, Any]:
    return json.loads(json.dumps(attrs, default=str))


def write_table(df: Any, path: str | os.PathLike) -> Path:
    """Validate and write ``df`` (CSV, Parquet or JSON by suffix) atomically, provenance included."""
    p = check_output_path(path)
    validate(df)
    meta = _jsonable(dict(df.attrs))
    fd, tmp = tempfile.mkstemp(dir=p.parent if str(p.parent) else ".", prefix=f".{p.name}.", suffix=".tmp")
    os.close(fd)
    try:
        suffix = p.suffix.lower()
        if suffix == ".csv":
            df.to_csv(tmp, index=False)
        elif suffix == ".json":
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump({"provenance": meta, "rows": json.loads(df.to_json(orient="records"))}, f)
        else:
            import pyarrow as pa
            import pyarrow.parquet as pq

            table = pa.Table.from_pandas(df.assign(), preserve_index=False)
            schema_meta = dict(table.schema.metadata or {})
            schema_meta[_META_KEY.encode()] = json.dumps(meta).encode()
            pq.write_table(table.replace_schema_metadata(schema_meta), tmp)
        os.replace(tmp, p)
        if suffix == ".csv":
            _write_atomic_text(sidecar_path(p), json.dumps({_META_KEY: meta}, indent=1) + "\n")
    except OSError as err:
        raise OutputError(f"cannot write {str(path)!r}: {err.strerror or err}") from None
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return p


def read_table(path: str | os.PathLike) -> Any:
    """Read a table written by :func:`write_table`, with its provenance back in ``df.attrs``."""
    import pandas as pd

    p = Path(path)
    suffix = p.suffix.lower()
    meta: dict[str, Any] = {}
    if suffix == ".csv":
        df = pd.read_csv(p)
        side = sidecar_path(p)
        if side.is_file():
            meta = json.loads(side.read_text(encoding="utf-8")).get(_META_KEY, {})
    elif suffix == ".json":
        data = json.loads(p.read_text(encoding="utf-8"))
        meta = data.get("provenance", {})
        df = pd.DataFrame(data["rows"])
        if df.empty:
            df = pd.DataFrame(columns=list(COLUMNS))
    elif suffix == ".parquet":
        import pyarrow.parquet as pq

        table = pq.read_table(p)
        raw = (table.schema.metadata or {}).get(_META_KEY.encode())
        meta = json.loads(raw) if raw else {}
        df = table.to_pandas()
    else:
        raise OutputError(f"unknown table suffix {p.suffix!r}; expected one of {', '.join(SUFFIXES)}")
    if "kv_head" not in df.columns and "head" in df.columns:  # tables written before GQA support
        df.insert(list(df.columns).index("head") + 1, "kv_head", df["head"])
    df = df[list(COLUMNS) + [c for c in df.columns if c not in COLUMNS]]
    df["label"] = df["label"].astype(bool)
    df.attrs.update(meta)
    return validate(df)


def labelled_heads(df: Any) -> Any:
    """The labelled rows, strongest first (by lift, then score)."""
    rows = df[df["label"]]
    return rows.sort_values(["lift", "score"], ascending=False, na_position="last").reset_index(drop=True)


def head_labels(df: Any) -> dict[tuple[int, int], list[str]]:
    """``(layer, head) -> [detector, ...]`` ordered by lift (a head may carry several labels)."""
    out: dict[tuple[int, int], list[str]] = {}
    for row in labelled_heads(df).itertuples():
        out.setdefault((int(row.layer), int(row.head)), []).append(str(row.detector))
    return out
