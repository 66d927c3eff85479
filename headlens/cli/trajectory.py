"""``headlens trajectory``: score every checkpoint of a training run; a thin layer over ``headlens.trajectory``.

stdout: one row per head labelled at any checkpoint: the step it was first labelled, its score then
and at the end. ``--out`` writes the
long table (``checkpoint``, ``step``, ``loss`` columns added), ``--figure`` an HTML page with each
head's score over training under the loss. Under torchrun the checkpoints are shared out to the
ranks and rank 0 writes.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path
from typing import Annotated, Any

import typer

from headlens.cli import options as opt
from headlens.cli.failure import fail
from headlens.errors import HeadlensError
from headlens.scoring import defaults


def print_series(df: Any, console: Any) -> None:
    """One row per head x detector labelled at any checkpoint: the step it was first labelled, its score then
    and at the last checkpoint, and whether it still carries the label (the long table has every score)."""
    from rich.table import Table

    steps = sorted(int(s) for s in df["step"].unique())
    losses = df.groupby("step")["loss"].first() if "loss" in df.columns else None
    loss_text = ""
    if losses is not None and losses.notna().any():
        first, last = losses.dropna().iloc[0], losses.dropna().iloc[-1]
        loss_text = f"; loss {first:.3f} -> {last:.3f}"
    labelled = df[df.groupby(["layer", "head", "detector"])["label"].transform("any")]
    table = Table(title=f"{df.attrs.get('model', '?')}: {len(steps)} checkpoints, steps {steps[0]}..{steps[-1]}"
                        f"{loss_text}")
    for col in ("head", "detector", "first labelled at step", "score then", f"final score (step {steps[-1]})",
                "labelled at the end"):
        table.add_column(col, justify="left" if col in ("head", "detector") else "right")
    rows = []
    for (layer, head, det), g in labelled.groupby(["layer", "head", "detector"], sort=False):
        g = g.sort_values("step")
        first = g[g["label"].astype(bool)].iloc[0]
        last = g.iloc[-1]
        rows.append((int(first.step), int(layer), int(head), str(det), float(first.score), float(last.score),
                     bool(last.label) and int(last.step) == steps[-1]))
    for step, layer, head, det, then, final, still in sorted(rows):
        table.add_row(f"L{layer}H{head}", det, str(step), f"{then:.2f}", f"{final:.2f}", "yes" if still else "no")
    if rows:
        console.print(table)
    else:
        console.print(table.title)
        console.print("no head is labelled at any checkpoint")


def register(app: typer.Typer) -> None:
    @app.command("trajectory")
    def trajectory_cmd(
        models: Annotated[list[str], typer.Option("--models", help="checkpoints: a glob ('runs/x/step_*.safetensors'), "
                          "a directory of snapshots, hf:ORG/NAME@step1000,step2000; repeat for a list")],
        detectors: opt.Detectors = None,
        n_prompts: opt.NPrompts = defaults.N_PROMPTS,
        seq_len: opt.SeqLen = defaults.SEQ_LEN,
        batch_size: opt.BatchSize = defaults.BATCH_SIZE,
        seed: opt.Seed = defaults.SEED,
        threshold: opt.Threshold = None,
        out: opt.Out = None,
        figure: Annotated[Path | None, typer.Option("--figure", help="write each head's score over training "
                          "(and the loss) as a standalone .html")] = None,
        quiet: opt.Quiet = False,
        resume: opt.Resume = None,
        device: opt.Device = "cpu",
        dtype: opt.Dtype = "float32",
        trust_remote_code: opt.TrustRemoteCode = False,
        device_map: opt.DeviceMap = None,
        max_memory: opt.MaxMemory = None,
        offload_folder: opt.OffloadFolder = None,
    ) -> None:
        """Score every checkpoint of a training run into one table (checkpoint and step columns); print when
        each head was first labelled and its final score. Warns when the checkpoints come from different runs."""
        try:
            loading = {**opt.load_options(device_map, max_memory, offload_folder), "dtype": opt.check_dtype(dtype)}
            if trust_remote_code:
                loading["trust_remote_code"] = True
            run_trajectory(models, detectors, n_prompts, seq_len, batch_size, seed, out, figure, quiet, resume,
                           device, loading, threshold)
        except HeadlensError as e:
            raise fail(e) from None


def run_trajectory(models: list[str], detectors: str | None, n_prompts: int, seq_len: int, batch_size: int,
                   seed: int, out: Path | None, figure: Path | None, quiet: bool, resume: Path | None,
                   device: str, load_options: dict[str, Any], threshold: float | None = None) -> None:
    """The command body: library calls only, errors left to the caller."""
    from headlens.cli.precheck import check_detectors

    check_detectors(detectors)  # a mistyped name: refused before torch loads
    from rich.console import Console

    from headlens.cli.progress import progress
    from headlens.models.files import check_writable, write_text
    from headlens.scoring.distributed import current
    from headlens.scoring.series import trajectory
    from headlens.scoring.table import check_output_path, write_table

    rank = current()
    quiet = quiet or not rank.is_main
    if out is not None:
        check_output_path(out)
    if figure is not None:
        check_writable(figure, (".html",), what="the figure")
    err = Console(stderr=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with progress("scoring checkpoints", quiet=quiet) as bar:
            df = trajectory(models, detectors=detectors, n_prompts=n_prompts, seq_len=seq_len, batch_size=batch_size,
                            seed=seed, threshold=threshold, device=device, resume=resume, **load_options,
                            progress=lambda d, t, name: bar.update(d, t, f"scored {name}"))
    if df is None:  # a rank other than 0
        return
    for w in {str(w.message): w for w in caught}:
        print(f"headlens: warning: {w}", file=sys.stderr)
    if out is not None:
        write_table(df, out)
        if not quiet:
            err.print(f"wrote {len(df)} rows to {out}")
    if figure is not None:
        from headlens import viz

        write_text(figure, viz.figure_html(viz.trajectory_figure(df)))
        if not quiet:
            err.print(f"wrote {figure}")
    print_series(df, Console(file=sys.stdout, width=None if sys.stdout.isatty() else 200))  # logs: no cuts
