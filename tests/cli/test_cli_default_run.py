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

from headlens.scoring.primary import is_resting
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
    assert len(lines) <= 60, res.stdout  # a summary that fits a screen
    types = _summary_rows(lines)
    for detector, heads in known.items():
        if is_resting(detector):  # resting is shown beside what a head does, not as what it does
            assert set(heads) <= {h for hs in types.values() for h in hs}, (detector, heads, res.stdout)
            continue
        assert set(types[detector]) == set(heads), (detector, types, heads, res.stdout)  # these heads, no others
    assert list(tmp_path.iterdir()) == []  # a plain run writes nothing into the working folder


def _summary_rows(lines: list[str]) -> dict[str, list[str]]:
    """The summary's heads per type: a row naming a type, then rows that continue it (the head only)."""
    out: dict[str, list[str]] = {}
    current = None
    for ln in lines:
        if re.match(r"\s*L\d+\s", ln):  # the grid
            break
        m = re.match(r"\s*([a-z_]+)\b.*?\b(L\d+H\d+)\b", ln)
        if m:
            current = m.group(1)
            out.setdefault(current, []).append(m.group(2))
        elif current and (h := re.match(r"\s+(L\d+H\d+)\b", ln)):
            out[current].append(h.group(1))
    return out
