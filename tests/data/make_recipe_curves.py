"""Record the first steps of every zoo recipe's training loss, per step, for tests/training/test_reproduce.py.

    PYTHONPATH=$PWD python tests/data/make_recipe_curves.py   # writes tests/data/recipe_curves.json

Each recipe runs exactly as ``headlens train NAME`` does (its own seed, batch, learning-rate schedule
over its full step count), on ONE thread, and stops after ``PREFIX[name]`` optimiser steps. The
losses are stored as Python floats (``repr`` round-trips, so a float32 loss compares bit for bit).

Re-record only for an intended change to a recipe, its data or the model code, and say so in the
commit: a changed curve means the shipped zoo weights no longer come from this code (retrain, or run
``pytest --runslow tests/training/test_zoo.py -k reproduces`` to see whether the cards still hold).
"""

from __future__ import annotations

import json
import platform
import sys
import tempfile
from pathlib import Path

import torch

from headlens.training.recipes import RECIPES, get_recipe
from headlens.training.train import train

OUT = Path(__file__).parent / "recipe_curves.json"
# steps per recipe: a few hundred where a step is cheap; the whole test stays under ~30 s on one thread
PREFIX = {"induction-2l": 300, "dyck": 150, "llama-induction": 150, "needle-2k": 120, "code": 25}


class _Stop(Exception):
    pass


def first_losses(name: str, n: int) -> list[float]:
    """The per-step training loss of recipe ``name`` for its first ``n`` steps (one thread)."""
    losses: list[float] = []

    def on_step(step: int, total: int, loss: float, tokens_per_s: float) -> None:
        losses.append(loss)
        if step == n:
            raise _Stop

    with tempfile.TemporaryDirectory() as tmp:
        try:
            train(get_recipe(name), tmp, snapshots=0, on_step=on_step)
        except _Stop:
            pass
    return losses


def environment() -> dict[str, str]:
    return {"torch": torch.__version__, "python": platform.python_version(), "machine": platform.machine(),
            "threads": "1"}


def main() -> None:
    torch.set_num_threads(1)
    assert set(PREFIX) == set(RECIPES), sorted(RECIPES)
    curves = {}
    for name in sorted(RECIPES):
        curves[name] = first_losses(name, PREFIX[name])
        print(f"{name}: {len(curves[name])} steps, loss {curves[name][0]:.4f} -> {curves[name][-1]:.4f}", file=sys.stderr)
    OUT.write_text(json.dumps({"environment": environment(), "curves": curves}, indent=0) + "\n")


if __name__ == "__main__":
    main()
