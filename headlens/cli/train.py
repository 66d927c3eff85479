"""``headlens train RECIPE``: re-train a zoo model from its recipe, with progress on a terminal and in a log."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from headlens.cli import options as opt
from headlens.cli.failure import fail
from headlens.errors import HeadlensError


def register(app: typer.Typer) -> None:
    @app.command("train")
    def train_cmd(
        recipe: Annotated[str, typer.Argument(help="recipe name: {recipes}")],
        out: Annotated[Path | None, typer.Option("--out", "-o", help="run folder (default: ./runs/RECIPE); "
                       "a non-empty one is refused without --overwrite")] = None,
        overwrite: Annotated[bool, typer.Option("--overwrite", help="replace the run already in --out (its "
                             "checkpoint, snapshots and logs are removed first, so two runs never mix)")] = False,
        steps: Annotated[int | None, typer.Option("--steps", min=1, help="optimiser steps (default: the "
                         "recipe's)")] = None,
        seed: Annotated[int | None, typer.Option("--seed", help="seed of weights and data (default: the "
                        "recipe's)")] = None,
        snapshots: Annotated[int | None, typer.Option("--snapshots", min=0, help="intermediate checkpoints to "
                             "keep")] = None,
        threads: Annotated[int, typer.Option("--threads", min=1, help="CPU threads (1 is reproducible bit for "
                           "bit)")] = 1,
        evaluate: Annotated[bool, typer.Option("--evaluate/--no-evaluate", help="measure the card's numbers")] = True,
        quiet: opt.Quiet = False,
    ) -> None:
        """Train RECIPE from scratch: checkpoint (a Hugging Face directory for llama-induction), snapshots,
        JSON loss log and a card.json."""
        try:
            run_train(recipe, out, overwrite, steps, seed, snapshots, threads, evaluate, quiet)
        except HeadlensError as e:
            raise fail(e) from None


def run_train(recipe: str, out: Path | None, overwrite: bool, steps: int | None, seed: int | None,
              snapshots: int | None, threads: int, evaluate: bool, quiet: bool) -> None:
    """The command body: the recipe and the run folder are checked before torch trains anything."""
    import json

    import torch
    from rich.console import Console
    from rich.progress import BarColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    from headlens.cli.progress import progress
    from headlens.models.files import write_text
    from headlens.training.recipes import get_recipe
    from headlens.training.train import prepare_run_folder, train

    spec = get_recipe(recipe)
    out_dir = out or Path("runs") / recipe
    prepare_run_folder(out_dir, overwrite)  # refuse (or clear) before the first step, not after
    torch.set_num_threads(threads)
    console = Console(stderr=True)
    columns = (
        TextColumn("[bold]{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
        TextColumn("loss {task.fields[loss]:.4f}"), TextColumn("{task.fields[tps]:,.0f} tok/s"),
        TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
    )
    with progress(f"train {recipe}", total=steps or spec.steps, quiet=quiet, columns=columns,
                  fields={"loss": "loss {:.4f}", "tps": "{:,.0f} tok/s"}) as bar:
        result = train(spec, out_dir, steps=steps, seed=seed, snapshots=snapshots, overwrite=True,
                       on_step=lambda step, total, loss, tps: bar.update(step, total, loss=loss, tps=tps))
    console.print(f"checkpoint: {result.checkpoint}")
    console.print(f"snapshots:  {len(result.snapshots)} in {result.checkpoint.parent / 'snapshots'}")
    console.print(f"loss log:   {result.log}")
    console.print(f"final train loss {result.final_loss:.4f} in {result.wall_time_s:.0f} s")
    if evaluate:
        from headlens.training.evaluate import EVALUATORS
        from headlens.training.train import load_trained

        card = EVALUATORS[recipe](load_trained(result.checkpoint, name=recipe))
        card_path = write_text(Path(out_dir) / "card.json", json.dumps(card, indent=1))
        summary = {k: v for k, v in card.items() if k not in ("scores", "probe")}
        console.print(f"card:       {card_path}")
        console.print(json.dumps(summary, indent=1))
