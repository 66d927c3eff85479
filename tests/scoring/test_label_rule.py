"""One label rule on the strength scale (docs/scores.md, "Baselines, intervals and the label rule"): a pattern
type's label is the low end of the strength's CI, ``(ci_low - chance) / (1 - chance)``, against κ; the gated
types' attention half is the CI above chance; no lift floor and no absolute level on the mass."""

from __future__ import annotations

import pandas as pd
import pytest
import torch

import headlens
from headlens import viz
from headlens.scoring.primary import strength
from headlens.scoring.stats import Summary, above_null, strength_label, strength_of
from headlens.testing import planted_model


def _summary(ci_low: list[float], chance: float) -> Summary:
    lo = torch.tensor(ci_low, dtype=torch.float64)
    return Summary(lo, lo, lo, chance, 100, 20)


def test_the_same_mass_is_labelled_where_chance_is_small_and_not_where_it_is_large():
    # 0.45 at chance 0.02 is 44 % of the way to a perfect head; at chance 0.25 it is 27 %
    assert strength_label(_summary([0.45], 0.02)).tolist() == [True]
    assert strength_label(_summary([0.45], 0.25)).tolist() == [False]
    # the bar on the score is chance + κ (1 - chance): 0.55 at chance 0.25, by hand
    assert strength_label(_summary([0.5499, 0.5501], 0.25)).tolist() == [False, True]


def test_a_head_far_above_a_large_chance_is_labelled_though_its_lift_is_under_3():
    s = _summary([0.95], 0.43)  # SmolLM2's sink on 16-token prompts: the lift can be at most 1 / 0.43 = 2.3
    assert float(s.lift[0]) < 3 and strength_label(s).tolist() == [True]


def test_strength_is_nan_where_every_key_is_a_target():
    assert torch.isnan(strength_of(torch.tensor([1.0]), 1.0)).all()
    assert strength_label(_summary([1.0], 1.0)).tolist() == [False]


def test_gated_types_need_only_the_ci_above_chance():
    # at the negative name movers' chance (0.18 on SmolLM2) a lift floor of 3 was a mass of 0.53
    assert above_null(_summary([0.19, 0.18, 0.17], 0.18)).tolist() == [True, False, False]


def test_classify_labels_every_pattern_row_by_the_strength_rule():
    """An invariant of a real table: each pattern row's label is the rule on its own columns."""
    blurred = planted_model(sharpness=4.0)  # the induction head keeps some mass off its target
    df = headlens.classify(blurred, detectors="previous_token,induction,first_token", n_prompts=12, seq_len=32,
                           n_boot=100)
    rule = (df.ci_low - df.baseline) / (1 - df.baseline) >= 0.4
    assert (df.label == rule).all()
    assert df.label.any() and not df.label.all()
    assert "(ci_low - baseline) / (1 - baseline)" in df.attrs["label_rule"]
    for kappa in (0.2, 0.9):  # --threshold moves the bar on the strength scale
        at = headlens.classify(blurred, detectors="induction", n_prompts=12, seq_len=32, n_boot=100,
                               threshold=kappa)
        assert (at.label == ((at.ci_low - at.baseline) / (1 - at.baseline) >= kappa)).all()


def _table(score: float, chance: float) -> pd.DataFrame:
    return pd.DataFrame({"model": "m", "layer": [0, 0], "head": [0, 1], "kv_head": [0, 1], "detector": "induction",
                         "score": [score, chance], "ci_low": [score - 0.01, chance], "ci_high": [score + 0.01, chance],
                         "baseline": chance, "lift": [score / chance, 1.0], "n_positions": 100, "n_prompts": 10,
                         "label": [True, False], "rest": 0.1})


def test_the_grid_colours_and_hovers_with_the_strength():
    table = _table(0.7, 0.25)
    fig = viz.head_grid_figure(table, "induction", 1, 2, color_by="strength")
    trace = fig.data[0]
    assert list(trace.marker.color) == pytest.approx([0.6, 0.0])  # (0.7 - 0.25) / 0.75, and a head at chance
    assert trace.marker.cmin == 0 and trace.marker.cmax == 1
    assert trace.customdata[0][9] == "0.60" and "strength" in trace.hovertemplate
    assert list(strength(table)) == pytest.approx([0.6, 0.0])


def test_the_ranking_figure_draws_the_bar_where_the_strength_is_kappa():
    fig = viz.ranking_figure(_table(0.7, 0.25), "induction", threshold=0.4)
    bars = [s.x0 for s in fig.layout.shapes if s.line.dash == "dash"]
    assert bars == pytest.approx([0.25 + 0.4 * 0.75])
