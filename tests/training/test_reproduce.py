"""A light reproduction test that runs in CI: the first steps of every zoo recipe, bit for bit.

Each recipe trains exactly as ``headlens train NAME`` does (seed, batch, schedule over its full step
count) on one thread, for the first ``PREFIX[name]`` steps (a few hundred where a step is cheap), and
every per-step loss must equal the curve recorded in tests/data/recipe_curves.json (re-record with
``python tests/data/make_recipe_curves.py`` only for an intended change). A drift in a sampler, an
initialisation, the optimiser or the model code shows at its first step. The full runs, compared with
the model cards, stay under ``--runslow`` (``tests/training/test_zoo.py::test_recipe_reproduces_card``).
"""

from __future__ import annotations

import json

import pytest
import torch

from headlens.training.recipes import RECIPES
from tests.data.make_recipe_curves import OUT, PREFIX, environment, first_losses

RECORDED = json.loads(OUT.read_text())


def test_every_recipe_has_a_recorded_curve():
    assert set(RECORDED["curves"]) == set(RECIPES) == set(PREFIX)
    assert all(len(RECORDED["curves"][n]) == PREFIX[n] for n in PREFIX)


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_recipe_first_steps_reproduce_the_recorded_loss_curve_bit_for_bit(name):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the recorded thread count: another one sums in another order
    try:
        got = first_losses(name, PREFIX[name])
    finally:
        torch.set_num_threads(threads)
    want = RECORDED["curves"][name]
    diverged = next((i for i, (a, b) in enumerate(zip(got, want, strict=True)) if a != b), None)
    assert diverged is None, (
        f"{name}: step {diverged + 1} loss {got[diverged]!r} != recorded {want[diverged]!r} "
        f"(recorded on {RECORDED['environment']}, running on {environment()})")
