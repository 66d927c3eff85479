"""The grid a page opens on is kept on disk (headlens.app.grid_store) and sent at the next start as it was: the
same figure, without pandas; never once the table it was drawn from, the model or the drawing code changed."""

from __future__ import annotations

import json
import os

from conftest import make_gpt
from test_score_store import PLACED, stored  # noqa: F401  (the fixture: a tiny checkpoint's stored scan)

from headlens import save_checkpoint, viz
from headlens.app import grid_store, score_store
from headlens.app import helpers as hd

RECORD = {"name": "tiny", "n_layers": 2, "n_heads": 4, "options": ["induction"], "choice": "induction",
          "color_by": "score", "heads": ["L1H0"], "download": "tiny-grid-induction", "figure": {"data": []}}


def test_a_kept_grid_reads_back_only_for_the_table_it_was_drawn_from(stored, monkeypatch):  # noqa: F811
    ref, table = stored
    assert grid_store.write(ref, RECORD, 8, 0, None, PLACED) is not None
    assert {k: v for k, v in grid_store.read(ref, 8, 0, None, PLACED).items() if k != "key"} == RECORD
    assert grid_store.read(ref, 16, 0, None, PLACED) is None  # no table for other scan settings: no grid
    assert grid_store.write(ref, RECORD, 16, 0, None, PLACED) is None
    assert grid_store.read(ref, 8, 0, None, ("bfloat16", "cpu")) is None
    with monkeypatch.context() as m:
        m.setattr(grid_store, "code_digest", lambda: "edited")  # the grid's drawing code changed
        assert grid_store.read(ref, 8, 0, None, PLACED) is None
    path = score_store.path_for(ref, score_store.key(ref, 8, 0, None, PLACED))
    stat = path.stat()
    score_store.write(ref, table, 8, 0, None, PLACED)  # scanned again: another file, however alike
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    assert grid_store.read(ref, 8, 0, None, PLACED) is None
    assert grid_store.write(ref, RECORD, 8, 0, None, PLACED) is not None
    save_checkpoint(make_gpt(seed=1, n_ctx=48), ref)  # the weights changed
    assert grid_store.read(ref, 8, 0, None, PLACED) is None


def test_the_next_start_sends_the_kept_grid_without_pandas(stored, tmp_path):  # noqa: F811
    """The first start after the scan draws the grid from the table (pandas) and keeps it; the next one sends
    the same figure, the same caption and the same selection before pandas (or torch) is imported."""
    from test_first_paint import _page

    ref, table = stored
    score_store.write(ref, table, hd.DEFAULT_N_PROMPTS, 0, None, PLACED)  # the dashboard's default scan
    cache = str(score_store.path_for(ref, score_store.key(ref, 8, 0, None, PLACED)).parents[1])
    drawn = _page("block", tmp_path, ref, HEADLENS_CACHE=cache)["first"]
    assert drawn["pandas_imported"] and drawn["grid_points"] == 2 * 4, drawn
    assert grid_store.read(ref, hd.DEFAULT_N_PROMPTS, 0, None, PLACED) is not None  # kept
    sent = _page("block", tmp_path, ref, HEADLENS_CACHE=cache)["first"]
    assert not sent["exceptions"] and not sent["pandas_imported"] and not sent["torch_imported"], sent
    assert json.dumps(sent["grid_spec"], sort_keys=True) == json.dumps(drawn["grid_spec"], sort_keys=True)
    assert sent["captions"] == drawn["captions"] and sent["info"] == drawn["info"]
    kept = grid_store.read(ref, hd.DEFAULT_N_PROMPTS, 0, None, PLACED)["figure"]  # its download button's page
    assert "<html>" in viz.figure_html(kept) and '"customdata"' in viz.figure_html(kept)
