"""The dashboard's Circuit view, headless: receivers in, the graph, the edge table and both heads' patterns out."""

from __future__ import annotations

import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest

from headlens import save_checkpoint
from headlens.app import cache
from headlens.app import helpers as hd
from tests.app.test_app import ENTRY, TIMEOUT, figures
from tests.conftest import make_gpt


@pytest.fixture(scope="module")
def ref(tmp_path_factory):
    return str(save_checkpoint(make_gpt(n_ctx=96, init_range=0.2), tmp_path_factory.mktemp("circ") / "tiny.safetensors"))


def test_circuit_view_draws_edges_and_the_chosen_edges_patterns(monkeypatch, ref):
    monkeypatch.setenv(hd.MODEL_ENV, ref)
    at = AppTest.from_file(str(ENTRY), default_timeout=TIMEOUT)
    at.run()
    at.segmented_control(key="view").set_value("Circuit").run()
    assert not at.exception and not at.error
    at.multiselect(key="circuit_receivers").set_value(["L1H2"])
    at.selectbox(key="circuit_method").set_value("zero")
    at.selectbox(key="circuit_metric").set_value("repeated_loss")
    at.button(key="run_circuit").click().run()
    assert not at.exception and not at.error
    (table,) = [d.value for d in at.dataframe if "effect" in d.value.columns]
    assert set(table.receiver) == {"L1H2"} and set(table.input) == {"q", "k", "v"}
    assert isinstance(table, pd.DataFrame) and len(table) == 3 * 6  # embed, 4 heads, mlp0 into q, k, v
    at.selectbox(key="circuit_edge").set_value("L0H1 -> L1H2.k").run()
    assert not at.exception and not at.error
    titles = [f["layout"].get("title", {}).get("text", "") for f in figures(at)]
    assert any("significant edges" in t for t in titles)
    assert any(t.startswith("L0H1") for t in titles) and any(t.startswith("L1H2") for t in titles)
    assert cache.get_model(ref).active_hooks() == []


def test_circuit_view_takes_the_ioi_probe_and_draws_by_position(monkeypatch, tmp_path):
    """metric logit_diff: the IOI probe, edges at its named positions, the graph by layer and position."""
    from tests.ioi_models import save_planted_llama

    ref = f"hf:{save_planted_llama(tmp_path / 'ioi', {(1, 0): (12, 4.0)})}"
    monkeypatch.setenv(hd.MODEL_ENV, ref)
    at = AppTest.from_file(str(ENTRY), default_timeout=TIMEOUT)
    at.run()
    at.segmented_control(key="view").set_value("Circuit").run()
    at.selectbox(key="circuit_metric").set_value("logit_diff").run()
    assert not at.exception and not at.error
    at.multiselect(key="circuit_receivers").set_value(["L1H0"])
    at.multiselect(key="circuit_positions").set_value(["END"])
    at.multiselect(key="circuit_sender_positions").set_value(["IO", "S2"])
    at.button(key="run_circuit").click().run()
    assert not at.exception and not at.error
    (table,) = [d.value for d in at.dataframe if "effect" in d.value.columns]
    assert set(table.receiver_pos) == {"END"} and set(table.sender_pos) == {"END", "IO", "S2"}
    titles = [f["layout"].get("title", {}).get("text", "") for f in figures(at)]
    assert any("by layer and position" in t for t in titles)
    assert "embed@IO -> L1H0.v@END" in at.selectbox(key="circuit_edge").options
