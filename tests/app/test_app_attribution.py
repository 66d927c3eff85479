"""The dashboard's Attribution view, headless: a token of the text in, the heads that wrote it out (the same
numbers as ``headlens.attribute``), and the jump to the chosen head's attention pattern."""

from __future__ import annotations

import pytest
from streamlit.testing.v1 import AppTest

import headlens
from headlens import save_checkpoint
from headlens.app import cache
from headlens.app import helpers as hd
from headlens.app.views.attribution import picked
from tests.app.test_app import ENTRY, TIMEOUT, figures
from tests.conftest import make_gpt


@pytest.fixture(scope="module")
def ref(tmp_path_factory):
    return str(save_checkpoint(make_gpt(n_ctx=96, init_range=0.2), tmp_path_factory.mktemp("attr") / "tiny.safetensors"))


def _bars(at):
    (fig,) = [f for f in figures(at) if "who wrote" in f["layout"].get("title", {}).get("text", "")]
    return fig


def test_a_token_its_writers_and_the_jump_to_patterns(monkeypatch, ref):
    monkeypatch.setenv(hd.MODEL_ENV, ref)
    at = AppTest.from_file(str(ENTRY), default_timeout=TIMEOUT)
    at.run()
    text = "def f(x): return x"
    at.text_area(key=f"text::{ref}").set_value(text).run()
    at.segmented_control(key="view").set_value("Attribution").run()
    assert not at.exception and not at.error
    at.selectbox(key=f"attr_pos::{ref}").set_value(5).run()  # the token at position 5 ('f'), read at 4
    at.checkbox(key="attr_heads_only").check().run()
    assert not at.exception and not at.error
    fig = _bars(at)
    want = headlens.attribution_summary(headlens.attribute(cache.get_model(ref), [text], target="f", position=4),
                                        n_boot=10)
    heads = want[want["head"] >= 0]
    top = heads.iloc[0].component  # the strongest writer is drawn on top (the last bar)
    assert fig["data"][0]["y"][-1] == top
    assert "who wrote 'f' at position 5" in fig["layout"]["title"]["text"]
    at.selectbox(key="attr_head").set_value(top)
    at.button(key="attr_jump").click().run()
    assert not at.exception and not at.error
    assert at.segmented_control(key="view").value == "Patterns"
    assert at.multiselect(key=f"heads::{ref}").value == [top]
    titles = [f["layout"].get("title", {}).get("text", "") for f in figures(at)]
    assert any(t.startswith(f"{top} attention") for t in titles)
    assert cache.get_model(ref).active_hooks() == []


def test_the_models_own_prediction(monkeypatch, ref):
    monkeypatch.setenv(hd.MODEL_ENV, ref)
    at = AppTest.from_file(str(ENTRY), default_timeout=TIMEOUT)
    at.run()
    at.segmented_control(key="view").set_value("Attribution").run()
    at.radio(key="attr_target").set_value("the model's own top prediction there").run()
    assert not at.exception and not at.error
    assert _bars(at)["data"][0]["type"] == "bar"


def test_selection_parsing():
    assert picked({"selection": {"points": [{"customdata": [2, 3]}]}}, 1) == [3]
    assert picked({"selection": {"points": []}}) == []
