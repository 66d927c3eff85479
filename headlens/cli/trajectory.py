"""``headlens trajectory``: score every checkpoint of a training run; a thin layer over ``headlens.trajectory``.

stdout: one row per checkpoint (step, loss) with the score of every head labelled at any checkpoint. ``--out`` writes the
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
from headlens.errors import HeadlensError, OutputError


def print_series(df: Any, console: Any) -> None:
    """One row per checkpoint: step, loss, and the score of every head labelled at any checkpoint."""
    from rich.table import Table

    labelled = df[df.groupby(["layer", "head", "detector"])["label"].transform("any")]
    columns = sorted({(int(r.layer), int(r.head), str(r.detector)) for r in labelled.itertuples()})
    table = Table(title=f"{df.attrs.get('model', '?')}: scores over training "
                        f"({df['step'].nunique()} checkpoints; bold = labelled)")
    for col in ("step", "checkpoint", "loss"):
        table.add_column(col, justify="right" if col != "checkpoint" else "left")
    for layer, head, det in columns:
        table.add_column(f"L{layer}H{head} {det}", justify="right")
    cells = {(int(r.step), int(r.layer), int(r.head), str(r.detector)): (r.score, r.label) for r in df.itertuples()}
    for step, g in df.groupby("step", sort=True):
        loss = g["loss"].iloc[0] if "loss" in g.columns else float("nan")
        row = [str(step), str(g["checkpoint"].iloc[0]), "-" if loss != loss else f"{loss:.3f}"]
        for key in columns:
            score, lab = cells.get((int(step), *key), (float("nan"), False))
            row.append("-" if score != score else (f"[bold]{score:.2f}[/bold]" if lab else f"{score:.2f}"))
        table.add_row(*row)
    console.print(table)
    if not columns:
        console.print("no head is labelled at any checkpoint")


def register(app: typer.Typer) -> None:
    @app.command("trajectory")
    def trajectory_cmd(
        models: Annotated[list[str], typer.Option("--models", help="checkpoints: a glob ('runs/x/step_*.safetensors'), "
                          "a directory of snapshots, hf:ORG/NAME@step1000,step2000; repeat for a list")],
        detectors: Annotated[str | None, typer.Option("--detectors", "-d", help="comma-separated detector names "
                             "(default: every detector the model supports)")] = None,
        n_prompts: Annotated[int, typer.Option("--n-prompts", min=1, help="prompts per probe")] = 64,
        seq_len: Annotated[int, typer.Option("--seq-len", min=8, help="tokens per prompt")] = 64,
        batch_size: Annotated[int, typer.Option("--batch-size", min=1, help="prompts per forward pass")] = 32,
        seed: Annotated[int, typer.Option("--seed", help="seeds probes and bootstrap (same for every checkpoint)")] = 0,
        out: Annotated[Path | None, typer.Option("--out", "-o", help="write the table (.csv, .parquet, .json)")] = None,
        figure: Annotated[Path | None, typer.Option("--figure", help="write each head's score over training "
                          "(and the loss) as a standalone .html")] = None,
        quiet: Annotated[bool, typer.Option("--quiet", "-q", help="no progress bar")] = False,
        resume: opt.Resume = None,
        device: opt.Device = "cpu",
        device_map: opt.DeviceMap = None,
        max_memory: opt.MaxMemory = None,
        offload_folder: opt.OffloadFolder = None,
    ) -> None:
        """Score every checkpoint of a training run into one table (checkpoint and step columns)."""
        try:
            run_trajectory(models, detectors, n_prompts, seq_len, batch_size, seed, out, figure, quiet, resume,
                           device, opt.load_options(device_map, max_memory, offload_folder))
        except HeadlensError as e:
            raise fail(e) from None


def run_trajectory(models: list[str], detectors: str | None, n_prompts: int, seq_len: int, batch_size: int,
                   seed: int, out: Path | None, figure: Path | None, quiet: bool, resume: Path | None,
                   device: str, load_options: dict[str, Any]) -> None:
    """The command body: library calls only, errors left to the caller."""
    from rich.console import Console
    from rich.progress import Progress

    from headlens.scoring.distributed import current
    from headlens.scoring.series import trajectory
    from headlens.scoring.table import check_output_path, write_table

    rank = current()
    quiet = quiet or not rank.is_main
    if out is not None:
        check_output_path(out)
    if figure is not None and (figure.suffix.lower() != ".html" or not figure.parent.is_dir()):
        raise OutputError(f"cannot write figure {str(figure)!r}: expected an .html path in an existing folder")
    err = Console(stderr=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with Progress(console=err, disable=quiet, transient=True) as bar:
            task = bar.add_task("scoring checkpoints", total=None)
            df = trajectory(models, detectors=detectors, n_prompts=n_prompts, seq_len=seq_len, batch_size=batch_size,
                            seed=seed, device=device, resume=resume, **load_options,
                            progress=lambda d, t, name: bar.update(task, completed=d, total=t,
                                                                   description=f"scored {name}"))
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
        from headlens.scoring.resume import atomic_write

        html = viz.figure_html(viz.trajectory_figure(df))
        atomic_write(figure, lambda tmp: Path(tmp).write_text(html, encoding="utf-8"))
        if not quiet:
            err.print(f"wrote {figure}")
    print_series(df, Console(file=sys.stdout, width=max(120, Console().width)))
