"""Scores the dashboard computed are kept on disk (headlens.app.score_store): read back whole, never when anything
they were computed from changed, computed once however many ask, and drawn at the next start before torch."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from conftest import make_gpt

from headlens import save_checkpoint
from headlens.app import cache, score_store
from headlens.app import helpers as hd

ROOT = Path(__file__).resolve().parents[2]
PLACED = ("float32", "cpu")


@pytest.fixture
def stored(tmp_path, monkeypatch) -> tuple[str, pd.DataFrame]:
    """A tiny checkpoint scored with the dashboard's scan into a cache of this test's own."""
    monkeypatch.setenv("HEADLENS_CACHE", str(tmp_path / "cache"))
    ref = str(save_checkpoint(make_gpt(n_ctx=48), tmp_path / "tiny.safetensors"))
    table = hd.compute_scores(make_gpt(n_ctx=48), n_prompts=8)
    assert score_store.write(ref, table, 8, 0, None, PLACED) is not None
    return ref, table


def test_a_stored_table_reads_back_whole(stored):
    ref, table = stored
    back = score_store.read(ref, 8, 0, None, PLACED)
    pd.testing.assert_frame_equal(back, table)
    assert back.attrs["n_layers"] == 2 and back.attrs["n_heads"] == 4
    assert score_store.path_for(ref, score_store.key(ref, 8, 0, None, PLACED)).parent.name == "dashboard-scores"


def test_a_table_is_not_read_when_what_it_was_computed_from_changed(stored, monkeypatch):
    ref, _ = stored
    assert score_store.read(ref, 16, 0, None, PLACED) is None  # other scan settings
    assert score_store.read(ref, 8, 1, None, PLACED) is None
    assert score_store.read(ref, 8, 0, "stdlib", PLACED) is None
    assert score_store.read(ref, 8, 0, None, ("bfloat16", "cpu")) is None  # other precision
    assert score_store.read(ref, 8, 0, None, PLACED, detectors=["no_such_detector"]) is None  # a plugin it lacks
    path = score_store.path_for(ref, score_store.key(ref, 8, 0, None, PLACED))
    with monkeypatch.context() as m:
        m.setattr(score_store, "code_digest", lambda: "edited")  # a detector's source changed
        assert score_store.read(ref, 8, 0, None, PLACED) is None
    save_checkpoint(make_gpt(seed=1, n_ctx=48), ref)  # the weights changed
    assert score_store.read(ref, 8, 0, None, PLACED) is None
    path.write_text("{not json")
    assert score_store.read(ref, 8, 0, None, PLACED) is None


def test_the_dashboard_scores_a_model_once_and_reads_it_back_at_the_next_start(tmp_path, monkeypatch):
    monkeypatch.setenv("HEADLENS_CACHE", str(tmp_path / "cache"))
    ref = str(save_checkpoint(make_gpt(n_ctx=48), tmp_path / "tiny.safetensors"))
    calls, heard = [], []
    real = hd.compute_scores
    monkeypatch.setattr(hd, "compute_scores", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    first = cache.get_scores(ref, 8, placement=PLACED, progress=lambda *p: heard.append(p))
    assert len(calls) == 1 and heard and heard[-1][0] == heard[-1][1]  # the bar reaches its end
    cache._stored.clear()  # a new process: only the disk remains
    again = cache.get_scores(ref, 8, placement=PLACED)
    assert len(calls) == 1
    pd.testing.assert_frame_equal(again, first)


def test_the_next_start_draws_a_stored_grid_without_torch(stored, tmp_path):
    """A checkpoint that is no zoo model: its stored table is drawn while torch cannot even be imported."""
    from test_first_paint import _page

    ref, table = stored
    key = score_store.key(ref, hd.DEFAULT_N_PROMPTS, 0, None, PLACED)
    score_store.path_for(ref, key).parent.mkdir(parents=True, exist_ok=True)
    score_store.write(ref, table, hd.DEFAULT_N_PROMPTS, 0, None, PLACED)  # the dashboard's default scan
    out = _page("block", tmp_path, ref, HEADLENS_CACHE=str(score_store.path_for(ref, key).parents[1]))
    page = out["first"]
    assert not page["exceptions"] and not page["torch_imported"], page
    assert page["grid_points"] == 2 * 4 and any("(stored scores)" in c for c in page["captions"]), page
    assert any("Could not load model" in m and "torch" in m for m in out["last"]["errors"]), out["last"]


def test_the_cli_warm_up_knows_a_stored_scan(stored, monkeypatch):
    from headlens.cli.dashboard import _stored

    ref, table = stored
    assert not _stored(ref, PLACED)  # only the 8-prompt scan is stored, not the default one
    score_store.write(ref, table, hd.DEFAULT_N_PROMPTS, 0, None, PLACED)
    assert _stored(ref, PLACED) and not _stored(ref, ("bfloat16", "cpu"))
    assert json.loads(score_store.path_for(ref, score_store.key(ref, hd.DEFAULT_N_PROMPTS, 0, None, PLACED))
                      .read_text())["key"]["model"] == hd.fingerprint(ref)
    assert sys.modules.get("subprocess") is subprocess  # (the module above runs the page in one)
