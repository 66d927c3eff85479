"""``headlens circuit`` under torchrun: two ranks share the edges out and rank 0's table equals one process's."""

from __future__ import annotations

import textwrap

import numpy as np
import pandas as pd

import headlens
from tests.scoring.test_distributed import _torchrun

JOB = """
import sys
from headlens.cli import app
app(["circuit", "--model", "induction-2l", "--receivers", "L1H1,L1H2", "--inputs", "qk", "--n-prompts", "6",
     "--n-control", "2", "--out", sys.argv[1]], standalone_mode=False)
"""


def test_two_ranks_equal_one_process(tmp_path):
    (tmp_path / "job.py").write_text(textwrap.dedent(JOB))
    res = _torchrun(tmp_path / "job.py", str(tmp_path / "edges.csv"), timeout=240)
    assert res.returncode == 0, res.stderr[-3000:]
    dist = pd.read_csv(tmp_path / "edges.csv")
    one = headlens.circuit("induction-2l", receivers="L1H1,L1H2", inputs="qk", n_prompts=6, n_control=2)
    assert list(dist.sender) == list(one.sender) and list(dist.input) == list(one.input)
    for col in ("effect", "ci_low", "ci_high", "control", "composition_z"):
        assert np.allclose(dist[col], one[col], atol=1e-6, equal_nan=True), col
