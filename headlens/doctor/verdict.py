"""The doctor's verdict on head counts: from per-row losses of every candidate layout to which one the
weights were trained with, how sure that is, and the warnings every family words alike.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch


def stdlib_text(n_chars: int, seed: int) -> str:
    import sysconfig

    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.glob("*.py") if p.stat().st_size > 4000)
    gen = torch.Generator().manual_seed(seed)
    text = ""
    for i in torch.randperm(len(files), generator=gen).tolist():
        text += files[i].read_text(encoding="utf-8", errors="replace")[1000:3000]
        if len(text) >= n_chars:
            break
    return text


def _z(worse: torch.Tensor, better: torch.Tensor) -> float:
    """Paired z-score of the per-row loss gap (how many standard errors ``worse`` is above ``better``)."""
    gap = worse - better
    if gap.numel() < 2 or float(gap.std()) == 0.0:
        return 0.0 if float(gap.mean()) == 0.0 else float("inf")
    return float(gap.mean() / (gap.std() / gap.numel() ** 0.5))


@dataclass(frozen=True)
class Verdict:
    """Which head count the losses point to, and how sure: see :func:`decide`."""

    losses: dict[int, float]  # n_heads -> token-weighted mean loss
    z: dict[int, float]  # n_heads -> paired z of its loss gap to the best
    best: int  # lowest loss
    plausible: list[int]  # within ``margin`` nats or ``z_min`` standard errors of the best
    inferred: int  # the claim when it is plausible, else the best


def head_count_warnings(v: Any, config_heads: int, n_heads: int | None, said: str, best: str,
                        trained: str) -> list[str]:
    """The doctor's warnings for verdict ``v`` (from :func:`decide`), every family worded alike.

    ``said`` is what the config claims, ``best`` how the weights work best ("split into 2 heads"),
    ``trained`` what they were trained with ("with 2"); ``n_heads`` the count the user asked about.
    """
    out = []
    if v.inferred != config_heads:
        out.append(f"the config says {said} but the weights work best {best} (loss "
                   f"{v.losses[v.inferred]:.3f} vs {v.losses[config_heads]:.3f} nats): this checkpoint's "
                   f"config is wrong")
    if n_heads is not None and n_heads != v.inferred:
        out.append(f"you asked for n_heads={n_heads} but the weights were trained {trained} "
                   f"(loss {v.losses[v.inferred]:.3f} vs {v.losses[n_heads]:.3f} nats)")
    if len(v.plausible) > 1:
        out.append(f"weak evidence: n_heads={v.plausible} fit about equally well on this text; "
                   f"give more or more typical text (--text) to separate them")
    return out


def decide(per_row: dict[int, torch.Tensor], rows: list[torch.Tensor], claimed: int, margin: float,
           z_min: float) -> Verdict:
    """Turn per-row losses of every candidate head count into a :class:`Verdict`."""
    lengths = torch.cat([torch.full((r.shape[0],), r.shape[1] - 1, dtype=torch.float64) for r in rows])
    losses = {h: float((r * lengths).sum() / lengths.sum()) for h, r in per_row.items()}
    best = min(losses, key=losses.get)
    z = {h: _z(per_row[h], per_row[best]) for h in per_row}
    # head counts the evaluation cannot tell apart from the best: within the margin or z_min standard errors
    plausible = [h for h in per_row if losses[h] - losses[best] <= margin or z[h] <= z_min]
    return Verdict(losses, z, best, plausible, claimed if claimed in plausible else best)
