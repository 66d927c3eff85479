"""headlens.classify: planted heads are labelled exactly, the table keeps its schema."""

from __future__ import annotations

import json

import pytest
import torch

import headlens
from headlens.errors import DetectorError, ModelReferenceError, OutputError, ProbeError
from headlens.scoring.table import (
    COLUMNS,
    WEIGHT_COLUMNS,
    check_output_path,
    head_labels,
    read_table,
    write_table,
)
from headlens.testing import PLANTED_HEADS, planted_model
from tests.conftest import make_gpt


@pytest.fixture(scope="module")
def planted_table():
    return headlens.classify(planted_model(), n_prompts=24, seq_len=32, n_boot=200)


def test_planted_heads_are_labelled_and_nothing_else(planted_table):
    df = planted_table
    assert list(df.columns) == [*COLUMNS, *WEIGHT_COLUMNS]  # the weight detectors' null, copying's eigen
    labelled = {((int(r.layer), int(r.head)), r.detector) for r in df[df.label].itertuples()}
    expected = {(head, det) for det, heads in PLANTED_HEADS.items() for head in heads}
    assert labelled == expected
    row = df[(df.layer == 1) & (df["head"] == 0) & (df.detector == "induction")].iloc[0]
    assert row.score > 0.99 and row.ci_low > 0.99 and row.lift > 3 and row.n_prompts == 24
    assert head_labels(df) == {(0, 0): ["previous_token"], (1, 0): ["induction"]}


def test_uniform_heads_sit_at_their_baseline(planted_table):
    df = planted_table[(planted_table.layer == 0) & (planted_table["head"] == 2)]
    df = df[~df.detector.isin(["ov_copying", "ov_suppression", "successor"])]  # weights: no attention baseline
    assert ((df.score - df.baseline).abs() < 1e-5).all()
    assert ((df.lift - 1).abs() < 1e-4).all()


def test_provenance_and_seed_reproducibility(planted_table):
    attrs = planted_table.attrs
    assert attrs["seed"] == 0 and attrs["headlens_version"] == headlens.__version__
    assert set(attrs["probes"]) == {"random_tokens", "repeated_segments", "brackets"}  # retrieval is opt-in
    assert "next_token" in attrs["skipped"]  # causal model
    read = attrs["tokens_read"]  # every token the run fed the model, by phase: each probe's 24 prompts of 32 tokens
    assert all(read[p] == 24 * 32 for p in attrs["probes"]) and read["total"] == sum(v for k, v in read.items()
                                                                                       if k != "total")
    again = headlens.classify(planted_model(), n_prompts=24, seq_len=32, n_boot=200)
    assert again.equals(planted_table)


def test_threshold_and_explicit_detectors():
    df = headlens.classify(planted_model(), detectors="previous_token,induction", n_prompts=12, seq_len=32,
                           threshold=0.999999, n_boot=100)
    assert set(df.detector) == {"previous_token", "induction"}
    labelled = {((int(r.layer), int(r.head)), r.detector) for r in df[df.label].itertuples()}
    assert labelled == {((0, 0), "previous_token"), ((1, 0), "induction")}  # exact heads score 1.0 > 0.999999
    blurred = planted_model(sharpness=4.0)  # the induction head keeps some mass off its target
    loose = headlens.classify(blurred, detectors=["induction"], n_prompts=12, seq_len=32, n_boot=100)
    strict = headlens.classify(blurred, detectors=["induction"], n_prompts=12, seq_len=32,
                               threshold={"induction": 0.99}, n_boot=100)
    assert loose.label.sum() == 1 and not strict.label.any()


def test_bad_requests_raise_clear_errors():
    model = planted_model()
    with pytest.raises(DetectorError, match="unknown detector 'inductoin'"):
        headlens.classify(model, detectors="inductoin")
    with pytest.raises(DetectorError, match="bidirectional"):
        headlens.classify(model, detectors="next_token")
    with pytest.raises(ProbeError, match="no bracket pair"):
        headlens.classify(planted_model(alphabet="abcdefghij"), detectors="bracket_matching")
    with pytest.raises(ProbeError, match="no target positions"):
        headlens.classify(model, detectors="induction", prompts=["abcdefg"])
    with pytest.raises(ModelReferenceError):
        headlens.classify("no-such-model")
    with pytest.raises(DetectorError, match="no TransformerLens equivalent"):
        headlens.classify(model, detectors="first_token", tl_compatible=True)
    with pytest.raises(ProbeError, match="unknown corpus 'wiki'"):
        headlens.classify(model, corpus="wiki")
    with pytest.raises(ProbeError, match="either prompts or a corpus"):
        headlens.classify(model, prompts=["abc"], corpus="stdlib")


def test_user_prompts_score_every_detector_with_targets():
    model = make_gpt(seed=1)
    texts = ["f(x[1]) + f(x[2])", "abc abc abc", "if (a) { b[c] }"] * 4
    df = headlens.classify(model, prompts=texts, n_boot=100)
    assert {"previous_token", "induction", "duplicate_token", "bracket_matching", "ov_copying"} <= set(df.detector)
    assert set(df.attrs["skipped"]) == {"next_token", "coreference", "streaming",  # causal; byte tokens; no targets
                                        "name_mover", "negative_name_mover"}  # byte tokens: no single-token names
    # targets counted by hand on the byte-level text (x4 copies): closers, and closers with a closed group
    # between them and their opener: "f(x[1]) + f(x[2])" has 4 closers, 2 hard (")" after "[1]", "[2]");
    # "if (a) { b[c] }" has 3, 1 hard ("}" after "[c]"); a repeated byte: 7 + 0 + 3 in the bracket texts, 7 in
    # "abc abc abc"; every position after BOS: 17 + 11 + 15.
    per = df.groupby("detector").first()
    assert per.n_positions["bracket_matching"] == 4 * (4 + 3) and per.n_prompts["bracket_matching"] == 8
    assert per.n_positions["bracket_matching_hard"] == 4 * (2 + 1)
    assert per.n_positions["open_bracket"] == 4 * (4 + 3)
    assert per.n_positions["duplicate_token"] == 4 * (7 + 7 + 3)
    assert per.n_positions["previous_token"] == 4 * (17 + 11 + 15)


def test_default_model_fallback_is_clear(monkeypatch):
    import headlens.zoo as zoo

    monkeypatch.setattr(zoo, "ZOO", {})
    with pytest.raises(ModelReferenceError, match="default model"):
        headlens.classify()


@pytest.mark.parametrize("suffix", [".csv", ".parquet", ".json"])
def test_table_round_trip_keeps_provenance(planted_table, tmp_path, suffix):
    path = write_table(planted_table, tmp_path / f"scores{suffix}")
    back = read_table(path)
    assert list(back.columns) == list(planted_table.columns) and len(back) == len(planted_table)
    for col in WEIGHT_COLUMNS:  # floats on the weight rows, NaN on the others, through every format
        torch.testing.assert_close(torch.tensor(back[col].to_numpy()), torch.tensor(planted_table[col].to_numpy()),
                                   equal_nan=True)
    assert back.attrs["seed"] == 0 and back.attrs["probes"]["brackets"]["pairs"] == ["()", "[]"]
    torch.testing.assert_close(torch.tensor(back.score.to_numpy()), torch.tensor(planted_table.score.to_numpy()))
    assert back.label.tolist() == planted_table.label.tolist()
    assert not list(tmp_path.glob(".*tmp"))  # atomic: no temp file left


def test_csv_is_plain_csv_with_provenance_in_a_sidecar(planted_table, tmp_path):
    import csv

    import pandas as pd

    path = write_table(planted_table, tmp_path / "scores.csv")
    plain = pd.read_csv(path)  # no options: the header is the first line
    assert list(plain.columns) == list(planted_table.columns) and len(plain) == len(planted_table)
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    assert rows[0] == list(planted_table.columns) and len(rows) == len(planted_table) + 1
    side = json.loads((tmp_path / "scores.csv.json").read_text())
    assert side["headlens"]["seed"] == 0
    (tmp_path / "scores.csv.json").unlink()  # without its sidecar a CSV still reads, provenance empty
    assert read_table(path).attrs == {}


def test_output_path_checks(tmp_path):
    with pytest.raises(OutputError, match=r"unknown output suffix '\.xlsx'"):
        check_output_path(tmp_path / "a.xlsx")
    with pytest.raises(OutputError, match="does not exist"):
        check_output_path(tmp_path / "missing" / "a.csv")
