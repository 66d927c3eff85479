"""``headlens.write_scores`` / ``headlens.read_scores``: a scores table read back as it was, provenance included."""

from __future__ import annotations

import json

import pandas as pd
import pytest

import headlens
from tests.conftest import make_gpt


@pytest.mark.parametrize("suffix", [".json", ".csv"])
def test_scores_round_trip_with_provenance(tmp_path, suffix):
    table = headlens.classify(make_gpt(n_layers=2), detectors=["previous_token", "induction"], n_prompts=10,
                              seq_len=16)
    path = headlens.write_scores(table, tmp_path / f"scores{suffix}")
    back = headlens.read_scores(path)
    pd.testing.assert_frame_equal(back, table, check_dtype=False, rtol=1e-13, atol=0)
    assert back.attrs == json.loads(json.dumps(table.attrs, default=str))
    assert back.attrs["headlens_version"] == headlens.__version__ and back.attrs["seed"] == table.attrs["seed"]
