"""``headlens circuit``: the edge table on stdout and in --out, one clear line and an exit code on bad input."""

from __future__ import annotations

import pandas as pd
import pytest
import torch
from conftest import run_cli
from hf_families import build

from headlens.circuits.edges import COLUMNS

torch.set_num_threads(1)


def run(monkeypatch, capsys, *args):
    return run_cli(monkeypatch, capsys, "circuit", *args)


def test_help(monkeypatch, capsys):
    code, out, _ = run(monkeypatch, capsys, "--help")
    assert code == 0 and "--receivers" in out and "--senders" in out and "corrupted" in out and "--positions" in out


def test_edges_to_csv(monkeypatch, capsys, tiny_checkpoint, tmp_path):
    dest = tmp_path / "edges.csv"
    code, out, _ = run(monkeypatch, capsys, "--model", tiny_checkpoint, "--receivers", "L1H0,logits", "--senders", "L0H1,embed",
                       "--inputs", "k", "--method", "zero", "--n-prompts", "4", "--position-halves", "--out", str(dest))
    assert code == 0 and "L0H1 -> L1H0.k" in out
    df = pd.read_csv(dest)
    assert list(df.columns[:len(COLUMNS)]) == COLUMNS and len(df) == 4
    assert set(df.receiver_pos) == {"all"} == set(df.sender_pos)
    assert set(df.input) == {"k", "resid"} and "effect_second_half" in df.columns


def test_report_flag_writes_the_circuit_section(monkeypatch, capsys, tiny_checkpoint, tmp_path):
    page = tmp_path / "r.html"
    code, _, err = run(monkeypatch, capsys, "--model", tiny_checkpoint, "--receivers", "L1H0", "--n-prompts", "3",
                       "--n-control", "2", "--report", str(page))
    assert code == 0 and f"wrote {page}" in err.replace("\n", "")
    assert "<h2>Circuit</h2>" in page.read_text()
    code, _, err = run(monkeypatch, capsys, "--model", tiny_checkpoint, "--receivers", "L1H0", "--report", str(tmp_path / "r.txt"))
    assert code == 7 and "must end in .html" in err


@pytest.mark.parametrize(("args", "message", "exit_code"), [
    (["--receivers", "L1X0"], "unknown node 'L1X0'", 2),
    (["--receivers", "L9H0"], "out of range", 2),
    (["--receivers", "L0H1", "--senders", "L1H0"], "runs after", 2),
    (["--receivers", "L1H0", "--method", "uniform"], "unknown edge ablation method", 2),
    (["--receivers", "L1H0", "--inputs", "qx"], "unknown receiver inputs", 2),
    (["--receivers", "L1H0", "--positions", "END"], "the prompts name none", 2),
    (["--receivers", "L1H0", "--metric", "receiver:nosuch"], "unknown detector", 2),
    (["--receivers", "L1H0", "--metric", "receiver:induction", "--inputs", "v"], "q and k edges into heads only", 2),
    (["--metric", "receiver:induction"], "give --receivers", 2),
])
def test_bad_input_is_one_line(monkeypatch, capsys, tiny_checkpoint, args, message, exit_code):
    code, _, err = run(monkeypatch, capsys, "--model", tiny_checkpoint, "--n-prompts", "2", *args)
    lines = [ln for ln in err.splitlines() if ln.startswith("headlens: error")]
    assert code == exit_code and len(lines) == 1 and message in lines[0] and "Traceback" not in err


def test_circuit_on_bert_is_refused_in_one_line(monkeypatch, capsys, tmp_path):
    """An encoder is refused before any metric is built: its post-LN blocks make sender deltas non-additive."""
    path = build("bert", tmp_path / "bert")
    code, _, err = run(monkeypatch, capsys, "--model", f"hf:{path}", "--receivers", "L1H0", "--n-prompts", "2")
    lines = [ln for ln in err.splitlines() if ln.startswith("headlens: error")]
    assert code == 2 and len(lines) == 1 and "is an encoder" in lines[0] and "Traceback" not in err
