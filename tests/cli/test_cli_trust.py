"""What a user meets, item by item: runs never mixed, progress in logs, one vocabulary,
discoverable commands and options, readable output."""

from __future__ import annotations

import io
import re

import pandas as pd
import pytest
import torch
from rich.console import Console
from typer.testing import CliRunner

import headlens
from headlens.cli import app
from headlens.cli.options import CHOICES, EXIT_CODES
from headlens.models.checkpoint import save_checkpoint
from headlens.testing import planted_model

runner = CliRunner()
torch.set_num_threads(1)


def _rows(detector: str, labelled: dict[tuple[int, int], float], n_positions: int = 100, weights: bool = False):
    rows = []
    for layer in range(2):
        for head in range(2):
            score = labelled.get((layer, head), 0.05)
            rows.append({"model": "toy", "layer": layer, "head": head, "kv_head": head, "detector": detector,
                         "score": score, "ci_low": score - (0 if weights else 0.02),
                         "ci_high": score + (0 if weights else 0.02), "baseline": float("nan") if weights else 0.05,
                         "lift": float("nan") if weights else score / 0.05, "n_positions": 0 if weights else n_positions,
                         "n_prompts": 0 if weights else 8, "label": (layer, head) in labelled})
    return rows


def _table(rows) -> pd.DataFrame:
    df = pd.DataFrame(rows)
    df.attrs.update({"model": "toy", "n_layers": 2, "n_heads": 2,
                     "skipped": {"streaming": "streaming: the random_tokens probe has no target positions"}})
    return df


def _printed(df, asked=None) -> str:
    from headlens.cli.classify import print_results

    buf = io.StringIO()
    print_results(df, Console(file=buf, width=160), *([asked] if asked is not None else []))
    return buf.getvalue()


def _summary(df, width: int = 160) -> str:
    from headlens.cli.summary import print_summary

    buf = io.StringIO()
    print_summary(df, Console(file=buf, width=width))
    return buf.getvalue()


# -- one vocabulary -----------------------------------------------------------------------------
def test_first_token_is_1st_in_the_cli_grid_the_dashboard_and_the_report():
    from headlens.viz.grid import LABEL_MARKS, head_grid_figure, label_mark

    df = _table(_rows("first_token", {(1, 1): 0.9}) + _rows("sink", {(0, 1): 0.9}))
    grid = _printed(df).split("layer x head")[1]
    assert re.search(r"L1 .*1st", grid) and re.search(r"L0 .*SNK", grid)
    assert "sink" not in grid  # `sink` is another detector's name
    rows = {line.split()[0]: line for line in _summary(df).splitlines() if re.match(r"\s*L\d+\s", line)}
    assert "1st" in rows["L1"] and "SNK" in rows["L0"]  # the default summary's grid
    fig = head_grid_figure(df, "first_token", 2, 2, color_by="label")
    import numpy as np

    marks = {str(t) for trace in fig.data if trace.text is not None for t in np.asarray(trace.text, dtype=object).ravel()}
    assert "1st" in marks and "SNK" in marks  # the dashboard's squares
    assert label_mark("first_token") == LABEL_MARKS["first_token"] == "1st"


def test_every_registered_detector_has_its_own_mark():
    from headlens.detectors import all_detectors
    from headlens.viz.grid import LABEL_MARKS, label_mark

    names = list(all_detectors())
    assert set(names) <= set(LABEL_MARKS)
    marks = [label_mark(n) for n in names]
    assert len(set(marks)) == len(marks), marks


def test_the_dashboard_scans_with_the_cli_defaults_and_ships_them():
    import inspect

    from headlens.app import helpers as hd
    from headlens.scoring.classification import classify
    from headlens.zoo import scores

    assert hd.DEFAULT_N_PROMPTS == inspect.signature(classify).parameters["n_prompts"].default == 64
    from headlens.zoo import DEFAULT_MODEL, ZOO

    shipped = scores.read(DEFAULT_MODEL, hd.DEFAULT_N_PROMPTS, 0)
    assert shipped is not None  # shipped with these settings (tests/training/test_zoo.py re-measures it)
    labelled = {(int(r.layer), int(r.head), r.detector) for r in shipped[shipped["label"]].itertuples()}
    for det, heads in ZOO[DEFAULT_MODEL].known_heads.items():  # what `headlens models` advertises
        for head in heads:
            layer, h = map(int, re.fullmatch(r"L(\d+)H(\d+)", head).groups())
            assert (layer, h, det) in labelled, (head, det)


# -- readable output ----------------------------------------------------------------------------
def test_weight_rows_say_weights_and_unasked_skips_are_silent():
    df = _table(_rows("ov_copying", {(0, 0): 0.97}, weights=True))
    out = _printed(df)
    row = next(line for line in out.splitlines() if "ov_copying" in line)
    cells = [c.strip() for c in row.split("│")[1:-1]]  # head, kv_head, detector, strength, score, CI, baseline, lift,
    # positions, rest: no baseline, no strength; not [0.970, 0.970] and 0 positions
    assert cells[3:] == ["-", "0.970", "weights", "-", "-", "-", "-"], cells
    assert "skipped streaming" not in out
    assert "skipped streaming" in _printed(df, ["ov_copying", "streaming"])  # asked for: told why not
    summary = next(line for line in _summary(df).splitlines() if "ov_copying" in line).split()
    assert summary == ["ov_copying", "OVC", "1", "L0H0", "-", "0.970", "weights", "-"], summary  # no baseline: no
    # strength; CI, rest


def test_confirm_names_the_metric_and_rounds():
    df = _table(_rows("induction", {(1, 0): 0.8}))
    df["ablation_metric"] = ["repeated_loss" if lab else None for lab in df["label"]]
    df["ablation_delta"] = [3.429374123 if lab else float("nan") for lab in df["label"]]
    df["confirmed"] = df["label"]
    out = _printed(df)
    assert "repeated_loss +3.429" in out and "3.429374" not in out


@pytest.fixture(scope="module")
def series(tmp_path_factory):
    root = tmp_path_factory.mktemp("series")
    for step, sharp in ((100, 0.0), (200, 30.0)):
        save_checkpoint(planted_model(sharpness=sharp), root / f"step_{step:05d}.safetensors",
                        metadata={"recipe": "planted", "seed": 0, "step": step, "steps": 200, "loss": 1.0})
    return root


def test_trajectory_prints_a_per_head_summary(series):
    result = runner.invoke(app, ["trajectory", "--models", str(series), "-d", "previous_token,induction",
                                 "--n-prompts", "12", "--seq-len", "24", "-q"])
    assert result.exit_code == 0, result.output
    rows = {line.split("│")[1].strip() + " " + line.split("│")[2].strip(): line for line in result.stdout.splitlines()
            if line.startswith("│")}
    assert set(rows) == {"L0H0 previous_token", "L1H0 induction"}, result.stdout
    for line in rows.values():
        cells = [c.strip() for c in line.split("│")[1:-1]]
        assert cells[2] == "200" and float(cells[4]) > 0.9 and cells[5] == "yes"  # first labelled, final score
    assert "2 checkpoints, steps 100..200" in result.stdout
    assert "different runs" not in result.stderr  # one run


def test_trajectory_warns_once_when_runs_are_mixed(series, tmp_path):
    other = tmp_path / "step_00300.safetensors"
    save_checkpoint(planted_model(), other, metadata={"recipe": "planted", "seed": 1, "step": 300, "steps": 300})
    result = runner.invoke(app, ["trajectory", "--models", str(series), "--models", str(other), "-d",
                                 "previous_token", "--n-prompts", "12", "--seq-len", "16", "-q"])
    assert result.exit_code == 0, result.output
    warnings = [line for line in result.stderr.splitlines() if "warning" in line]
    assert len(warnings) == 1 and "different runs" in warnings[0] and "seeds 0, 1" in warnings[0], result.stderr


# -- runs never mixed ---------------------------------------------------------------------------
def test_train_refuses_a_used_run_folder_and_overwrite_clears_the_old_snapshots(tmp_path):
    run = tmp_path / "run"
    args = ["train", "induction-2l", "-o", str(run), "--no-evaluate", "-q", "--threads", "1"]
    first = runner.invoke(app, [*args, "--steps", "4", "--snapshots", "2"])
    assert first.exit_code == 0, first.output
    assert sorted(p.name for p in (run / "snapshots").iterdir()) == ["step_00002.safetensors", "step_00004.safetensors"]
    again = runner.invoke(app, [*args, "--steps", "3", "--snapshots", "1"])
    assert again.exit_code == 7 and "--overwrite" in again.stderr
    assert again.stderr.count("\n") == 1
    over = runner.invoke(app, [*args, "--steps", "3", "--snapshots", "1", "--overwrite"])
    assert over.exit_code == 0, over.output
    assert sorted(p.name for p in (run / "snapshots").iterdir()) == ["step_00003.safetensors"]  # no mix


# -- progress -----------------------------------------------------------------------------------
def test_line_progress_every_ten_percent_and_every_ten_seconds():
    from headlens.cli.progress import LineProgress

    now = [0.0]
    out = io.StringIO()
    bar = LineProgress("scan", stream=out, clock=lambda: now[0], fields={"loss": "loss {:.2f}"})
    for i in range(1, 101):  # 100 steps of 0.1 s: 10 % lines
        now[0] += 0.1
        bar.update(i, 100, loss=1.0 / i)
    bar.finish()
    lines = out.getvalue().splitlines()
    assert len(lines) == 9 and lines[-1].startswith("headlens: scan: 100/100 (100 %) loss 0.01")  # 20 %..100 %
    assert lines[-1].endswith(", 10 s elapsed"), lines[-1]
    out2 = io.StringIO()
    slow = LineProgress("train", stream=out2, clock=lambda: now[0])
    for i in range(1, 1001):  # 1000 steps of 1 s: a line every 8 s (and at each 10 %)
        now[0] += 1.0
        slow.update(i, 1000)
    assert 125 <= len(out2.getvalue().splitlines()) <= 135


def test_train_writes_progress_lines_when_not_on_a_terminal(tmp_path, monkeypatch):
    import headlens.cli.progress as progress

    monkeypatch.setattr(progress, "QUIET_START_S", 0.0)
    result = runner.invoke(app, ["train", "induction-2l", "-o", str(tmp_path / "r"), "--steps", "10",
                                 "--snapshots", "0", "--no-evaluate"])
    assert result.exit_code == 0, result.output
    lines = [line for line in result.stderr.splitlines() if line.startswith("headlens: train induction-2l:")]
    steps = [line for line in lines if " loss " in line]  # (the heartbeat may say it is starting, before step 1)
    assert len(steps) == 10 and "10/10 (100 %) loss" in lines[-1] and "tok/s" in lines[-1], lines


# -- discoverable -------------------------------------------------------------------------------
def test_version_and_detectors():
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0 and result.stdout.strip() == f"headlens {headlens.__version__}"
    import json

    from headlens.detectors import all_detectors

    listed = json.loads(runner.invoke(app, ["detectors", "--json"]).stdout)
    assert [d["name"] for d in listed] == list(all_detectors())
    by_name = {d["name"]: d for d in listed}
    assert by_name["induction"]["probe"] == "repeated_segments" and by_name["induction"]["threshold"] == "0.4"
    assert by_name["ov_copying"]["kind"] == "weights" and by_name["ov_copying"]["threshold"] == "0.05"
    table = runner.invoke(app, ["detectors"], env={"COLUMNS": "300"}).stdout
    assert "previous_token" in table and "1st" in table


def _help(*command: str) -> str:
    result = runner.invoke(app, [*command, "--help"], env={"COLUMNS": "400"})
    assert result.exit_code == 0, result.output
    return " ".join(result.stdout.split())


def test_help_lists_the_registries_and_the_exit_codes():
    from headlens.interventions.metrics import METRICS
    from headlens.training.recipes import RECIPES

    ablate = _help("ablate")
    assert all(m in ablate for m in METRICS) and "needle_recall" in ablate
    assert all(r in _help("train") for r in RECIPES) and "needle-2k" in _help("train")
    for command in [c.name for c in app.registered_commands] + []:
        text = _help(command)
        assert all(f"{code} " in text.split("Exit codes:")[-1] for code in EXIT_CODES), command
        assert not [k for k in CHOICES if "{" + k + "}" in text], (command, "an unfilled placeholder")


def test_shared_options_have_the_same_letters_everywhere():
    import typer

    click_app = typer.main.get_command(app)
    short: dict[str, set[str]] = {}
    flags: dict[str, set[str]] = {}
    for name, command in click_app.commands.items():
        for param in command.params:
            longs = sorted(o for o in param.opts if o.startswith("--"))
            for o in param.opts:
                if re.fullmatch(r"-[a-zA-Z]", o):
                    short.setdefault(o, set()).update(longs)
            flags[name] = {o for p in command.params for o in p.opts}
    assert {k: v for k, v in short.items() if len(v) > 1} == {}, short  # -p is --prompts or nothing
    scanning = ("classify", "ablate", "trajectory")
    for flag in ("--detectors", "--n-prompts", "--seq-len", "--batch-size", "--seed", "--quiet", "-q", "--out", "-o",
                 "--dtype", "--device", "--trust-remote-code", "--resume"):
        assert all(flag in flags[c] for c in scanning if not (c == "ablate" and flag == "--detectors")), flag
    assert "--corpus" in flags["ablate"] and "--threshold" in flags["trajectory"]


def test_the_docs_list_every_exit_code_and_command():
    from pathlib import Path

    page = (Path(__file__).resolve().parents[2] / "docs" / "cli.md").read_text()
    rows = dict(re.findall(r"^\| (\d+) \| (.+) \|$", page, flags=re.M))
    assert set(map(int, rows)) == set(EXIT_CODES)
    assert all(f"`headlens {c.name}`" in page for c in app.registered_commands)


# -- the API ------------------------------------------------------------------------------------
def test_top_level_names_are_callable_and_sweep_is_the_ablate_table():
    import headlens.interventions.sweep as sweep_module

    assert headlens.sweep is sweep_module.sweep and "headlens ablate" in headlens.sweep.__doc__
    assert all(callable(getattr(headlens, n)) for n in headlens.__all__ if n != "__version__")
    import importlib

    assert callable(importlib.import_module("headlens.doctor").check_checkpoint)  # the package stays importable
    assert "doctor" not in headlens.__all__


def test_no_docstring_or_card_cites_the_missing_head_scores_file():
    from pathlib import Path

    root = Path(headlens.__file__).parent
    cited = [str(p) for p in root.rglob("*") if p.suffix in (".py", ".md", ".json") and p.is_file()
             and "HEAD_SCORES" in p.read_text(errors="ignore")]
    assert cited == []
    assert "docs/scores.md" in headlens.classify.__doc__


def test_line_progress_says_the_time_left_and_restarts_it_for_each_stage():
    from headlens.cli.progress import LineProgress

    now = [0.0]
    out = io.StringIO()
    bar = LineProgress("patching edges", stream=out, clock=lambda: now[0])
    for i in range(1, 41):  # 40 edges of 1 s each: at 10 % (4 s) the line says 36 s left
        now[0] += 1.0
        bar.update(i, 40)
    for i in range(1, 5):  # a new stage: 4 edges of 5 s each, its own grid and pace
        now[0] += 5.0
        bar.update(i, 4, "discovery round 2: patching edges")
    lines = out.getvalue().splitlines()
    assert lines[0] == "headlens: patching edges: 4/40 (10 %), 4 s elapsed, about 36 s left", lines
    assert lines[-1] == "headlens: discovery round 2: patching edges: 4/4 (100 %), 1 min 00 s elapsed", lines
    assert "headlens: discovery round 2: patching edges: 1/4 (25 %), 45 s elapsed, about 15 s left" in lines, lines
