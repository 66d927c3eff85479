"""The dashboard's first paint does not wait for torch: a zoo model's grid is drawn from its shipped scores,
the views under it say they are loading and fill in once the model is cached.

The torch-free check runs the page in a fresh interpreter whose import system refuses torch: the grid (with
its labels, from ``headlens/zoo/weights/code.scores.json``) must be on the page all the same, and the model's
load is the one thing that fails. Timings are the browser test's business (``tests/app/test_browser.py``,
reported, not asserted).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from headlens.zoo import DEFAULT_MODEL, ZOO

ROOT = Path(__file__).resolve().parents[2]
ENTRY = ROOT / "apps" / "dashboard.py"

pytestmark = pytest.mark.skipif(not (ZOO[DEFAULT_MODEL].available and (ZOO[DEFAULT_MODEL].path.parent /
                                                                         f"{DEFAULT_MODEL}.scores.json").is_file()),
                                reason="the default zoo model or its shipped scores are not installed")

NO_TORCH = r'''
import importlib.abc, json, os, sys

class NoTorch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ImportError("torch is blocked: the first paint must not need it")
        return None

sys.meta_path.insert(0, NoTorch())
from streamlit.testing.v1 import AppTest

os.environ["HEADLENS_DASHBOARD_MODEL"] = sys.argv[2]
import threading

at = AppTest.from_file(sys.argv[1], default_timeout=120)
at.run()  # the first paint
charts = [json.loads(el.proto.spec) for el in at.get("plotly_chart")]
grid = [c for c in charts if c["data"] and c["data"][0].get("marker", {}).get("symbol") == "square"]
first = {
    "exceptions": [str(e.value) for e in at.exception],
    "grid_points": len(grid[0]["data"][0]["x"]) if grid else 0,
    "grid_title": grid[0]["layout"]["title"]["text"] if grid else "",
    "info": [i.value for i in at.info], "text_areas": len(at.text_area), "torch_imported": "torch" in sys.modules,
}
at.run()  # the next run (in the browser: the polling fragment's) starts loading the model on a thread
for t in threading.enumerate():
    if t.name == "headlens-model-load":
        t.join(60)
at.run()  # and the one after says why it did not load
print(json.dumps({**first, "errors": [e.value for e in at.error]}))
'''


def test_grid_is_drawn_from_shipped_scores_without_torch(tmp_path):
    script = tmp_path / "no_torch.py"
    script.write_text(NO_TORCH)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, str(script), str(ENTRY), DEFAULT_MODEL], capture_output=True, text=True,
                          cwd=ROOT, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    page = json.loads(proc.stdout.strip().splitlines()[-1])
    assert not page["exceptions"] and not page["torch_imported"], page
    layers, heads = (json.loads(Path(ZOO[DEFAULT_MODEL].path.parent / f"{DEFAULT_MODEL}.scores.json").read_text())
                     ["attrs"][k] for k in ("n_layers", "n_heads"))
    assert page["grid_points"] == layers * heads and "labels" in page["grid_title"], page
    assert any("appear when it is ready" in m for m in page["info"]), page  # the views say they are loading
    assert page["text_areas"] == 0  # the text box needs the tokenizer: not before the model
    assert any("Could not load model" in m and "torch" in m for m in page["errors"]), page


def test_views_fill_in_once_the_model_is_cached(monkeypatch):
    from streamlit.testing.v1 import AppTest

    from headlens.app import helpers as hd

    monkeypatch.setenv(hd.MODEL_ENV, DEFAULT_MODEL)
    at = AppTest.from_file(str(ENTRY), default_timeout=300)
    at.run()  # first paint
    assert not at.exception, [e.value for e in at.exception]
    at.run()  # in the browser the polling fragment's first tick: the model starts loading on a thread
    for t in threading.enumerate():
        if t.name == "headlens-model-load":
            t.join(120)
    at.run()  # in the browser the polling fragment triggers this rerun
    assert not at.exception, [e.value for e in at.exception]
    assert len(at.text_area) == 1 and not [i for i in at.info if "appear when it is ready" in i.value]
    assert any(f"**{DEFAULT_MODEL}**" in c.value and "d_model" in c.value for c in at.caption)
