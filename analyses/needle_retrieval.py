"""Retrieval heads in the zoo's long-context model: where they are, and what masking them costs.

``needle-2k`` (card ``headlens/zoo/cards/needle-2k.md``) copies needles out of random haystacks of up
to 2,047 tokens. This script draws the two things its card says in words:

1. **Where**: ``headlens.classify(..., detectors=["retrieval"], seq_len=2048)``, the layer x head grid of
   retrieval scores (Wu et al. 2024: the share of copy steps whose top-1 key is the needle token
   being copied).
2. **What they do**: needle recall against context length, clean; with the labelled retrieval heads
   attending uniformly (``uniform`` ablation, Wu et al.'s masking); and with random groups of as many
   heads drawn anywhere else in the model (``headlens.interventions.controls.control_groups(scope="model")``).
   Recall is greedy and teacher-forced over the copy steps (``needle_recall``); 95 % CIs bootstrap
   the prompts.

    python analyses/needle_retrieval.py [--out artifacts/needle] [--n-prompts 20] [--n-random 4]
        [--png docs/needle_2k_retrieval.png]

PNG figures are rendered by Debian's chromium through Playwright (``coreference_heads.png``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

LENGTHS = (256, 512, 1024, 1536, 2048)


def recall(model: Any, task: Any, heads: list[Any] | None = None) -> np.ndarray:
    """Per-prompt needle recall on ``task`` (a needle task), with ``heads`` uniform-masked (None: clean)."""
    import contextlib

    from headlens import ablate
    from headlens.interventions.metrics import get_metric
    from headlens.interventions.sweep import task_logits

    masked = ablate(model, heads, method="uniform") if heads else contextlib.nullcontext()
    with torch.no_grad(), masked:  # in chunks of prompts: a bridged model builds each layer's pattern
        logits = task_logits(model, task)  # (N, T, V)
    return get_metric("needle_recall")(logits, task).cpu().numpy()  # (n_prompts,)


def measure(model: Any, lengths: tuple[int, ...] = LENGTHS, n_prompts: int = 20, n_random: int = 4,
            seed: int = 1234) -> tuple[Any, list[dict[str, Any]]]:
    """The retrieval table at the longest length, and recall rows ``{T, condition, mean, ci_low, ci_high}``."""
    import headlens
    from headlens.interventions.ablation import format_heads
    from headlens.interventions.controls import control_groups
    from headlens.interventions.metrics import bootstrap_ci, needle_task

    table = headlens.classify(model, detectors=["retrieval"], n_prompts=n_prompts, seq_len=max(lengths), seed=seed)
    labelled = table[table.label].sort_values(["layer", "head"])
    group = tuple((int(r.layer), int(r.head)) for r in labelled.itertuples())
    randoms = control_groups(group, model.n_heads, n_random, np.random.default_rng(seed),
                             n_layers=model.n_layers, scope="model") if group else []
    conditions = {"clean": [None]}
    if group:
        conditions[f"retrieval heads masked ({format_heads(group)})"] = [list(group)]
    if randoms:
        conditions[f"{len(randoms)} random groups of {len(group)} heads masked"] = [list(g) for g in randoms]
    rows = []
    for T in lengths:
        task = needle_task(model, n_prompts, seq_len=T, seed=seed)  # the same prompts for every condition
        for name, groups in conditions.items():
            per_prompt = np.mean([recall(model, task, g) for g in groups], axis=0)  # (n_prompts,)
            lo, hi = bootstrap_ci(per_prompt, seed=seed)
            rows.append({"T": T, "condition": name, "mean": float(per_prompt.mean()), "ci_low": lo, "ci_high": hi})
    return table, rows


def figure(table: Any, rows: list[dict[str, Any]], title: str = "needle-2k") -> Any:
    """Left: retrieval score per head; right: needle recall against T per condition, with CIs."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    L, H = int(table["layer"].max()) + 1, int(table["head"].max()) + 1
    grid = np.zeros((L, H))
    for r in table.itertuples():
        grid[r.layer, r.head] = r.score
    fig = make_subplots(rows=1, cols=2, column_widths=[0.35, 0.65], horizontal_spacing=0.12,
                        subplot_titles=("retrieval score (top-1 on the needle)", "needle recall vs context length"))
    fig.add_trace(go.Heatmap(z=grid, x=[f"H{h}" for h in range(H)], y=[f"L{layer}" for layer in range(L)],
                             zmin=0, zmax=1, colorscale="Viridis", text=np.round(grid, 2), texttemplate="%{text}",
                             colorbar={"x": 0.3, "len": 0.9}, hovertemplate="%{y}%{x}: %{z:.3f}<extra></extra>"),
                  row=1, col=1)
    fig.update_yaxes(autorange="reversed", row=1, col=1)
    for name in dict.fromkeys(r["condition"] for r in rows):
        sub = [r for r in rows if r["condition"] == name]
        fig.add_trace(go.Scatter(
            x=[r["T"] for r in sub], y=[r["mean"] for r in sub], name=name, mode="lines+markers",
            error_y={"type": "data", "symmetric": False, "array": [r["ci_high"] - r["mean"] for r in sub],
                     "arrayminus": [r["mean"] - r["ci_low"] for r in sub]}), row=1, col=2)
    fig.update_xaxes(title_text="tokens", tickvals=sorted({r["T"] for r in rows}), row=1, col=2)
    fig.update_yaxes(title_text="needle recall", range=[-0.05, 1.05], row=1, col=2)
    fig.update_layout(title=f"{title}: retrieval heads and what masking them costs", height=440, width=1100,
                      legend={"x": 0.4, "y": -0.25, "orientation": "h"})
    return fig


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="needle-2k")
    ap.add_argument("--out", type=Path, default=Path("artifacts/needle"))
    ap.add_argument("--n-prompts", type=int, default=20)
    ap.add_argument("--n-random", type=int, default=4)
    ap.add_argument("--png", type=Path, default=None, help="also write the figure here (README)")
    args = ap.parse_args()
    import pandas as pd

    import headlens

    sys.path.insert(0, str(Path(__file__).parent))
    from coreference_heads import png

    model = headlens.load(args.model)
    table, rows = measure(model, n_prompts=args.n_prompts, n_random=args.n_random)
    args.out.mkdir(parents=True, exist_ok=True)
    table.to_csv(args.out / "retrieval_scores.csv", index=False)
    pd.DataFrame(rows).to_csv(args.out / "needle_recall.csv", index=False)
    print(pd.DataFrame(rows).to_string(index=False))
    fig = figure(table, rows, args.model)
    fig.write_html(args.out / "needle_retrieval.html")
    for path in [args.out / "needle_retrieval.png", *([args.png] if args.png else [])]:
        png(fig, path, width=1100)
        print("wrote", path)


if __name__ == "__main__":
    main()
