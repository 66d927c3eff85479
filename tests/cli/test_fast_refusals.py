"""A mistyped name is refused before torch loads, with the closest valid names.

Speed is asserted as what makes it fast, never as a time: in a fresh interpreter the refusal happens with
``torch`` and ``transformers`` absent from ``sys.modules`` (importing them is what took 3-12 s). One
subprocess runs every case, so the whole file costs one interpreter start.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from headlens.errors import did_you_mean

# argv, exit code, what the one line must say
CASES = [
    (["classify", "--detectors", "inducton"], 6, "did you mean 'induction'"),
    (["classify", "-d", "previous_token,streaming(s=1,w=8),inducton"], 6, "did you mean 'induction'"),
    (["classify", "--model", "induction2l"], 4, "did you mean 'induction-2l'"),
    (["classify", "--scan-path", "dens"], 2, "did you mean 'dense'"),
    (["classify", "--no-such-option"], 2, "No such option"),
    (["ablate", "--heads", "L0H0", "--method", "meen"], 2, "did you mean 'mean'"),
    (["ablate", "--heads", "L0H0", "--metric", "lm_loss,repeated_los"], 2, "did you mean 'repeated_loss'"),
    (["ablate", "--heads", "L0H0", "--control", "layers"], 2, "did you mean 'layer'"),
    (["circuit", "--method", "corupted"], 2, "did you mean 'corrupted'"),
    (["circuit", "--metric", "receiver:inducton"], 2, "did you mean 'induction'"),
    (["attribute", "--model", "smolm2", "--prompt", "x"], 4, "did you mean 'smollm2'"),
    (["trajectory", "--models", "x.safetensors", "-d", "prevous_token"], 6, "did you mean 'previous_token'"),
]

RUNNER = """
import contextlib, io, json, sys
from headlens.cli import main
out = []
for argv, _, _ in json.loads(sys.argv[1]):
    sys.argv = ["headlens", *argv]
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            main()
            code = 0
        except SystemExit as e:
            code = e.code
    out.append([code, err.getvalue(), sorted(m for m in ("torch", "transformers") if m in sys.modules)])
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def refusals():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([sys.executable, "-c", RUNNER, json.dumps(CASES)], capture_output=True, text=True,
                          env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.splitlines()[-1])


@pytest.mark.parametrize("i", range(len(CASES)), ids=[" ".join(c[0]) for c in CASES])
def test_refused_in_one_line_before_torch_loads(refusals, i):
    argv, code, says = CASES[i]
    got_code, stderr, heavy = refusals[i]
    assert got_code == code, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("headlens: error: ") and says in lines[0], stderr
    assert heavy == [], f"{' '.join(argv)} imported {heavy} before refusing"


def test_the_registries_hold_exactly_the_torch_free_names():
    from headlens.circuits.senders import METHODS as EDGE_METHODS
    from headlens.detectors import BUILTIN, DETECTORS
    from headlens.interventions.ablation import METHODS
    from headlens.interventions.metrics import METRICS
    from headlens.zoo import names

    assert tuple(n for n in DETECTORS if n in BUILTIN) == names.DETECTORS
    assert tuple(METRICS) == names.METRICS and METHODS == names.METHODS and EDGE_METHODS == names.EDGE_METHODS


def test_the_library_suggests_too():
    from headlens.detectors import get_detector
    from headlens.errors import DetectorError, ModelReferenceError
    from headlens.models.loading import load

    with pytest.raises(DetectorError, match="did you mean 'ov_suppression'"):
        get_detector("ov_supression")
    with pytest.raises(ModelReferenceError, match="did you mean 'llama-induction'"):
        load("llama_induction")
    assert did_you_mean("Induction-2L", ["induction-2l", "dyck"]) == "; did you mean 'induction-2l'?"
    assert did_you_mean("qqqq", ["induction"]) == ""
