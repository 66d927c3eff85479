"""``headlens doctor``: readable report, --json, exit 0 when fine and 8 on a head-count mismatch."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from doctor_subjects import TRUE_N_HEADS, evaluation_texts, trained_model, write_lying_checkpoint
from typer.testing import CliRunner

from headlens.cli import app
from headlens.models.checkpoint import save_checkpoint

runner = CliRunner()


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("doctor_cli")
    model = trained_model()
    (d / "eval.txt").write_text("\n".join(evaluation_texts()) + "\n")
    return {
        "ok": save_checkpoint(model, d / "ok.safetensors"),
        "lie": write_lying_checkpoint(model, d / "lie.safetensors", 8),
        "text": d / "eval.txt",
    }


def test_correct_checkpoint_exits_0(files) -> None:
    result = runner.invoke(app, ["doctor", str(files["ok"]), "--text", str(files["text"])])
    assert result.exit_code == 0, result.output
    assert "PASSED" in result.output and f"inferred n_heads: {TRUE_N_HEADS}" in result.output


def test_lying_checkpoint_exits_8_with_json(files) -> None:
    result = runner.invoke(app, ["doctor", str(files["lie"]), "--json", "--text", str(files["text"])])
    assert result.exit_code == 8, result.output
    data = json.loads(result.stdout)
    assert data["passed"] is False and data["config_n_heads"] == 8 and data["inferred_n_heads"] == TRUE_N_HEADS
    assert len(data["evidence"]) == 6 and data["warnings"]


def test_n_heads_option(files) -> None:
    args = ["doctor", str(files["ok"]), "--text", str(files["text"])]
    assert runner.invoke(app, [*args, "--n-heads", str(TRUE_N_HEADS)]).exit_code == 0
    result = runner.invoke(app, [*args, "--n-heads", "2"])
    assert result.exit_code == 8 and "you asked for n_heads=2" in result.output


def test_help_and_bad_inputs_give_one_line(files, tmp_path) -> None:
    assert runner.invoke(app, ["doctor", "--help"]).exit_code == 0
    for args, code in (([str(files["ok"]), "--n-heads", "5"], 2),
                       ([str(files["ok"]), "--text", str(tmp_path / "nope.txt")], 5)):
        result = runner.invoke(app, ["doctor", *args])  # in-process too: one line and the error's exit code
        assert result.exit_code == code, (args, result.output)
        assert result.stderr.startswith("headlens: error:") and len(result.stderr.strip().splitlines()) == 1
    # the real console script: one line on stderr, the error's exit code, no traceback
    proc = subprocess.run([sys.executable, "-m", "headlens", "doctor", str(tmp_path / "missing.safetensors")],
                          capture_output=True, text=True)
    assert proc.returncode == 4, proc.stderr
    assert proc.stderr.startswith("headlens: error:") and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
