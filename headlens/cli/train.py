"""``headlens train RECIPE``: re-train a zoo model from its recipe, with a progress bar."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


def register(app: typer.Typer) -> None:
    @app.command("train")
    def train_cmd(
        recipe: Annotated[str, typer.Argument(help="recipe name: induction-2l, llama-induction, code or dyck")],
        out: Annotated[Path | None, typer.Option("--out", help="output folder (default: ./runs/RECIPE)")] = None,
        steps: Annotated[int | None, typer.Option("--steps", help="optimiser steps (default: the recipe's)")] = None,
        seed: Annotated[int | None, typer.Option("--seed", help="seed of weights and data (default: the recipe's)")] = None,
        snapshots: Annotated[int | None, typer.Option("--snapshots", help="intermediate checkpoints to keep")] = None,
        threads: Annotated[int, typer.Option("--threads", help="CPU threads (1 is reproducible bit for bit)")] = 1,
        evaluate: Annotated[bool, typer.Option("--evaluate/--no-evaluate", help="measure the card's numbers")] = True,
    ) -> None:
        """Train RECIPE from scratch: checkpoint (a Hugging Face directory for llama-induction), snapshots,
        JSON loss log and a card.json."""
        import json

        import torch
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

        from headlens.errors import ConfigError
        from headlens.training.recipes import get_recipe
        from headlens.training.train import train

        if threads < 1:
            raise ConfigError(f"--threads must be >= 1, got {threads}")
        torch.set_num_threads(threads)
        spec = get_recipe(recipe)
        out_dir = out or Path("runs") / recipe
        console = Console(stderr=True)
        columns = (
            TextColumn("[bold]{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
            TextColumn("loss {task.fields[loss]:.4f}"), TextColumn("{task.fields[tps]:,.0f} tok/s"),
            TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
        )
        with Progress(*columns, console=console) as progress:
            task = progress.add_task(recipe, total=steps or spec.steps, loss=float("nan"), tps=0.0)

            def on_step(step: int, total: int, loss: float, tps: float) -> None:
                progress.update(task, completed=step, loss=loss, tps=tps)

            result = train(spec, out_dir, steps=steps, seed=seed, snapshots=snapshots, on_step=on_step)
        console.print(f"checkpoint: {result.checkpoint}")
        console.print(f"snapshots:  {len(result.snapshots)} in {result.checkpoint.parent / 'snapshots'}")
        console.print(f"loss log:   {result.log}")
        console.print(f"final train loss {result.final_loss:.4f} in {result.wall_time_s:.0f} s")
        if evaluate:
            from headlens.training.evaluate import EVALUATORS
            from headlens.training.train import load_trained

            card = EVALUATORS[recipe](load_trained(result.checkpoint, name=recipe))
            card_path = Path(out_dir) / "card.json"
            card_path.write_text(json.dumps(card, indent=1))
            summary = {k: v for k, v in card.items() if k not in ("scores", "probe")}
            console.print(f"card:       {card_path}")
            console.print(json.dumps(summary, indent=1))
