"""The Learn view and the readable patterns, driven headlessly through AppTest on the zoo's induction model.

Known answers: the split's figures hold the model's own queries; the planted bug is named by the
doctor; the head-count step marks the config's count and the doctor's verdict; the labelled heads'
"Show in grid" buttons select them in the grid.
"""

from __future__ import annotations

import pytest
from test_app import arr, figures, grid, start

from headlens import viz
from headlens.app import cache, history
from headlens.app import helpers as hd
from headlens.zoo import available

pytestmark = pytest.mark.skipif("induction-2l" not in available(), reason="zoo weights not installed")
REF = "induction-2l"


def learn(monkeypatch) -> object:
    at = start(monkeypatch, REF)
    at.segmented_control(key="view").set_value("Learn").run()
    assert not at.exception and not at.error
    return at


def titled(at, prefix: str) -> list[dict]:
    return [f for f in figures(at) if f["layout"].get("title", {}).get("text", "").startswith(prefix)]


def test_learn_split_step_draws_the_real_queries_per_head(monkeypatch):
    at = learn(monkeypatch)
    model = cache.get_model(REF)
    text = at.text_area(key=f"text::{REF}").value
    split = cache.get_split(REF, text, 0)
    (residual,) = titled(at, "①")
    assert arr(residual["data"][0]["z"]).shape == (len(split.tokens), model.cfg.d_model)
    assert [a["text"] for a in residual["layout"]["annotations"]] == ["H0", "H1", "H2", "H3"]
    (slices,) = titled(at, "②")
    assert len(slices["data"]) == model.n_heads
    assert arr(slices["data"][1]["z"]) == pytest.approx(split.q[:, 16:32], abs=1e-4)  # head 1 = columns 16..31
    (pats,) = titled(at, "③")
    assert len(pats["data"]) == model.n_heads
    n = len(split.tokens)
    assert pats["layout"]["xaxis"]["ticktext"] == [viz.display_token(t) for t in split.tokens][:n]
    at.selectbox(key="learn_layer").set_value(1).run()
    assert not at.exception and "layer 1" in titled(at, "③")[0]["layout"]["title"]["text"]


def test_learn_bugs_step_plants_each_bug_and_shows_the_doctors_verdict(monkeypatch):
    at = learn(monkeypatch)
    at.radio(key="learn_step").set_value("2 · Silent bugs").run()
    assert not at.exception
    losses = {m.label: m.value for m in at.metric}
    clean, bugged = (float(losses[k].split()[0]) for k in ("loss, clean model", "loss, with the bug"))
    assert bugged > clean + 0.5  # a trained model is much worse with its heads mixed up
    (verdict,) = at.error
    assert "missing_transpose_split" in verdict.value
    at.toggle(key="learn_bug::missing_transpose_merge").set_value(True).run()
    assert not at.exception
    assert [e.value.count("missing_transpose") for e in at.error] == [1, 1]
    assert "missing_transpose_merge" in at.error[1].value
    assert len([h for h in at.html if "headlens-loss-diff" in h.value]) == 2


def test_learn_head_count_step_marks_the_trained_count(monkeypatch):
    at = learn(monkeypatch)
    at.radio(key="learn_step").set_value("3 · How many heads?").run()
    assert not at.exception and not at.error
    (bars,) = titled(at, "loss on your text per n_heads")
    assert bars["data"][0]["x"] == ["1", "2", "4", "8", "16", "32", "64"]
    colours = bars["data"][0]["marker"]["color"]
    assert colours[2] == "#d62728" and colours.count("#d62728") == 1  # the config's 4 heads
    losses = arr(bars["data"][0]["y"])
    assert losses.argmin() == 2
    assert "trained with **4** heads" in at.success[0].value
    at.select_slider(key="learn_n_heads").set_value(16).run()
    assert not at.exception
    (pats,) = titled(at, "layer 0 split into 16 heads")
    assert len(pats["data"]) == 8  # the first 8 of 16 heads


def test_learn_specialise_step_links_each_labelled_head_to_the_grid(monkeypatch):
    at = learn(monkeypatch)
    at.radio(key="learn_step").set_value("4 · Heads specialise").run()
    assert not at.exception and not at.error
    text = " ".join(m.value for m in at.markdown)
    assert "**L1H1** · `induction`" in text and "**L0H0** · `previous_token`" in text
    assert any("headlens-attention-row" in h.value for h in at.html)
    at.button(key="learn_show::L1H1").click().run()
    assert not at.exception
    assert at.multiselect(key=f"heads::{REF}").value == ["L1H1"]
    assert at.selectbox(key="detector").value == "induction"
    assert grid(at)["data"][0]["marker"]["line"]["color"][5] == "#ff2d55"  # L1H1 marked selected


def test_grid_opens_on_strongest_labels_and_a_layer_is_shown_side_by_side_as_text_too(monkeypatch):
    at = start(monkeypatch, REF)
    assert at.selectbox(key="detector").value == hd.LABELS_CHOICE
    fig = grid(at)
    marks = fig["data"][0]["text"]
    assert marks[0] == "PT" and marks[5] == "IND"  # L0H0 previous-token, L1H1 induction
    assert {t["name"] for t in fig["data"][1:]} >= {"previous_token", "induction"}  # the legend of types
    at.selectbox(key="patterns_mode").set_value("all heads of layer 1").run()
    assert not at.exception and not at.error
    side = [f for f in figures(at) if f["layout"].get("title", {}).get("text", "").startswith("layer 1, heads")]
    assert len(side) == 1 and len(side[0]["data"]) == 4
    (view,) = [h.value for h in at.html if "headlens-token-view" in h.value]
    n_tokens = len(cache.get_model(REF).to_str_tokens(at.text_area(key=f"text::{REF}").value))
    assert view.count('class="hl-tok"') == 4 * n_tokens


def test_compare_shows_both_grids_and_the_change_of_every_heads_score(monkeypatch):
    at = start(monkeypatch, REF)
    at.selectbox(key="detector").set_value("induction").run()
    at.segmented_control(key="view").set_value("Compare").run()
    assert not at.exception and not at.error
    choice = at.selectbox(key=f"compare::{REF}")
    assert "(snapshot)" in choice.value  # a model with training snapshots compares with its earliest first
    snapshot = history.compare_choices(REF)[choice.value]
    grids = [f for f in figures(at) if f["layout"].get("title", {}).get("text", "").endswith("induction score")]
    assert len(grids) == 2
    (diff,) = [f for f in figures(at) if "score: " in f["layout"].get("title", {}).get("text", "")
               and " − " in f["layout"]["title"]["text"]]
    a = cache.get_scores(REF)
    b = cache.get_scores(snapshot)
    ind_a = a[a.detector == "induction"].sort_values(["layer", "head"]).score.to_numpy()
    ind_b = b[b.detector == "induction"].sort_values(["layer", "head"]).score.to_numpy()
    assert arr(diff["data"][0]["marker"]["color"]) == pytest.approx(ind_b - ind_a, abs=1e-9)
    (table,) = [d.value for d in at.dataframe if "diff" in d.value.columns]
    assert table["diff"].abs().is_monotonic_decreasing
    at.selectbox(key=f"compare::{REF}").set_value("dyck").run()  # same shape: 2 layers x 4 heads
    assert not at.exception and not at.error


def test_learn_runs_in_bfloat16_on_the_model_the_page_shows(monkeypatch):
    at = learn(monkeypatch)
    at.selectbox(key="dtype").set_value("bfloat16").run()
    assert not at.exception
    for step in ("1 · The split", "2 · Silent bugs", "4 · Heads specialise"):
        at.radio(key="learn_step").set_value(step).run()
        assert not at.exception and not [e for e in at.error if "Could not" in e.value], step
    model = cache.get_model(REF, ("bfloat16", "cpu"))
    split = cache.get_split(REF, at.text_area(key=f"text::{REF}").value, 0, ("bfloat16", "cpu"))
    assert str(next(model.parameters()).dtype) == "torch.bfloat16" and split.q.dtype.name == "float32"
