"""Figure builders: the data in each figure is the data given, laid out as the dashboard needs."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from headlens import viz


def toy_scores(n_layers: int = 2, n_heads: int = 3) -> pd.DataFrame:
    """A scores table with known values: score = (layer * n_heads + head) / 10 for 'induction'."""
    rows = []
    for layer in range(n_layers):
        for head in range(n_heads):
            for det, offset in (("induction", 0.0), ("previous_token", 0.05)):
                score = (layer * n_heads + head) / 10 + offset
                rows.append(dict(model="toy", layer=layer, head=head, detector=det, score=score,
                                 ci_low=score - 0.02, ci_high=score + 0.02, baseline=0.05, lift=score / 0.05,
                                 n_positions=100, n_prompts=10, label=False))
    df = pd.DataFrame(rows)
    df.loc[(df.layer == 1) & (df["head"] == 2) & (df.detector == "induction"), "label"] = True
    df.loc[(df.layer == 1) & (df["head"] == 2) & (df.detector == "previous_token"), "label"] = True
    return df


def test_head_grid_is_a_scatter_of_squares_with_layer_head_customdata():
    scores = toy_scores()
    fig = viz.head_grid_figure(scores, "induction", n_layers=2, n_heads=3, selected=[(0, 1)])
    (trace,) = fig.data
    assert trace.type == "scatter"
    assert trace.marker.symbol == "square"
    custom = [tuple(c[:2]) for c in trace.customdata]
    assert custom == [(layer, head) for layer in range(2) for head in range(3)]
    assert list(trace.x) == [h for _ in range(2) for h in range(3)]
    assert list(trace.y) == [layer for layer in range(2) for _ in range(3)]
    # colour = the detector's score, per head
    expected = [(layer * 3 + head) / 10 for layer in range(2) for head in range(3)]
    np.testing.assert_allclose(trace.marker.color, expected)
    assert trace.marker.cmin == 0 and trace.marker.cmax == 1
    # the selected head gets the selection border, the labelled one a mark naming both labels
    assert trace.marker.line.color[1] == viz.SELECTED_COLOR
    assert trace.marker.line.color[0] != viz.SELECTED_COLOR
    assert set(trace.text[5].split()) == {"IND", "PT"}
    assert trace.text[0] == ""
    # hover: score, CI, baseline and lift of that head
    assert "L1H2" in trace.customdata[5][2]
    assert trace.customdata[5][3:6] == ["0.500", "0.480", "0.520"]
    for word in ("baseline", "lift", "labels"):
        assert word in trace.hovertemplate
    json.loads(fig.to_json())  # serialisable for Streamlit


def test_head_grid_colours_by_lift_and_fades_missing_heads():
    scores = toy_scores()
    scores = scores[~((scores.layer == 0) & (scores["head"] == 0))]
    fig = viz.head_grid_figure(scores, "induction", n_layers=2, n_heads=3, color_by="lift")
    trace = fig.data[0]
    assert trace.marker.color[1] == pytest.approx(0.1 / 0.05)
    assert trace.marker.cmax == pytest.approx(max(trace.marker.color))
    assert trace.marker.opacity[0] < 1 and trace.marker.opacity[1] == 1
    assert trace.customdata[0][3] == "-"
    with pytest.raises(ValueError, match="color_by"):
        viz.head_grid_figure(scores, "induction", 2, 3, color_by="rank")


def test_head_grid_of_an_empty_table_still_has_every_head():
    fig = viz.head_grid_figure(pd.DataFrame(), "induction", n_layers=3, n_heads=4)
    assert len(fig.data[0].customdata) == 12
    assert all(o < 1 for o in fig.data[0].marker.opacity)


def test_pattern_heatmap_labels_positions_and_hover():
    tokens = ["<bos>", "a", "b", "a", "b"]
    pattern = np.tril(np.ones((5, 5)))
    pattern /= pattern.sum(1, keepdims=True)
    fig = viz.pattern_figure(pattern, tokens, title="L1H0")
    (trace,) = fig.data
    assert trace.type == "heatmap"
    z = np.array(trace.z, dtype=float)
    np.testing.assert_allclose(np.tril(z), np.tril(pattern), rtol=1e-6)
    assert np.isnan(z[0, 1]) and np.isnan(z[3, 4])  # causal: keys after the query are blank
    # repeated tokens keep their own positions; labels are HTML-safe
    assert list(fig.layout.xaxis.ticktext) == ["&lt;bos&gt;", "a", "b", "a", "b"]
    assert list(trace.x) == ["#0 &lt;bos&gt;", "#1 a", "#2 b", "#3 a", "#4 b"]
    assert list(fig.layout.xaxis.tickvals) == list(trace.x) == list(trace.y)
    assert list(fig.layout.yaxis.ticktext) == list(fig.layout.xaxis.ticktext)
    assert (trace.y[3], trace.x[2]) == ("#3 a", "#2 b")  # the hover of cell (3, 2) names both tokens
    for word in ("query", "key", "weight"):
        assert word in trace.hovertemplate
    full = viz.pattern_figure(pattern, tokens, causal=False)
    np.testing.assert_allclose(np.array(full.data[0].z, dtype=float), pattern, rtol=1e-6)
    with pytest.raises(ValueError, match="token labels"):
        viz.pattern_figure(pattern, tokens[:3])


def test_display_token_shows_whitespace_and_escapes_html():
    assert viz.display_token(" ") == "␣"
    assert viz.display_token("a\nb") == "a⏎b"
    assert viz.display_token("<b>") == "&lt;b&gt;"
    assert viz.display_token("") == "∅"


def test_head_profile_has_one_bar_group_per_head_with_cis():
    scores = toy_scores()
    fig = viz.head_profile_figure(scores, [(1, 2), (0, 0)])
    assert [t.name for t in fig.data] == ["L1H2", "L0H0"]
    bar = fig.data[0]
    assert list(bar.x) == ["induction", "previous_token"]
    np.testing.assert_allclose(bar.y, [0.5, 0.55])
    np.testing.assert_allclose(bar.error_y.array, [0.02, 0.02])


def test_ablation_bars_carry_the_confidence_intervals():
    effects = pd.DataFrame([
        {"heads": "L1H0", "metric": "repeated_loss", "delta": 2.0, "ci_low": 1.5, "ci_high": 2.6},
        {"heads": "random heads (control)", "metric": "repeated_loss", "delta": 0.1, "ci_low": 0.0, "ci_high": 0.3},
    ])
    fig = viz.ablation_figure(effects)
    (bar,) = fig.data
    assert list(bar.x) == ["L1H0", "random heads (control)"]
    np.testing.assert_allclose(bar.y, [2.0, 0.1])
    np.testing.assert_allclose(bar.error_y.array, [0.6, 0.2])
    np.testing.assert_allclose(bar.error_y.arrayminus, [0.5, 0.1])


def test_token_loss_bars_are_signed_and_labelled():
    fig = viz.token_loss_figure(["a", " ", "<"], [0.5, -0.25, 0.0])
    bar = fig.data[0]
    np.testing.assert_allclose(bar.y, [0.5, -0.25, 0.0])
    assert list(bar.customdata) == ["a", "␣", "&lt;"]
    assert bar.marker.cmin == -0.5 and bar.marker.cmax == 0.5


def test_training_figure_has_the_loss_and_one_line_per_head():
    losses = pd.DataFrame({"step": [10, 20, 30], "loss": [3.0, 2.0, 1.0]})
    frames = []
    for step in (10, 20, 30):
        s = toy_scores()
        s["step"] = step
        s["score"] = s["score"] * step / 30
        frames.append(s)
    fig = viz.training_figure(losses, pd.concat(frames), "induction", highlight=[(1, 2)])
    names = [t.name for t in fig.data]
    assert names[0] == "loss" and len(names) == 1 + 6
    l1h2 = fig.data[names.index("L1H2")]
    np.testing.assert_allclose(l1h2.y, [0.5 / 3, 1.0 / 3, 0.5])
    assert l1h2.line.width > fig.data[names.index("L0H0")].line.width


def test_figure_html_is_standalone():
    page = viz.figure_html(viz.token_loss_figure(["a"], [0.1]))
    assert "<html>" in page[:100].lower() and page.rstrip().endswith("</html>")
    assert 'src="http' not in page  # plotly.js is inlined, nothing is fetched
    assert len(page) > 1_000_000


def test_placeholder_figure_draws_no_data_and_says_why():
    fig = viz.placeholder_figure("loading code and scoring every head...")
    assert len(fig.data) == 0
    assert [a.text for a in fig.layout.annotations] == ["loading code and scoring every head..."]
