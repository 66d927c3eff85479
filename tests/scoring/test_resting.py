"""Resting on the first token is shown once (the ``rest`` column), and labels show what a head does when it is
not resting: planted heads that rest and do nothing else or rest and do induction, the one order every view
uses, the column's schema, and ``rest`` against transformers' own eager attentions on a GQA Llama."""

from __future__ import annotations

import io
import re

import numpy as np
import pandas as pd
import pytest
import torch
from rich.console import Console

import headlens
from headlens.errors import HeadlensError
from headlens.scoring.primary import label_order, strongest_rows
from headlens.scoring.summary import type_summaries
from headlens.scoring.table import head_labels, labelled_heads, read_table, validate, write_table
from headlens.testing import RESTING_HEADS, resting_model

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def resting_table():
    return headlens.classify(resting_model(), n_prompts=16, seq_len=32, n_boot=200)


def _row(df, layer, head, detector):
    return df[(df.layer == layer) & (df["head"] == head) & (df.detector == detector)].iloc[0]


def _summary(df) -> str:
    from headlens.cli.summary import print_summary

    buf = io.StringIO()
    print_summary(df, Console(file=buf, width=160))
    return buf.getvalue()


def test_the_planted_heads_carry_their_labels(resting_table):
    labelled = {((int(r.layer), int(r.head)), r.detector) for r in resting_table[resting_table.label].itertuples()}
    expected = {(h, det) for det, heads in {**RESTING_HEADS, "previous_token": [(0, 0)]}.items() for h in heads}
    assert labelled == expected


def test_a_head_that_only_rests_stays_findable_and_is_no_other_type(resting_table):
    df = resting_table
    assert head_labels(df)[(1, 1)] == ["first_token"]
    assert _row(df, 1, 1, "first_token").rest == pytest.approx(1.0, abs=1e-6)
    types = {t.detector: t for t in type_summaries(df)}
    listed = {t.detector: {(int(r.layer), int(r.head)) for r in t.heads.itertuples()} for t in types.values()}
    assert listed["first_token"] == {(1, 1)} and types["first_token"].n_labelled == 2
    assert types["first_token"].n_only == 1  # L1H0 rests too, but is listed as what it does
    assert all((1, 1) not in heads for det, heads in listed.items() if det != "first_token")
    line = next(ln for ln in _summary(df).splitlines() if ln.lstrip().startswith("first_token"))
    assert line.split()[:4] == ["first_token", "(rests)", "1st", "2"] and "L1H1" in line
    assert "first_token: 1 of 2 heads only rest" in " ".join(_summary(df).split())
    grid = {ln.split()[0]: ln.split()[1:] for ln in _summary(df).splitlines() if re.match(r"\s*L\d+\s", ln)}
    assert grid["L1"][:2] == ["IND", "1st"]


def test_a_head_that_rests_and_does_induction_shows_induction_with_its_rest(resting_table):
    df = resting_table
    assert head_labels(df)[(1, 0)] == ["induction", "first_token"]  # resting last
    ind, first = _row(df, 1, 0, "induction"), _row(df, 1, 0, "first_token")
    assert 0.45 < ind.score < 0.55  # half its attention on the copy, half on the first token
    assert ind.rest > 0.6 and first.rest == pytest.approx(first.score)  # rest on the repeats; on random tokens
    assert _row(df, 0, 0, "previous_token").rest < 0.1  # a head that never rests says so
    assert strongest_rows(df).set_index(["layer", "head"]).loc[(1, 0), "detector"] == "induction"
    line = next(ln for ln in _summary(df).splitlines() if ln.lstrip().startswith("induction"))
    assert "L1H0" in line and line.split()[-1] == f"{ind.rest:.2f}"


def test_every_view_draws_the_same_strongest_label(resting_table):
    from headlens.app import helpers as hd
    from headlens.viz.grid import head_grid_figure

    fig = head_grid_figure(resting_table, "induction", 2, 4, color_by="label")
    squares = {(int(x), int(y)): str(t) for x, y, t in zip(fig.data[0].x, fig.data[0].y, fig.data[0].text, strict=True)}
    assert squares[(0, 1)] == "IND" and squares[(1, 1)] == "1st" and squares[(0, 0)] == "PT"  # x = head, y = layer
    table = hd.heads_table(resting_table).set_index("head")
    assert table.loc["L1H0", "labels"] == "induction, first_token" and table.loc["L1H1", "labels"] == "first_token"
    assert hd.default_detector(resting_table) == "induction"


def test_resting_comes_last_even_with_the_larger_lift():
    rows = pd.DataFrame({
        "layer": [0, 0, 0, 1], "head": [0, 0, 1, 0],
        "detector": ["first_token", "induction", "sink(s=8)", "ov_copying"],
        "score": [0.95, 0.45, 0.9, 0.97], "lift": [20.0, 9.0, 30.0, float("nan")], "label": True,
    })
    assert label_order(rows)["detector"].tolist() == ["induction", "ov_copying", "sink(s=8)", "first_token"]
    assert head_labels(rows) == {(0, 0): ["induction", "first_token"], (0, 1): ["sink(s=8)"], (1, 0): ["ov_copying"]}
    only_resting = labelled_heads(rows.assign(label=[True, False, True, False]))
    assert only_resting["detector"].tolist() == ["sink(s=8)", "first_token"]  # among resting labels: by lift


def test_rest_is_part_of_the_schema(resting_table, tmp_path):
    for suffix in (".csv", ".parquet", ".json"):
        back = read_table(write_table(resting_table, tmp_path / f"s{suffix}"))
        np.testing.assert_allclose(back.rest.to_numpy(), resting_table.rest.to_numpy(), equal_nan=True)
    from headlens.detectors import DETECTORS

    by_weights = resting_table.detector.map(lambda d: DETECTORS[d].kind == "weights")
    assert by_weights.any() and resting_table[by_weights].rest.isna().all()  # no probe: nothing to rest on
    assert resting_table[~by_weights].rest.notna().all()
    with pytest.raises(HeadlensError, match="rest"):
        validate(resting_table.assign(rest=1.5))
    old = tmp_path / "old.csv"  # a table written before the column existed
    resting_table.drop(columns="rest").to_csv(old, index=False)
    assert read_table(old).rest.isna().all()


def test_annotated_rows_rest_too():
    """User annotations without distractors (which also crashed before: no distractor pairs to reshape)."""
    text = "abcab"  # BOS a b c a b: the query 'b' (position 5) -> the earlier 'b' (position 2)
    prompts = [{"text": text, "detector": "two_back", "targets": [{"query": [4, 5], "keys": [[1, 2]]}]}] * 12
    df = headlens.classify(resting_model(), prompts=prompts, detectors="two_back", n_boot=100)
    assert _row(df, 1, 1, "two_back").rest == pytest.approx(1.0, abs=1e-6)
    assert _row(df, 0, 0, "two_back").rest < 1e-6  # the previous-token head never looks at position 0 from there


def test_rest_equals_transformers_first_token_mass_on_a_gqa_llama(tmp_path):
    """``rest`` against an independent computation: plain transformers, eager attention, output_attentions."""
    from gqa_models import save_llama

    path = save_llama(tmp_path / "llama", seed=3, initializer_range=0.2)
    model = headlens.load(f"hf:{path}")
    texts = ["def f(x): return x + 1", "import os, sys", "class A(B): pass", "while True: break"]
    df = headlens.classify(model, prompts=texts, detectors="previous_token", n_boot=50)
    from transformers import LlamaForCausalLM

    hf = LlamaForCausalLM.from_pretrained(path, attn_implementation="eager").eval()
    num = torch.zeros(2, 4, dtype=torch.float64)
    rows = 0
    with torch.no_grad():
        for text in texts:
            ids = torch.tensor([[256, *text.encode()]])  # BOS 256, then the bytes
            att = hf(ids, output_attentions=True).attentions  # per layer (1, H, T, T)
            num += torch.stack([a[0, :, 1:, 0].double().sum(-1) for a in att])  # rows q >= 1 on key 0
            rows += ids.shape[1] - 1
    rest = df.sort_values(["layer", "head"]).rest.to_numpy().reshape(2, 4)
    np.testing.assert_allclose(rest, (num / rows).numpy(), atol=1e-5)
    assert rest.max() - rest.min() > 0.03  # random heads rest differently: the comparison can fail
