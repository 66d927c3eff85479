"""``headlens classify``: the labelled heads on stdout; bad input is one stderr line and its exit code."""

from __future__ import annotations

import json
import re

import pytest
from typer.testing import CliRunner

from headlens.cli import app
from headlens.models.checkpoint import save_checkpoint
from headlens.scoring.table import read_table
from headlens.testing import planted_model

runner = CliRunner()


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return str(save_checkpoint(planted_model(), tmp_path_factory.mktemp("m") / "planted.safetensors"))


def _run(*args: str):
    return runner.invoke(app, ["classify", *args])


def _one_error_line(result, code: int, text: str) -> None:
    assert result.exit_code == code, (result.exit_code, result.output)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("headlens: error:"), result.stderr
    assert text in lines[0]
    assert "Traceback" not in result.output


def test_classify_prints_labelled_heads_and_writes_the_table(ckpt, tmp_path):
    out = tmp_path / "scores.json"
    result = _run("--model", ckpt, "--n-prompts", "12", "--seq-len", "32", "--out", str(out), "--quiet")
    assert result.exit_code == 0, result.output
    assert "L0H0" in result.stdout and "L1H0" in result.stdout
    assert "PT" in result.stdout and "IND" in result.stdout  # the layer x head overview (viz.grid.LABEL_MARKS)
    table = read_table(out)
    assert sorted(map(tuple, table[table.label][["layer", "head"]].to_numpy().tolist())) == [(0, 0), (1, 0)]
    assert json.loads(out.read_text())["provenance"]["model"] == "planted"


def test_summary_by_default_every_labelled_row_with_all(tmp_path):
    from headlens.testing import resting_model

    ckpt = str(save_checkpoint(resting_model(), tmp_path / "resting.safetensors"))
    out = tmp_path / "scores.csv"
    args = ["--model", ckpt, "--n-prompts", "12", "--seq-len", "32", "-q"]
    summary = _run(*args, "--out", str(out)).stdout
    assert f"full table ({len(read_table(out))} rows): in {out}" in summary.replace("\n", "")
    first = next(ln for ln in summary.splitlines() if ln.lstrip().startswith("first_token"))
    assert "L1H1" in first and "L1H0" not in first  # L1H0 rests too, and is listed as the induction head it is
    every = _run(*args, "--all").stdout
    cells = [[x.strip() for x in ln.split("│")[1:-1]] for ln in every.splitlines() if ln.startswith("│")]
    rows = {(c[0], c[2]) for c in cells if re.fullmatch(r"L\d+H\d+", c[0])}  # the grid's rows are L0, L1
    table = read_table(out)
    assert rows == {(f"L{r.layer}H{r.head}", r.detector) for r in table[table.label].itertuples()}
    assert ("L1H0", "first_token") in rows and "full table" not in every
    assert "not written (--out" in _run(*args).stdout


def test_user_prompts_jsonl(ckpt, tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("\n".join(json.dumps({"text": t}) for t in ["abcabc", "ab(cd)ab(cd)", "[a[b]c]"] * 4))
    result = _run("--model", ckpt, "--prompts", str(prompts), "--detectors", "induction,previous_token", "-q")
    assert result.exit_code == 0, result.output
    assert "L0H0" in result.stdout


@pytest.mark.parametrize(
    ("args", "code", "text"),
    [
        (["--model", "no-such-model"], 4, "unknown model reference 'no-such-model'"),
        (["--detectors", "inductoin"], 6, "unknown detector 'inductoin'"),
        (["--detectors", "next_token"], 6, "needs a bidirectional model"),
        (["--out", "scores.xlsx"], 7, "unknown output suffix '.xlsx'"),
        (["--out", "/no/such/folder/scores.csv"], 7, "does not exist"),
        (["--prompts", "/no/such/prompts.txt"], 5, "does not exist"),
    ],
)
def test_bad_input_is_one_line_and_an_exit_code(ckpt, args, code, text):
    _one_error_line(_run("--model", ckpt, *args), code, text)


def test_output_path_that_is_a_folder(ckpt, tmp_path):
    folder = tmp_path / "x.csv"
    folder.mkdir()
    _one_error_line(_run("--model", ckpt, "--out", str(folder)), 7, "it is a folder")


def test_prompt_files_that_cannot_be_used(ckpt, tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n")
    _one_error_line(_run("--model", ckpt, "--prompts", str(empty)), 5, "has no prompts")
    long = tmp_path / "long.txt"
    long.write_text("abcdefghij" * 10 + "\n")
    _one_error_line(_run("--model", ckpt, "--prompts", str(long)), 5, "--truncate")
    result = _run("--model", ckpt, "--prompts", str(long), "--truncate", "-q")
    assert result.exit_code == 0 and "warning: 1 prompt(s)" in result.stderr
    no_repeats = tmp_path / "plain.txt"
    no_repeats.write_text("abcdefg\n")
    _one_error_line(_run("--model", ckpt, "--prompts", str(no_repeats), "--detectors", "induction"), 5,
                    "no target positions")


def test_tl_compatible_flag(ckpt):
    result = _run("--model", ckpt, "--tl-compatible", "--n-prompts", "10", "--seq-len", "32", "-q")
    assert result.exit_code == 0, result.output
    assert "tl_compatible" in result.stdout


def test_corpus_stdlib_reads_real_python(tmp_path):
    out = tmp_path / "scores.csv"
    result = _run("--model", "code", "--corpus", "stdlib", "--n-prompts", "12", "--seq-len", "96",
                  "--detectors", "previous_token", "--out", str(out), "-q")
    assert result.exit_code == 0, result.output
    assert "prev" in result.stdout
    assert read_table(out).attrs["probes"]["stdlib"]["n_prompts"] == 12
    import pandas as pd

    assert list(pd.read_csv(out).columns)[:3] == ["model", "layer", "head"]  # plain CSV, no options


def test_unknown_corpus_is_a_probe_error():
    _one_error_line(_run("--model", "code", "--corpus", "wiki", "-q"), 5, "unknown corpus 'wiki'")


def test_scan_path_flag_runs_sparse_and_rejects_unknown_paths(ckpt, tmp_path):
    out = tmp_path / "sparse.json"
    result = _run("--model", ckpt, "--n-prompts", "10", "--seq-len", "32", "--detectors",
                  "previous_token,streaming(s=1,w=8)", "--scan-path", "sparse", "--out", str(out), "--quiet")
    assert result.exit_code == 0, result.output
    assert "sparse" in out.read_text() and "streaming(s=1,w=8)" in out.read_text()
    _one_error_line(_run("--model", ckpt, "--scan-path", "fast", "--quiet"), 2, "unknown --scan-path 'fast'")  # a bad value: 2
