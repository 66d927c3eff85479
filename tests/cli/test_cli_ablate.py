"""``headlens ablate``: tables on stdout, data to --out, one clear line and an exit code on bad input."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch
from conftest import run_cli

torch.set_num_threads(1)  # tiny models: one thread is fastest on a shared 2-core machine


def run(monkeypatch, capsys, *args):
    return run_cli(monkeypatch, capsys, "ablate", *args)


def test_help(monkeypatch, capsys):
    code, out, _ = run(monkeypatch, capsys, "--help")
    assert code == 0 and "--heads" in out and "--sweep" in out and "resample" in out


def test_group_to_csv(monkeypatch, capsys, tiny_checkpoint, tmp_path):
    dest = tmp_path / "res.csv"
    code, out, _ = run(monkeypatch, capsys, "--model", tiny_checkpoint, "--heads", "L1H2,L0H3", "--method", "mean",
                       "--metric", "repeated_loss,kl", "--n-prompts", "4", "--out", str(dest))
    assert code == 0 and "L1H2+L0H3" in out and "repeated_loss" in out
    df = pd.read_csv(dest)
    assert df.heads.tolist() == ["L1H2+L0H3"] * 2 and set(df.method) == {"mean"}
    assert {"clean", "ablated", "delta", "ci_low", "ci_high", "control_delta", "beats_control"} <= set(df.columns)


def test_sweep_to_json(monkeypatch, capsys, tiny_checkpoint, tmp_path):
    dest = tmp_path / "res.json"
    code, _, err = run(monkeypatch, capsys, "--model", tiny_checkpoint, "--sweep", "--heads", "L0H0", "--n-prompts", "4",
                       "--out", str(dest))
    data = json.loads(dest.read_text())
    rows = data["rows"]  # a provenance block beside the rows, as for classify
    assert code == 0 and len(rows) == 8  # the given group is one of the singles: no duplicate row
    assert {r["model"] for r in rows} == {"gpt"} and data["provenance"]["method"] == "zero"  # the saved name
    assert "Spearman" in err  # attribution vs exact, on stderr


@pytest.mark.parametrize(
    ("args", "code", "needle"),
    [
        (["--heads", "L1X2"], 2, "malformed head id 'L1X2'"),
        (["--heads", "L5H0"], 2, "out of range"),
        (["--heads", "L0H0", "--method", "drop"], 2, "unknown ablation method 'drop'"),
        (["--heads", "L0H0", "--metric", "acc"], 2, "unknown metric 'acc'"),
        ([], 2, "give --heads"),
        (["--heads", "L0H0", "--out", "x.txt"], 7, "unknown output suffix"),
        (["--heads", "L0H0", "--out", "/no/such/dir/x.csv"], 7, "does not exist"),
    ],
)
def test_bad_input_is_one_line(monkeypatch, capsys, tiny_checkpoint, args, code, needle):
    got, _, err = run(monkeypatch, capsys, "--model", tiny_checkpoint, *args)
    lines = [ln for ln in err.splitlines() if ln.startswith("headlens: error:")]
    assert got == code and len(lines) == 1 and needle in lines[0]
    assert "Traceback" not in err


def test_bad_model_and_prompts(monkeypatch, capsys, tiny_checkpoint, tmp_path):
    got, _, err = run(monkeypatch, capsys, "--model", "no-such-model", "--heads", "L0H0")
    assert got == 4 and "unknown model reference" in err
    empty = tmp_path / "empty.txt"
    empty.write_text("\n  \n")
    got, _, err = run(monkeypatch, capsys, "--model", tiny_checkpoint, "--heads", "L0H0", "--prompts", str(empty))
    assert got == 5 and "has no prompts" in err


def test_prompts_file_lm_loss(monkeypatch, capsys, tiny_checkpoint, tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"text": "def f(x): return x"}\nimport os\n')
    code, out, _ = run(monkeypatch, capsys, "--model", tiny_checkpoint, "--heads", "L1H1", "--metric", "lm_loss",
                       "--prompts", str(prompts))
    assert code == 0 and "lm_loss" in out
