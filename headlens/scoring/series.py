"""``headlens.trajectory``: score every checkpoint of a training run into one table.

(The module is ``series``, not ``trajectory``, so that importing it can never shadow the function
``headlens.trajectory`` with a module of the same name.)

A series is a glob (``runs/x/step_*.safetensors``), a list of references, a directory of
snapshots, or ``hf:ORG/NAME@step1000,step2000`` (revisions of one hub model). Each checkpoint is
classified like ``headlens.classify`` would, and its rows get ``checkpoint``, ``step`` (from the
checkpoint's metadata, else the last number in its name or revision) and ``loss`` (from the
metadata when the snapshot carries it, else NaN) columns.

Under ``torchrun`` the checkpoints are shared out to the ranks in contiguous blocks (each rank scans
its own checkpoints alone) and rank 0 joins the tables in series order. With ``resume``, each finished
checkpoint's table is kept on disk, keyed by the checkpoint file's hash and the settings.
"""

from __future__ import annotations

import glob
import json
import os
import re
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from headlens.errors import ModelReferenceError

EXTRA_COLUMNS = ("checkpoint", "step", "loss")


@dataclass(frozen=True)
class Checkpoint:
    """One point of a training series.

    Attributes:
        name: what the table's ``checkpoint`` column shows (file stem or revision).
        ref: the model reference ``headlens.load`` takes.
        step: training step (metadata, else the last number in the name; else the position).
        loss: training loss stored with the snapshot, or NaN.
        recipe, seed, config, steps: the run it came from (its recipe, seed, model config and length;
            headlens snapshots carry them), or None.
    """

    name: str
    ref: str
    step: int
    loss: float = float("nan")
    recipe: str | None = None
    seed: int | None = None
    config: str | None = None
    steps: int | None = None


def _last_number(text: str) -> int | None:
    digits = re.findall(r"\d+", text)
    return int(digits[-1]) if digits else None


def _from_file(path: Path, index: int) -> Checkpoint:
    meta: dict[str, Any] = {}
    config = None
    try:
        from headlens.models.checkpoint import load_metadata, read_header

        meta = load_metadata(path)
        config = read_header(path).get("config")
    except Exception:  # not a headlens checkpoint: its name is all we know
        meta = {}
    step = meta.get("step", _last_number(path.stem))
    loss = meta.get("loss")
    return Checkpoint(path.stem, str(path), int(index if step is None else step),
                      float("nan") if loss is None else float(loss), meta.get("recipe"), meta.get("seed"), config,
                      meta.get("steps"))


def mixed_runs(series: Sequence[Checkpoint]) -> str | None:
    """One sentence when the checkpoints come from different recipes, seeds or model configs, else None.

    >>> a, b = Checkpoint("a", "a", 1, recipe="code", seed=0), Checkpoint("b", "b", 2, recipe="code", seed=1)
    >>> mixed_runs([a, b])
    'the checkpoints come from different runs (seeds 0, 1); steps from different runs do not form one series'
    """
    parts = []
    for what, values in (("recipes", [c.recipe for c in series]), ("seeds", [c.seed for c in series]),
                         ("configs", [c.config for c in series]),
                         ("runs of", [c.steps for c in series])):
        known = list(dict.fromkeys(v for v in values if v is not None))
        if len(known) > 1:
            parts.append(f"{len(known)} model configs" if what == "configs" else
                         f"{what} {', '.join(str(v) for v in known)}" + (" steps" if what == "runs of" else ""))
    if not parts:
        return None
    return (f"the checkpoints come from different runs ({'; '.join(parts)}); steps from different runs do not "
            f"form one series")


def _expand(item: str | os.PathLike) -> list[str]:
    text = str(item).strip()
    if text.startswith("hf:") and "@" in text:
        base, revs = text.split("@", 1)
        return [f"{base}@{r.strip()}" for r in revs.split(",") if r.strip()]
    path = Path(text).expanduser()
    if any(c in text for c in "*?["):
        return sorted(glob.glob(str(path)))
    if path.is_dir() and not (path / "config.json").is_file():
        return sorted(str(p) for p in path.glob("*.safetensors"))
    return [text]


def checkpoints(models: str | os.PathLike | Sequence[str | os.PathLike]) -> list[Checkpoint]:
    """The series ``models`` names, ordered by step.

    >>> [c.step for c in checkpoints("hf:EleutherAI/pythia-70m@step1000,step2000")]
    [1000, 2000]
    """
    items = [models] if isinstance(models, str | os.PathLike) else list(models)
    refs = [r for item in items for r in _expand(item)]
    if not refs:
        raise ModelReferenceError(f"no checkpoints match {[str(i) for i in items]}; expected a glob, a list, "
                                  f"a directory of .safetensors snapshots, or hf:ORG/NAME@REV1,REV2")
    out = []
    for i, ref in enumerate(refs):
        if ref.startswith("hf:") and "@" in ref:
            rev = ref.split("@", 1)[1]
            step = _last_number(rev)
            out.append(Checkpoint(rev, ref, i if step is None else step))
        elif Path(ref).expanduser().is_file():
            out.append(_from_file(Path(ref).expanduser(), i))
        else:
            out.append(Checkpoint(Path(ref).name or ref, ref, i))
    return sorted(out, key=lambda c: c.step)


def _fingerprint(ckpt: Checkpoint, settings: dict[str, Any]) -> str:
    from headlens import __version__
    from headlens.scoring.resume import digest, file_hash

    path = Path(ckpt.ref).expanduser()
    source = file_hash(path) if path.is_file() else ckpt.ref
    return digest(source, ckpt.step, settings, __version__)


def _score(ckpt: Checkpoint, settings: dict[str, Any], load_options: dict[str, Any], device: str,
           resume: Any) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Rows and provenance of one checkpoint (read back from ``resume`` when it is there)."""
    from headlens.models.loading import load
    from headlens.scoring.classification import classify
    from headlens.scoring.distributed import single_process
    from headlens.scoring.resume import ShardStore, atomic_write

    store = ShardStore(resume, "trajectory", _fingerprint(ckpt, settings)) if resume is not None else None
    key = re.sub(r"[^A-Za-z0-9_.-]", "_", f"{ckpt.step:09d}-{ckpt.name}")
    if store is not None and (stored := _load_json(store, key)) is not None:
        return stored["rows"], stored["provenance"]
    with single_process():
        df = classify(load(ckpt.ref, device=device, **load_options), **settings)
    df["checkpoint"], df["step"], df["loss"] = ckpt.name, ckpt.step, ckpt.loss
    rows, prov = df.to_dict("records"), json.loads(json.dumps(dict(df.attrs), default=str))
    if store is not None:
        data = json.dumps({"fingerprint": store.fingerprint, "rows": rows, "provenance": prov}, default=str)
        atomic_write(store.dir / f"{key}.json", lambda tmp: Path(tmp).write_text(data, encoding="utf-8"))
    return rows, prov


def _load_json(store: Any, key: str) -> dict[str, Any] | None:
    path = store.dir / f"{key}.json"
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        store._ignore(path, f"it cannot be read ({err})")
        return None
    if data.get("fingerprint") != store.fingerprint:
        store._ignore(path, "it was made with other settings or weights")
        return None
    return data


def trajectory(
    models: str | os.PathLike | Sequence[str | os.PathLike],
    detectors: Sequence[str] | str | None = None,
    n_prompts: int = 64,
    seq_len: int = 64,
    batch_size: int = 32,
    seed: int = 0,
    threshold: float | dict[str, float] | None = None,
    n_boot: int | None = None,
    device: str = "cpu",
    resume: str | os.PathLike | None = None,
    progress: Callable[[int, int, str], None] | None = None,
    **load_options: Any,
) -> Any:
    """Classify every checkpoint of a training series into one table.

    Args:
        models: a glob, a list of references, a directory of ``.safetensors`` snapshots, or
            ``hf:ORG/NAME@REV1,REV2,...``.
        detectors: as for :func:`headlens.classify` (the same probes for every checkpoint).
        n_prompts: as for :func:`headlens.classify`.
        seq_len: as for :func:`headlens.classify`.
        batch_size: as for :func:`headlens.classify`.
        seed: as for :func:`headlens.classify`.
        threshold: as for :func:`headlens.classify`.
        n_boot: as for :func:`headlens.classify`.
        device: where each checkpoint runs (``cuda``: each rank's own GPU under torchrun).
        resume: a folder for finished checkpoints: a rerun scores only the missing ones.
        progress: optional ``fn(done, total, checkpoint)`` after each checkpoint (this rank's).
        load_options: passed to ``headlens.load`` (``device_map``, ``max_memory`` ... for ``hf:`` models).

    Returns:
        the scores table with ``checkpoint``, ``step`` and ``loss`` columns, in step order
        (None on ranks other than 0 under torchrun).

    >>> import headlens  # doctest: +SKIP
    >>> df = headlens.trajectory("runs/x/step_*.safetensors", detectors="induction")  # doctest: +SKIP
    """
    import pandas as pd

    from headlens.scoring.distributed import current, gather_objects, run_everywhere
    from headlens.scoring.stats import N_BOOT
    from headlens.scoring.table import validate

    series = checkpoints(models)
    if (mixed := mixed_runs(series)) is not None:
        warnings.warn(mixed, stacklevel=2)
    rank = current()
    settings = {"detectors": detectors, "n_prompts": n_prompts, "seq_len": seq_len, "batch_size": batch_size,
                "seed": seed, "threshold": threshold, "n_boot": N_BOOT if n_boot is None else n_boot}
    mine = rank.block(len(series))

    def work() -> list[tuple[int, list[dict[str, Any]], dict[str, Any]]]:
        out = []
        for n, i in enumerate(mine, 1):
            rows, prov = _score(series[i], settings, load_options, rank.device(device), resume)
            out.append((i, rows, prov))
            if progress is not None:
                progress(n, len(mine), series[i].name)
        return out

    parts = gather_objects(rank, run_everywhere(rank, work))
    if parts is None:
        return None
    df = validate(pd.DataFrame([r for _, rows, _ in sorted(parts, key=lambda p: p[0]) for r in rows]))
    first = min(parts, key=lambda p: p[0])[2]
    df.attrs.update({**first, "world_size": rank.world_size,
                     "checkpoints": [{"checkpoint": c.name, "step": c.step, "ref": c.ref} for c in series]})
    return df
