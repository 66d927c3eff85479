"""In a notebook without ipywidgets, loading a model prints no ``TqdmWarning: IProgress not found``: headlens
imports ``tqdm.auto`` first with its text bar chosen quietly (run in a fresh interpreter: the warning comes
once per process, at tqdm's first import)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

SCRIPT = """
import sys, types, warnings
import headlens
ipy = types.ModuleType("IPython")  # a Jupyter kernel as tqdm sees one, without ipywidgets
ipy.get_ipython = lambda: type("ZMQInteractiveShell", (), {})()
sys.modules.update({"IPython": ipy, "ipykernel": types.ModuleType("ipykernel"),
                    "ipykernel.zmqshell": types.ModuleType("ipykernel.zmqshell")})
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    headlens.load("induction-2l")
    import tqdm.auto
print([str(w.message) for w in caught if "IProgress" in str(w.message)], tqdm.auto.tqdm.__module__)
"""


@pytest.mark.skipif(importlib.util.find_spec("ipywidgets") is not None, reason="with ipywidgets the bar is a widget")
def test_no_iprogress_warning_and_a_text_bar():
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=300, check=True)
    warned, module = out.stdout.strip().rsplit(" ", 1)
    assert warned == "[]" and not module.startswith("tqdm.notebook"), out.stdout + out.stderr
