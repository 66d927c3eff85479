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
from pathlib import Path

import pytest

from headlens.zoo import DEFAULT_MODEL, ZOO

ROOT = Path(__file__).resolve().parents[2]
ENTRY = ROOT / "apps" / "dashboard.py"

pytestmark = pytest.mark.skipif(not (ZOO[DEFAULT_MODEL].available and (ZOO[DEFAULT_MODEL].path.parent /
                                                                         f"{DEFAULT_MODEL}.scores.json").is_file()),
                                reason="the default zoo model or its shipped scores are not installed")

FIRST_PAINT = r'''
import importlib.abc, json, os, sys, threading

class NoTorch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ImportError("torch is blocked: the first paint must not need it")
        return None

if sys.argv[3] == "block":
    sys.meta_path.insert(0, NoTorch())
from streamlit.testing.v1 import AppTest

os.environ["HEADLENS_DASHBOARD_MODEL"] = sys.argv[2]


def page(at):
    charts = [json.loads(el.proto.spec) for el in at.get("plotly_chart")]
    grid = [c for c in charts if c["data"] and c["data"][0].get("marker", {}).get("symbol") == "square"]
    return {"exceptions": [str(e.value) for e in at.exception],
            "grid_points": len(grid[0]["data"][0]["x"]) if grid else 0,
            "grid_title": grid[0]["layout"]["title"]["text"] if grid else "",
            "info": [i.value for i in at.info], "errors": [e.value for e in at.error],
            "text_areas": len(at.text_area), "captions": [c.value for c in at.caption],
            "torch_imported": "torch" in sys.modules, "pandas_imported": "pandas" in sys.modules,
            "grid_spec": grid[0] if grid else None}


at = AppTest.from_file(sys.argv[1], default_timeout=120)
at.run()  # the first paint
first = page(at)
at.run()  # in the browser the polling fragment's first tick: the model starts loading on a thread
for t in threading.enumerate():
    if t.name == "headlens-model-load":
        t.join(120)
at.run()  # the fragment's next tick finds it cached (or failed) and reruns the page
print(json.dumps({"first": first, "last": page(at)}))
'''


def _page(mode: str, tmp_path: Path, ref: str = DEFAULT_MODEL, **env_vars: str) -> dict:
    """The first paint and the page after the model's load, in a fresh interpreter (``mode``: block or allow torch)."""
    script = tmp_path / "first_paint.py"
    script.write_text(FIRST_PAINT)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", **env_vars}
    proc = subprocess.run([sys.executable, str(script), str(ENTRY), ref, mode], capture_output=True,
                          text=True, cwd=ROOT, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_grid_is_drawn_from_shipped_scores_without_torch(tmp_path):
    """torch cannot even be imported: the grid is drawn all the same, and the model's load is what fails."""
    out = _page("block", tmp_path)
    page = out["first"]
    assert not page["exceptions"] and not page["torch_imported"], page
    layers, heads = (json.loads(Path(ZOO[DEFAULT_MODEL].path.parent / f"{DEFAULT_MODEL}.scores.json").read_text())
                     ["attrs"][k] for k in ("n_layers", "n_heads"))
    assert page["grid_points"] == layers * heads and "labels" in page["grid_title"], page
    assert any("appear when it is ready" in m for m in page["info"]), page  # the views say they are loading
    assert page["text_areas"] == 0  # the text box needs the tokenizer: not before the model
    assert any("Could not load model" in m and "torch" in m for m in out["last"]["errors"]), out["last"]


def test_views_fill_in_once_the_model_is_cached(tmp_path):
    out = _page("allow", tmp_path)
    first, last = out["first"], out["last"]
    assert first["grid_points"] and not first["torch_imported"] and first["text_areas"] == 0, first
    assert not last["exceptions"] and last["torch_imported"] and last["text_areas"] == 1, last
    assert not [m for m in last["info"] if "appear when it is ready" in m], last
    assert any(f"**{DEFAULT_MODEL}**" in c and "d_model" in c for c in last["captions"]), last
