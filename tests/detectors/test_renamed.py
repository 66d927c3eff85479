"""The weight-only types' old names (``copying``, ``copy_suppression``) still load for one release: as detector
names (library and CLI) and in saved score tables, each with one DeprecationWarning, mapped to the new names."""

from __future__ import annotations

import warnings

import pytest

import headlens
from headlens.detectors import get_detector
from headlens.testing import planted_model


def test_old_detector_names_map_with_one_warning():
    for old, new in (("copying", "ov_copying"), ("copy_suppression", "ov_suppression")):
        with pytest.warns(DeprecationWarning, match=f"'{old}' is now '{new}'") as caught:
            assert get_detector(old).name == new
        assert len([w for w in caught if w.category is DeprecationWarning]) == 1
    with pytest.warns(DeprecationWarning):
        df = headlens.classify(planted_model(), detectors="copying", threshold={"copying": 0.5})
    assert set(df.detector) == {"ov_copying"} and df.attrs["thresholds"] == {"ov_copying": 0.5}


def test_a_saved_table_with_the_old_names_reads_under_the_new_ones(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        df = headlens.classify(planted_model(), detectors="ov_copying,ov_suppression,previous_token")
    old = df.assign(detector=df.detector.replace({"ov_copying": "copying", "ov_suppression": "copy_suppression"}))
    old.attrs = {**df.attrs, "thresholds": {"copying": 0.05, "copy_suppression": 0.05, "previous_token": 0.4}}
    path = headlens.write_scores(old, tmp_path / "old.json")
    with pytest.warns(DeprecationWarning, match="predates the renamed"):
        back = headlens.read_scores(path)
    assert back.detector.tolist() == df.detector.tolist()
    assert back.attrs["thresholds"] == {"ov_copying": 0.05, "ov_suppression": 0.05, "previous_token": 0.4}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a table with the new names reads silently
        headlens.read_scores(headlens.write_scores(df, tmp_path / "new.json"))


def test_the_cli_takes_an_old_name(capsys):
    from headlens.cli.precheck import check_detectors

    check_detectors("previous_token,copying")  # not refused as unknown before torch loads
