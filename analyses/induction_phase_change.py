"""The induction phase change in ``induction-2l``, from its shipped training snapshots.

For every snapshot: first-half and repeated-half loss on ``BOS + r + r`` probes, and each
head's previous-token and induction score (measured directly from
``blocks.{l}.attn.hook_pattern``). Writes an interactive HTML figure, plus a PNG when
kaleido is installed.

    python analyses/induction_phase_change.py [--snapshots DIR] [--out artifacts/induction_phase_change]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch


def measure_snapshots(snap_dir: Path, n_prompts: int = 16) -> list[dict]:
    """One row per snapshot: step, training loss, probe losses and per-head scores."""
    from headlens.models.checkpoint import load_checkpoint, load_metadata
    from headlens.training.evaluate import evaluate_induction

    rows = []
    for path in sorted(snap_dir.glob("step_*.safetensors")):
        meta = load_metadata(path)
        card = evaluate_induction(load_checkpoint(path), n_prompts=n_prompts)
        rows.append({
            "step": meta["step"],
            "train_loss": meta.get("loss"),
            "first_half_loss": card["first_half_loss"],
            "repeated_half_loss": card["repeated_half_loss"],
            "previous_token": card["scores"]["previous_token"],
            "induction": card["scores"]["induction_min_over_lengths"],
            "shifted_induction": card["scores"]["shifted_induction_min_over_lengths"],
        })
    return rows


def figure(rows: list[dict]):
    """Stacked panels: losses, then previous-token, induction and shifted-induction scores per head."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    steps = [r["step"] for r in rows]
    fig = make_subplots(
        rows=4, cols=1, shared_xaxes=True, vertical_spacing=0.05,
        subplot_titles=("loss on BOS + r + r probes", "previous-token score per head",
                        "induction score per head (min over repeat lengths)",
                        "shifted induction (one key later) per head (min over repeat lengths)"),
    )
    for key, label in (("first_half_loss", "first half (unpredictable)"),
                       ("repeated_half_loss", "repeated half"), ("train_loss", "training loss")):
        fig.add_trace(go.Scatter(x=steps, y=[r[key] for r in rows], name=label, mode="lines+markers"), 1, 1)
    heads = list(rows[0]["previous_token"])
    for panel, key in ((2, "previous_token"), (3, "induction"), (4, "shifted_induction")):
        for head in heads:
            fig.add_trace(go.Scatter(
                x=steps, y=[r[key][head] for r in rows], name=f"{head} {key}", mode="lines+markers",
                legendgroup=key, line={"dash": "solid" if head.startswith("L0") else "dot"},
            ), panel, 1)
        fig.add_hline(y=0.4, line_dash="dash", line_color="grey", row=panel, col=1)
    fig.update_yaxes(title_text="nats", row=1, col=1)
    fig.update_yaxes(title_text="score", range=[0, 1.02], row=2, col=1)
    fig.update_yaxes(title_text="score", range=[0, 1.02], row=3, col=1)
    fig.update_yaxes(title_text="score", range=[0, 1.02], row=4, col=1)
    fig.update_xaxes(title_text="training step", row=4, col=1)
    fig.update_layout(height=1150, width=1000, title="induction-2l: the induction phase change")
    return fig


def main() -> None:
    from headlens.zoo import ZOO, weights_dir

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--snapshots", type=Path, default=weights_dir() / ZOO["induction-2l"].snapshots)
    parser.add_argument("--out", type=Path, default=Path("artifacts/induction_phase_change"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = measure_snapshots(args.snapshots)
    if not rows:
        raise SystemExit(f"no step_*.safetensors snapshots in {args.snapshots}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(rows, indent=1))
    fig = figure(rows)
    fig.write_html(args.out.with_suffix(".html"))
    written = [args.out.with_suffix(".html"), args.out.with_suffix(".json")]
    try:
        fig.write_image(args.out.with_suffix(".png"))
        written.append(args.out.with_suffix(".png"))
    except Exception as err:  # kaleido (or its browser) missing: HTML only
        print(f"no PNG ({type(err).__name__}: {err}); wrote HTML only")
    for r in rows:
        best_prev = max(r["previous_token"].items(), key=lambda kv: kv[1] if kv[0].startswith("L0") else -1)
        best_ind = max(r["induction"].items(), key=lambda kv: kv[1] if kv[0].startswith("L1") else -1)
        best_shift = max(r["shifted_induction"].items(), key=lambda kv: kv[1] if kv[0].startswith("L1") else -1)
        print(f"step {r['step']:5d}  first {r['first_half_loss']:.3f}  repeated {r['repeated_half_loss']:.3f}  "
              f"prev {best_prev[0]} {best_prev[1]:.2f}  induction {best_ind[0]} {best_ind[1]:.2f}  "
              f"shifted {best_shift[0]} {best_shift[1]:.2f}")
    print("wrote", ", ".join(map(str, written)))


if __name__ == "__main__":
    main()
