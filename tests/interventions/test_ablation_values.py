"""The numbers ``headlens ablate`` writes, against an independent computation (tests/ablation_reference.py).

The model is the zoo's trained induction-2l, where knocking out the induction head costs a lot of
repeated-half loss: a wrong head, a wrong position or a no-op ablation all show. The probe prompts
are the metric's own (``repeated_task(model, n, seed=0)``); their layout is checked by hand and the
positions, the ablation and the losses are computed without headlens' ablation or metric code.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from ablation_reference import logits, per_prompt_kl, per_prompt_loss, repeated_positions
from conftest import run_cli

import headlens
from headlens.interventions.metrics import bootstrap_ci, repeated_task
from headlens.zoo import ZOO

MODEL = "induction-2l"
N_PROMPTS = 8


def _heads(name: str) -> list[tuple[int, int]]:
    return [(int(h[1:h.index("H")]), int(h[h.index("H") + 1:])) for h in name.split(",")]


@pytest.fixture(scope="module")
def model():
    torch.set_num_threads(1)
    return headlens.load(MODEL)


def _cli(monkeypatch, capsys, *args):
    return run_cli(monkeypatch, capsys, "ablate", *args)


@pytest.mark.parametrize("method", ["zero", "mean"])
def test_cli_ablate_values_equal_an_independent_computation(model, monkeypatch, capsys, tmp_path, method):
    heads = ",".join(ZOO[MODEL].known_heads["induction"])  # L1H1 ... the trained induction head(s)
    dest = tmp_path / "res.csv"
    code, out, err = _cli(monkeypatch, capsys, "--model", MODEL, "--heads", heads, "--method", method,
                          "--metric", "repeated_loss,kl", "--n-prompts", str(N_PROMPTS), "--n-control", "2",
                          "--out", str(dest))
    assert code == 0, err
    table = pd.read_csv(dest).set_index("metric")

    tokens = repeated_task(model, N_PROMPTS, seed=0).tokens  # the metric's probe: BOS + r + r
    pos = repeated_positions(tokens)
    clean = logits(model, tokens)
    ablated = logits(model, tokens, _heads(heads), method)
    loss_clean, loss_ablated = per_prompt_loss(clean, tokens, pos), per_prompt_loss(ablated, tokens, pos)
    delta = loss_ablated - loss_clean
    assert delta.mean() > 1.0  # the induction head carries the repeated half: a large, known effect

    row = table.loc["repeated_loss"]
    assert row.clean == pytest.approx(loss_clean.mean(), abs=1e-5)
    assert row.ablated == pytest.approx(loss_ablated.mean(), abs=1e-5)
    assert row.delta == pytest.approx(delta.mean(), abs=1e-5)
    assert (row.ci_low, row.ci_high) == pytest.approx(bootstrap_ci(delta, 1000, 0), abs=1e-5)
    assert row.n_prompts == N_PROMPTS and row.method == method and row["heads"] == heads.replace(",", "+")
    assert f"{delta.mean():+.4f}" in out  # the table on stdout shows the same value

    kl = per_prompt_kl(clean, ablated, pos)
    assert table.loc["kl"].delta == pytest.approx(kl.mean(), rel=1e-4, abs=1e-6) and kl.mean() > 0.1
    assert table.loc["kl"].clean == 0


def test_cli_sweep_values_equal_an_independent_computation_for_every_head(model, monkeypatch, capsys, tmp_path):
    """``ablate --sweep``: every single head's delta, by hand; the heads that matter are the circuit's."""
    tokens = repeated_task(model, N_PROMPTS, seed=0).tokens
    pos = repeated_positions(tokens)
    clean = per_prompt_loss(logits(model, tokens), tokens, pos)
    by_head = {}
    for layer in range(model.n_layers):
        for h in range(model.n_heads):
            by_head[f"L{layer}H{h}"] = float(np.mean(
                per_prompt_loss(logits(model, tokens, [(layer, h)]), tokens, pos) - clean))
    dest = tmp_path / "sweep.csv"
    code, _, err = _cli(monkeypatch, capsys, "--model", MODEL, "--sweep", "--method", "zero", "--metric",
                        "repeated_loss", "--n-prompts", str(N_PROMPTS), "--n-control", "1", "--out", str(dest))
    assert code == 0, err
    table = pd.read_csv(dest).set_index("heads")
    for head, expected in by_head.items():  # every single head of the sweep, by hand
        assert table.loc[head, "delta"] == pytest.approx(expected, abs=1e-5), head
    known = ZOO[MODEL].known_heads
    circuit = [*known["previous_token"], *known["induction"]]
    assert all(by_head[h] > 1.0 for h in circuit) and max(by_head, key=by_head.get) in circuit
