"""A model's history for the dashboard: its training snapshots, their losses and scores, a trajectory
table written by ``headlens trajectory``, and what the Compare view sets next to it.

Nothing here imports Streamlit; :mod:`headlens.app.cache` wraps the slow parts.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from headlens.app.helpers import compute_scores, format_head
from headlens.errors import HeadlensError

if TYPE_CHECKING:
    import pandas as pd


# -- training snapshots -----------------------------------------------------------------------
def find_snapshots(ref: str) -> list[Path]:
    """Training snapshots of a model: the zoo's, or ``snapshots/`` next to a checkpoint."""
    from headlens.zoo import ZOO, weights_dir

    if ref in ZOO:
        entry = ZOO[ref]
        if hasattr(entry, "snapshot_files"):
            return sorted(entry.snapshot_files, key=_snapshot_step)
        folder = weights_dir() / entry.snapshots if entry.snapshots else None
    elif ref.startswith("hf:") or ref == "minilm":
        folder = None
    else:
        folder = Path(ref).expanduser().parent / "snapshots"
    if folder is None or not folder.is_dir():
        return []
    return sorted(folder.glob("*.safetensors"), key=_snapshot_step)


def read_trajectory(path: str) -> pd.DataFrame:
    """A table written by ``headlens trajectory --out`` (scores with ``checkpoint`` and ``step`` columns)."""
    from headlens.scoring.table import read_table

    p = Path(path).expanduser()
    if not p.is_file():
        raise HeadlensError(f"no trajectory table at {path!r}")
    table = read_table(p)
    if "step" not in table.columns:
        raise HeadlensError(f"{path!r} is a scores table without a 'step' column; write one with "
                            f"`headlens trajectory --out`")
    return table


def _snapshot_step(path: Path) -> int:
    digits = re.findall(r"\d+", path.stem)
    return int(digits[-1]) if digits else 0


def training_losses(snapshots: Sequence[Path]) -> pd.DataFrame:
    """``step, loss``: the training log next to the snapshots if there is one, else their metadata."""
    import pandas as pd

    if snapshots:
        for log in (snapshots[0].parent / "log.json", snapshots[0].parent.parent / "log.json"):
            if log.is_file():
                try:
                    rows = json.loads(log.read_text()).get("log", [])
                    if rows:
                        return pd.DataFrame(rows)[["step", "loss"]]
                except (ValueError, KeyError, AttributeError):
                    pass
    from headlens.models.checkpoint import load_metadata

    rows = []
    for path in snapshots:
        meta = load_metadata(path)
        rows.append({"step": int(meta.get("step", _snapshot_step(path))), "loss": meta.get("loss", float("nan"))})
    return pd.DataFrame(rows, columns=["step", "loss"])


def snapshot_scores(snapshots: Sequence[Path], detectors: Sequence[str], n_prompts: int = 10,
                    seed: int = 0) -> pd.DataFrame:
    """The scores table of every snapshot, with a ``step`` column."""
    import pandas as pd

    from headlens.models.checkpoint import load_checkpoint, load_metadata

    frames = []
    for path in snapshots:
        model = load_checkpoint(path)
        table = compute_scores(model, n_prompts=n_prompts, seed=seed, detectors=detectors)
        table["step"] = int(load_metadata(path).get("step", _snapshot_step(path)))
        frames.append(table)
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


# -- compare ----------------------------------------------------------------------------------
def compare_choices(ref: str) -> dict[str, str]:
    """What the Compare view offers next to ``ref``: label -> model reference. The model's own
    training snapshots first (before/after a phase change), then the other available zoo models."""
    from headlens.zoo import available

    out = {f"{ref} at step {_snapshot_step(p)} (snapshot)": str(p) for p in find_snapshots(ref)}
    out.update({name: name for name in sorted(available()) if name != ref})
    return out


def score_diff(a: pd.DataFrame, b: pd.DataFrame) -> pd.DataFrame:
    """``layer, head, detector, score_a, score_b, diff (= b - a), label_a, label_b`` for the heads and
    detectors both tables score, largest ``|diff|`` first."""
    keys = ["layer", "head", "detector"]
    left = a[[*keys, "score", "label"]].rename(columns={"score": "score_a", "label": "label_a"})
    right = b[[*keys, "score", "label"]].rename(columns={"score": "score_b", "label": "label_b"})
    both = left.merge(right, on=keys, how="inner")
    both["diff"] = both["score_b"] - both["score_a"]
    both = both.assign(head_id=[format_head(r.layer, r.head) for r in both.itertuples()])
    order = both["diff"].abs().sort_values(ascending=False).index
    return both.loc[order, ["head_id", *keys, "score_a", "score_b", "diff", "label_a", "label_b"]].reset_index(drop=True)
