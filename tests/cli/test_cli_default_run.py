"""The README's main job: ``headlens classify`` with no arguments, run as a user runs it (a subprocess of
the installed entry point's module, this checkout on PYTHONPATH), labels the default model's known heads.

The expected heads come from the zoo's entry for the default model (``headlens/zoo``: what its card and
``headlens models`` advertise), not from the command's own code.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from headlens.zoo import DEFAULT_MODEL, ZOO

ROOT = Path(__file__).resolve().parents[2]


def test_classify_with_no_arguments_labels_the_default_models_known_heads(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "COLUMNS": "200", "NO_COLOR": "1"}
    res = subprocess.run([sys.executable, "-m", "headlens", "classify"], capture_output=True, text=True,
                         env=env, cwd=tmp_path, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "Traceback" not in res.stderr and DEFAULT_MODEL in res.stdout
    known = ZOO[DEFAULT_MODEL].known_heads
    assert known, "the default model names no heads"
    lines = res.stdout.splitlines()
    for detector, heads in known.items():
        rows = [ln for ln in lines if re.search(rf"\b{detector}\b", ln)]
        labelled = {h for ln in rows for h in re.findall(r"\bL\d+H\d+\b", ln)}
        assert labelled == set(heads), (detector, labelled, heads, res.stdout)  # these heads, and no others
    assert list(tmp_path.iterdir()) == []  # a plain run writes nothing into the working folder
