"""The scores table: one schema, defined once, validated before anything is written.

Long (tidy) format, one row per head x detector::

    model, layer, head, kv_head, detector, score, ci_low, ci_high, baseline, lift, n_positions, n_prompts, label, rest

Rows are per *query* head. ``kv_head`` is the key/value group the query head reads from under
grouped- or multi-query attention (Llama, Mistral, Qwen2, Gemma ...): query head ``h`` of ``H`` shares
key/value head ``h // (H // H_kv)`` (Hugging Face's ``repeat_kv`` order). Without GQA it equals ``head``.
``label`` is a bool: this head carries this detector's label by the rule on the docs site's scores page (docs/scores.md).
``rest`` is the head's attention on the first token, on the probe this row was scored on (rows q >= 1, pooled
like a score; NaN for weight scores and for probes read by the top-1 engine alone): how much the head *rests*,
shown beside every type instead of as a type of its own (docs/scores.md, "Resting"). Tables written before it
existed read back with ``rest`` NaN.
Extra columns may follow the schema's: the weight detectors' :data:`WEIGHT_COLUMNS` (``null``, the
score of the detector's null for the head; ``eigen``, ov_copying's eigenvalue score; NaN on every other
row), and ``headlens classify --confirm`` adds the ablation columns of :mod:`headlens.interventions.confirm`.
Provenance (headlens version, probe settings, seed, thresholds) lives in ``df.attrs`` and
travels with the file, written by :mod:`headlens.scoring.output` as for every other table: a
``provenance`` key in JSON, schema metadata in Parquet, a sidecar ``<name>.csv.json`` next to a CSV.
:func:`read_table` restores it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from headlens.errors import HeadlensError
from headlens.scoring.output import SUFFIXES as SUFFIXES  # re-exported: the table formats
from headlens.scoring.output import check_output, read_frame, write_frame
from headlens.scoring.output import sidecar_path as sidecar_path
from headlens.scoring.primary import label_order
from headlens.zoo.names import RENAMED

if TYPE_CHECKING:  # the table is read where torch is not imported (the dashboard's first paint)
    import torch

    from headlens.scoring.stats import Summary

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
    "rest": "f",
}


WEIGHT_COLUMNS: dict[str, str] = {  # optional, after COLUMNS, on tables that score a weight detector
    "null": "f",  # the same score under the detector's null, for this head (docs/scores.md)
    "eigen": "f",  # ov_copying only: Elhage et al.'s positive-eigenvalue fraction of the raw W_E W_V W_O W_U
}


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
    for col, kind in {**COLUMNS, **{c: k for c, k in WEIGHT_COLUMNS.items() if c in df.columns}}.items():
        got = df[col].dtype.kind
        ok = got == kind or (kind == "O" and got in "OSUT") or (kind == "f" and got in "fi")
        if not ok and len(df):
            raise HeadlensError(f"scores table column {col!r} has dtype {df[col].dtype}; expected kind {kind!r}")
    if len(df):
        if (df["layer"] < 0).any() or (df["head"] < 0).any():
            raise HeadlensError("scores table has negative layer or head ids")
        key = ["model", "layer", "head", "detector"] + (["checkpoint"] if "checkpoint" in df.columns else [])
        rest = df["rest"].dropna()
        if ((rest < -1e-6) | (rest > 1 + 1e-6)).any():
            raise HeadlensError("scores table column 'rest' (attention on the first token) has values outside [0, 1]")
        if df.duplicated(key).any():  # a training series repeats each head once per checkpoint
            raise HeadlensError(f"scores table has duplicate ({', '.join(key)}) rows")
    return df


def check_output_path(path: str | os.PathLike) -> Path:
    """Fail early (``OutputError``) on an unknown suffix or a place we cannot write to (:mod:`~headlens.scoring.output`)."""
    return check_output(path)


def write_table(df: Any, path: str | os.PathLike) -> Path:
    """Validate and write ``df`` (CSV, Parquet or JSON by suffix) atomically, provenance included."""
    check_output(path)
    validate(df)
    return write_frame(df, path)


def read_table(path: str | os.PathLike) -> Any:
    """Read a table written by :func:`write_table`, with its provenance back in ``df.attrs``."""
    df = read_frame(path)
    if df.empty and not len(df.columns):
        df = empty_table()
    if "kv_head" not in df.columns and "head" in df.columns:  # tables written before GQA support
        df.insert(list(df.columns).index("head") + 1, "kv_head", df["head"])
    if "rest" not in df.columns and "label" in df.columns:  # tables written before the rest column
        df.insert(list(df.columns).index("label") + 1, "rest", float("nan"))
    attrs = _renamed(df, dict(df.attrs))
    df = df[list(COLUMNS) + [c for c in df.columns if c not in COLUMNS]]
    df["label"] = df["label"].astype(bool)
    df.attrs.update(attrs)
    return validate(df)


def _renamed(df: Any, attrs: dict[str, Any]) -> dict[str, Any]:
    """A table written before the weight-only types were renamed (``copying`` rows and no ``ov_copying`` ones):
    its rows and provenance keys under the new names (:data:`headlens.zoo.names.RENAMED`), one warning."""
    import warnings

    present = set(df["detector"]) if "detector" in df.columns else set()
    old = {o: n for o, n in RENAMED.items() if o in present and n not in present}
    if not old:
        return attrs
    warnings.warn(f"this scores table predates the renamed weight-only types: read {', '.join(old)} as "
                  f"{', '.join(old.values())}; write it again to keep the new names", DeprecationWarning, stacklevel=4)
    df["detector"] = df["detector"].replace(old)
    return {k: {old.get(n, n): v for n, v in a.items()} if k in ("thresholds", "weights", "skipped")
            and isinstance(a, dict) else a for k, a in attrs.items()}


def write_scores(df: Any, path: str | os.PathLike) -> Path:
    """Write a scores table for others to read: ``.json`` (``{"provenance": {...}, "rows": [...]}``, floats to 15
    digits), ``.csv`` (+ a ``.csv.json`` provenance sidecar) or ``.parquet``; :func:`read_scores` reads it back.

    >>> headlens.write_scores(headlens.classify("induction-2l"), "scores.json")  # doctest: +SKIP
    """
    return write_table(df, path)


def read_scores(path: str | os.PathLike) -> Any:
    """A scores table written by headlens (``write_scores``, ``headlens classify -o``), its provenance (headlens
    version, model and where it came from, probe settings, seed) back in ``df.attrs``.

    >>> table = headlens.read_scores("scores.json")  # doctest: +SKIP
    >>> table.attrs["model"]  # doctest: +SKIP
    'induction-2l'
    """
    return read_table(path)


def labelled_heads(df: Any) -> Any:
    """The labelled rows in the one order of :func:`headlens.scoring.primary.label_order`: what heads do when
    they are not resting, strongest first; resting labels (``first_token``, ``sink``) after them."""
    return label_order(df[df["label"].fillna(False).astype(bool)])


def head_labels(df: Any) -> dict[tuple[int, int], list[str]]:
    """``(layer, head) -> [detector, ...]``, the strongest first and a resting label last
    (:func:`headlens.scoring.primary.label_order`; a head may carry several labels)."""
    out: dict[tuple[int, int], list[str]] = {}
    for row in labelled_heads(df).itertuples():
        out.setdefault((int(row.layer), int(row.head)), []).append(str(row.detector))
    return out


def head_rows(model_name: str, det: str, s: Summary, lifts: torch.Tensor, labels: torch.Tensor,
          n_layers: int, kv: list[int], rest: torch.Tensor | None, extra: dict[str, torch.Tensor] | None = None
          ) -> list[dict[str, Any]]:
    """One table row per query head for detector ``det`` (the schema above; ``extra``: more columns)."""
    heads = [(layer, head) for layer in range(n_layers) for head in range(len(kv))]  # per query head
    return [
        {"model": model_name, "layer": layer, "head": head, "kv_head": kv[head], "detector": det,
         "score": float(s.score[i]), "ci_low": float(s.ci_low[i]), "ci_high": float(s.ci_high[i]),
         "baseline": s.baseline, "lift": float(lifts[i]), "n_positions": s.n_positions,
         "n_prompts": s.n_prompts, "label": bool(labels[i]),
         "rest": float("nan") if rest is None else float(rest[i]),  # resting on the row's probe (scoring.resting)
         **{c: float(v[i]) for c, v in (extra or {}).items()}}
        for i, (layer, head) in enumerate(heads)
    ]
