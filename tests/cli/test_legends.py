"""Tables that explain themselves: one strength scale across types, behaviour before
weights, a legend under every table, ``-`` where a column was not measured, circuit labels from a cached
classify."""

from __future__ import annotations

import io
import re

import pandas as pd
import pytest
from conftest import run_cli
from rich.console import Console

from headlens.scoring.primary import label_order, strength


def _row(layer, head, detector, score, baseline, n_prompts=10):
    return {"model": "toy", "layer": layer, "head": head, "kv_head": head, "detector": detector, "score": score,
            "ci_low": score - 0.02, "ci_high": score + 0.02, "baseline": baseline, "lift": score / baseline,
            "n_positions": 100, "n_prompts": n_prompts, "label": True, "rest": 0.5}


def test_strength_is_one_scale_and_behaviour_comes_before_weights():
    # SmolLM2's figures: induction 0.926 over 0.0231 (lift 40), copying 0.453 over 5/V (lift 4,454)
    rows = pd.DataFrame([_row(0, 0, "ov_copying", 0.453, 5 / 49152, n_prompts=0), _row(0, 0, "first_token", 0.99, 0.06),
                         _row(0, 0, "previous_token", 0.40, 0.06), _row(0, 1, "induction", 0.926, 0.0231)])
    assert strength(rows).round(3).tolist() == [0.453, 0.989, 0.362, 0.924]  # (x - chance) / (1 - chance)
    assert rows["lift"].iloc[0] > 100 * rows["lift"].iloc[3]  # lift would put the weight score first
    assert label_order(rows)["detector"].tolist() == ["induction", "previous_token", "ov_copying", "first_token"]
    from headlens.cli.summary import print_summary

    df = rows.copy()
    df.attrs.update(model="toy", n_layers=1, n_heads=2)
    buf = io.StringIO()
    print_summary(df, Console(file=buf, width=160))
    lines = buf.getvalue().splitlines()
    order = [ln.split()[0] for ln in lines if ln.split() and ln.split()[0] in set(rows.detector)]
    assert order == ["induction", "previous_token", "ov_copying", "first_token"], buf.getvalue()
    assert any(ln.startswith("n: heads with the label; strength: (score - chance) / (1 - chance)") for ln in lines)
    text = " ".join(buf.getvalue().split())
    assert "first_token (rests)" in text and "(all listed under another type)" in text
    assert "first_token: its 1 head does something else too, listed there" in text
    assert "read from the weights (what the OV circuit would write), not from attention on text: ov_copying" in lines
    assert not any(ln.rstrip().endswith(";") for ln in lines)  # each legend part on its own line


def test_pattern_types_come_before_task_types_and_the_resting_legend_counts_what_it_lists():
    from headlens.cli.summary import print_summary

    # SmolLM2's order once: negative_name_mover (0.92) above previous_token (0.90), by strength across types
    rows = [_row(24, 4, "negative_name_mover", 0.93, 0.18), _row(16, 0, "previous_token", 0.91, 0.06)]
    rows += [_row(layer, h, "first_token", 0.9 - 0.01 * h, 0.06) for layer in range(3) for h in range(8)]
    df = pd.DataFrame(rows)
    df.attrs.update(model="toy", n_layers=30, n_heads=9)
    buf = io.StringIO()
    print_summary(df, Console(file=buf, width=100))
    lines = buf.getvalue().splitlines()
    order = [ln.split()[0] for ln in lines if ln.split() and ln.split()[0] in set(df.detector)]
    assert order[:2] == ["previous_token", "negative_name_mover"], buf.getvalue()
    legend = next(ln for ln in lines if ln.startswith("first_token:"))
    shown = sum(1 for ln in lines if re.search(r"\bL\d+H\d+\b", ln)) - 2  # the first_token heads in the table
    assert 0 < shown < 24 and f"its 24 heads only rest (the strongest {shown} listed)" in legend, legend


def test_ablate_says_dash_without_controls_and_explains_its_columns():
    from headlens.cli.ablate import render

    df = pd.DataFrame([{"heads": "L1H1", "metric": "repeated_loss", "clean": 0.65, "ablated": 4.28, "delta": 3.63,
                        "ci_low": 3.58, "ci_high": 3.68, "control_delta": float("nan"), "beats_control": False,
                        "attribution": 0.78}])
    buf = io.StringIO()
    Console(file=buf, width=300).print(render(df, "t"))
    row = next(ln for ln in buf.getvalue().splitlines() if "L1H1" in ln)
    assert [c.strip() for c in row.split("│")[1:-1]][6:8] == ["-", "-"]  # control Δ, beats control: not measured
    assert "beats control: the CI of delta - control Δ clears 0" in buf.getvalue()


@pytest.mark.parametrize("cached", [True, False])
def test_circuit_fills_labels_from_a_cached_classify(monkeypatch, capsys, tiny_checkpoint, cached):
    args = ["--receivers", "L1H1", "--senders", "L0H0", "--inputs", "k", "--n-prompts", "4", "--n-control", "0"]
    code, out, _ = run_cli(monkeypatch, capsys, "circuit", "--model", "induction-2l" if cached else tiny_checkpoint,
                           *args)
    assert code == 0, out
    row = next(ln for ln in out.splitlines() if "L0H0 -> L1H1.k" in ln)
    assert ("previous_token -> induction" in row) == cached, out  # induction-2l's shipped scores
    assert ("no classify of this model is cached" in " ".join(out.split())) != cached, out
    assert "effect: the metric's change with the sender ablated on this path only" in " ".join(out.split())
