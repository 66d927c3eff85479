"""The dashboard driven headlessly through Streamlit's AppTest: widgets in, tables and figures out.

Chart clicks cannot be injected in AppTest, so head selection goes through the multiselect the
grid mirrors into (the browser test clicks the grid itself). Models are tiny checkpoints saved
to a temp folder and handed to the app the way ``headlens dashboard --model`` does.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import make_gpt
from streamlit.testing.v1 import AppTest

from headlens import GPT, ModelConfig, save_checkpoint, viz
from headlens.app import cache
from headlens.app import helpers as hd
from headlens.models.tokenizer import Tokenizer

ENTRY = Path(__file__).resolve().parents[2] / "apps" / "dashboard.py"
TIMEOUT = 300  # first runs import torch/plotly and score the model on a shared CPU
ALPHABET = "()[]{}abcdefgh "


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("app_models")
    byte_path = save_checkpoint(make_gpt(n_ctx=96), root / "byte" / "tiny.safetensors")
    tok = Tokenizer.char_level(ALPHABET)
    torch.manual_seed(0)
    cfg = ModelConfig(n_layers=2, n_heads=2, d_model=16, n_ctx=48, d_vocab=tok.d_vocab, attn_only=True,
                      normalization="none")
    char = GPT(cfg, tokenizer=tok, name="chars").eval()
    char_path = save_checkpoint(char, root / "char" / "chars.safetensors")
    for step, loss in [(10, 2.8), (20, 2.5)]:
        torch.manual_seed(step)
        save_checkpoint(GPT(cfg, tokenizer=tok, name="chars"), root / "char" / "snapshots" / f"step_{step:05d}.safetensors",
                        metadata={"step": step, "loss": loss}, half=True)
    corrupt = root / "corrupt.safetensors"
    corrupt.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not a header")
    return {"byte": str(byte_path), "char": str(char_path), "corrupt": str(corrupt)}


def start(monkeypatch: pytest.MonkeyPatch, ref: str, script: Path = ENTRY) -> AppTest:
    monkeypatch.setenv(hd.MODEL_ENV, ref)
    at = AppTest.from_file(str(script), default_timeout=TIMEOUT)
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def arr(value: object) -> np.ndarray:
    """A figure array as numpy: plotly writes numpy arrays as base64 typed arrays (``bdata``)."""
    if isinstance(value, dict) and "bdata" in value:
        flat = np.frombuffer(base64.b64decode(value["bdata"]), dtype=value["dtype"])
        shape = [int(n) for n in str(value.get("shape", len(flat))).split(",")]
        return flat.reshape(shape)
    return np.asarray(value, dtype=float)


def figures(at: AppTest) -> list[dict]:
    return [json.loads(el.proto.spec) for el in at.get("plotly_chart")]


def table_with(at: AppTest, *columns: str) -> pd.DataFrame:
    """The dataframe on the page that has these columns (AppTest does not expose dataframe keys)."""
    (table,) = [d.value for d in at.dataframe if set(columns) <= set(d.value.columns)]
    return table


def grid(at: AppTest) -> dict:
    (fig,) = [f for f in figures(at) if f["data"] and f["data"][0].get("marker", {}).get("symbol") == "square"]
    return fig


def patterns(at: AppTest) -> dict[str, dict]:
    out = {}
    for fig in figures(at):
        if fig["data"] and fig["data"][0]["type"] == "heatmap":
            out[fig["layout"]["title"]["text"].split()[0]] = fig
    return out


def colour_by(at: AppTest, detector: str) -> AppTest:
    """Colour the grid by one detector's scores (it opens on each head's strongest label when there is one)."""
    if at.selectbox(key="detector").value != detector:
        at.selectbox(key="detector").set_value(detector).run()
        assert not at.exception
    return at


def placeholders(at) -> list[dict]:
    """Figures still showing the first paint's "loading ..." placeholder."""
    return [f for f in figures(at) if not f["data"]
            and any(a.get("text", "").startswith("loading") for a in f["layout"].get("annotations", []))]


def test_app_shows_the_grid_the_selected_pattern_and_no_errors(monkeypatch, models):
    at = start(monkeypatch, models["byte"])
    assert not at.error
    assert placeholders(at) == []  # the first paint's placeholder gave way to the grid
    assert at.selectbox(key="model_choice").value == hd.CUSTOM_CHOICE
    assert at.text_input(key="model_path").value == models["byte"]
    labelled = cache.get_scores(models["byte"])["label"].any()
    assert at.selectbox(key="detector").value == (hd.LABELS_CHOICE if labelled else "induction")
    fig = grid(colour_by(at, "induction"))
    custom = [tuple(c[:2]) for c in fig["data"][0]["customdata"]]
    assert custom == [(layer, head) for layer in range(2) for head in range(4)]
    # the grid's colours are the induction scores of the scores table
    model = cache.get_model(models["byte"])
    scores = cache.get_scores(models["byte"])
    ind = scores[scores.detector == "induction"].sort_values(["layer", "head"])
    assert fig["data"][0]["marker"]["color"] == pytest.approx(list(ind.score))
    # one head is preselected (the top induction scorer) and its pattern is drawn on the example text
    (selected,) = at.multiselect(key=f"heads::{models['byte']}").value
    best = ind.sort_values("score").iloc[-1]
    assert selected == hd.format_head(best.layer, best["head"])
    pats = patterns(at)
    assert list(pats) == [selected]
    text = at.text_area(key=f"text::{models['byte']}").value
    assert text == hd.example_text(model)
    str_tokens = model.to_str_tokens(text)
    n_tokens, shown = len(str_tokens), min(len(str_tokens), viz.PATTERN_WINDOW)
    assert arr(pats[selected]["data"][0]["z"]).shape == (shown, shown)
    # every token of the window is labelled on both axes; a slider moves the window over longer texts
    xaxis, yaxis = pats[selected]["layout"]["xaxis"], pats[selected]["layout"]["yaxis"]
    assert xaxis["ticktext"] == yaxis["ticktext"] == [viz.display_token(t) for t in str_tokens[:shown]]
    if n_tokens > shown:
        (slider,) = at.slider
        slider.set_value(n_tokens - shown).run()
        assert not at.exception
        last = patterns(at)[selected]["layout"]["xaxis"]["ticktext"]
        assert last == [viz.display_token(t) for t in str_tokens[-shown:]]
    # exports: scores as CSV, figures as HTML
    labels = [b.label for b in at.download_button]
    assert "Download scores (CSV)" in labels and "Download figure (HTML)" in labels
    assert model.active_hooks() == []


def test_selecting_heads_in_the_mirrored_widget_updates_grid_and_patterns(monkeypatch, models):
    at = start(monkeypatch, models["byte"])
    key = f"heads::{models['byte']}"
    at.multiselect(key=key).set_value(["L1H3", "L0H1"]).run()
    assert not at.exception and not at.error
    assert set(patterns(at)) == {"L1H3", "L0H1"}
    lines = grid(at)["data"][0]["marker"]["line"]["color"]
    marked = [i for i, c in enumerate(lines) if c == "#ff2d55"]
    assert marked == [1, 7]  # L0H1 and L1H3 in layer-major order
    # the selected heads' scores across detectors: a profile figure and a table
    profile = [f for f in figures(at) if f["data"] and f["data"][0]["type"] == "bar"]
    assert {t["name"] for t in profile[0]["data"]} == {"L1H3", "L0H1"}
    detail = table_with(at, "head", "detector", "ci_low")
    assert set(detail["head"]) == {"L1H3", "L0H1"}
    assert set(detail["detector"]) == set(cache.get_scores(models["byte"]).detector)
    at.multiselect(key=key).set_value([]).run()
    assert not at.exception and not patterns(at) and at.info


def test_scoring_on_real_python_recolours_the_grid_and_an_unfit_model_gets_a_warning(monkeypatch, models):
    at = start(monkeypatch, models["byte"])
    at.selectbox(key="score_source").set_value("real Python (stdlib)").run()
    assert not at.exception and not at.error and not at.warning
    stdlib = cache.get_scores(models["byte"], corpus="stdlib")
    n_ctx = cache.get_model(models["byte"]).cfg.n_ctx
    assert stdlib.attrs["probes"]["stdlib"]["seq_len"] == min(hd.CORPUS_SEQ_LEN, n_ctx)  # capped by the context
    assert stdlib.attrs["probes"]["stdlib"]["pairs"] == ["()", "[]", "{}"]
    ind = stdlib[stdlib.detector == "induction"].sort_values(["layer", "head"])
    generated = cache.get_scores(models["byte"])
    assert list(ind.score) != list(generated[generated.detector == "induction"].sort_values(["layer", "head"]).score)
    assert grid(colour_by(at, "induction"))["data"][0]["marker"]["color"] == pytest.approx(list(ind.score))
    # a char model whose alphabet cannot spell Python: a warning that says so, and the page lives on
    at = start(monkeypatch, models["char"])
    at.selectbox(key="score_source").set_value("real Python (stdlib)").run()
    assert not at.exception
    assert any("stdlib corpus is Python source" in w.value for w in at.warning)


def test_editing_the_text_redraws_the_pattern_and_bad_text_is_a_message(monkeypatch, models):
    at = start(monkeypatch, models["byte"])
    key = f"text::{models['byte']}"
    at.text_area(key=key).set_value("abcab(c)").run()
    assert not at.exception and not at.error
    (fig,) = patterns(at).values()
    assert fig["layout"]["xaxis"]["ticktext"] == ["&lt;bos&gt;", "a", "b", "c", "a", "b", "(", "c", ")"]
    assert arr(fig["data"][0]["z"]).shape == (9, 9)
    at.text_area(key=key).set_value("   ").run()
    assert not at.exception and "empty" in at.error[0].value
    at.text_area(key=key).set_value("x" * 500).run()
    assert not at.exception and "n_ctx=96" in at.error[0].value
    at.text_area(key=key).set_value("back to normal").run()
    assert not at.exception and not at.error and patterns(at)


def test_model_picker_reports_bad_models_and_keeps_working(monkeypatch, models):
    at = start(monkeypatch, "/no/such/model.safetensors")
    assert "Could not load model" in at.error[0].value and "no such file" in at.error[0].value
    assert figures(at) == []  # no placeholder left waiting for a model that will not come
    at.text_input(key="model_path").set_value(models["corrupt"]).run()
    assert not at.exception and "Could not load model" in at.error[0].value
    assert "safetensors" in at.error[0].value  # the reader names what the file fails to be
    at.text_input(key="model_path").set_value(models["char"]).run()
    assert not at.exception and not at.error
    assert len(grid(at)["data"][0]["customdata"]) == 4
    text = at.text_area(key=f"text::{models['char']}").value
    assert text and set(text) <= set(ALPHABET)  # the example speaks the model's alphabet
    options = at.selectbox(key="model_choice").options
    assert options[-1] == hd.CUSTOM_CHOICE
    if hd.minilm_installed():
        assert "minilm" in options


def test_ablation_panel_shows_metric_change_with_ci_and_per_token_losses(monkeypatch, models):
    at = start(monkeypatch, models["byte"])
    at.multiselect(key=f"heads::{models['byte']}").set_value(["L1H0", "L1H1"]).run()
    at.segmented_control(key="view").set_value("Ablation").run()
    assert not at.exception and not at.error
    at.selectbox(key="ablation_method").set_value("mean")
    at.selectbox(key="ablation_metric").set_value("repeated_loss")
    at.button(key="run_ablation").click().run()
    assert not at.exception and not at.error
    metrics = {m.label: m.value for m in at.metric}
    change = metrics["repeated_loss change, L1H0, L1H1 (mean)"]
    assert change.startswith(("+", "-"))
    low, high = (float(v) for v in metrics["95% CI"].strip("[]").split(","))
    assert low <= float(change) <= high
    effects = table_with(at, "heads", "delta")
    assert list(effects["heads"]) == ["L1H0+L1H1", "random heads (control)"]
    assert (effects["ci_low"] <= effects["ci_high"]).all()
    # per-token loss change on the user's text, coloured inline, one span per predicted token
    model = cache.get_model(models["byte"])
    text = at.text_area(key=f"text::{models['byte']}").value
    (page,) = [h.value for h in at.html]
    assert page.count("<span") == len(model.to_str_tokens(text)) - 1
    bars = [f for f in figures(at) if f["layout"].get("title", {}).get("text", "").startswith("per-token")]
    assert arr(bars[0]["data"][0]["y"]).shape == (len(model.to_str_tokens(text)) - 1,)
    assert model.active_hooks() == []  # the cached model never keeps the ablation hooks


def test_training_view_plots_loss_and_scores_over_snapshots(monkeypatch, models):
    at = start(monkeypatch, models["char"])
    at.segmented_control(key="view").set_value("Training").run()
    assert not at.exception and not at.error
    (fig,) = [f for f in figures(at) if f["data"] and f["data"][0].get("name") == "loss"]
    assert list(arr(fig["data"][0]["x"])) == [10, 20]
    assert arr(fig["data"][0]["y"]) == pytest.approx([2.8, 2.5])
    heads = [t for t in fig["data"][1:]]
    assert {t["name"] for t in heads} == {"L0H0", "L0H1", "L1H0", "L1H1"}
    assert all(list(arr(t["x"])) == [10, 20] for t in heads)
    at = start(monkeypatch, models["byte"])  # no snapshots: an explanation, not an error
    at.segmented_control(key="view").set_value("Training").run()
    assert not at.exception and not at.error and "No training snapshots" in at.info[0].value


def test_all_heads_table_is_one_sortable_row_per_head(monkeypatch, models):
    at = start(monkeypatch, models["byte"])
    at.segmented_control(key="view").set_value("All heads").run()
    assert not at.exception
    table = table_with(at, "head", "labels")
    assert list(table["head"]) == hd.all_heads(2, 4)
    assert "induction" in table.columns and "labels" in table.columns


def test_the_packaged_script_is_the_same_app(monkeypatch, models):
    at = start(monkeypatch, models["byte"], script=cache.app_script())
    assert not at.error and grid(at)


def test_ablation_panel_values_equal_an_independent_computation(monkeypatch):
    """The numbers the panel shows (metric change, its CI, the effects table, the per-token bars) against
    tests/ablation_reference.py on the zoo's induction-2l, whose induction head carries the repeated half."""
    from ablation_reference import logits, per_prompt_loss, repeated_positions, token_nll

    from headlens.interventions.metrics import bootstrap_ci, repeated_task
    from headlens.zoo import ZOO

    ref = "induction-2l"
    (head,) = ZOO[ref].known_heads["induction"]
    at = start(monkeypatch, ref)
    at.multiselect(key=f"heads::{ref}").set_value([head]).run()
    at.segmented_control(key="view").set_value("Ablation").run()
    at.selectbox(key="ablation_method").set_value("zero")
    at.selectbox(key="ablation_metric").set_value("repeated_loss")
    at.button(key="run_ablation").click().run()
    assert not at.exception and not at.error, [e.value for e in [*at.exception, *at.error]]

    model = cache.get_model(ref)
    layer, h = int(head[1:head.index("H")]), int(head[head.index("H") + 1:])
    tokens = repeated_task(model, hd.DEFAULT_N_PROMPTS, seed=0).tokens  # the panel's probe: n prompts, seed 0
    pos = repeated_positions(tokens)
    clean = per_prompt_loss(logits(model, tokens), tokens, pos)
    delta = per_prompt_loss(logits(model, tokens, [(layer, h)]), tokens, pos) - clean
    assert delta.mean() > 1.0

    metrics = {m.label: m.value for m in at.metric}
    assert metrics[f"repeated_loss change, {head} (zero)"] == f"{delta.mean():+.4f}"
    low, high = bootstrap_ci(delta, 500, 0)
    assert metrics["95% CI"] == f"[{low:+.4f}, {high:+.4f}]"
    effects = table_with(at, "heads", "delta")
    assert effects.delta.iloc[0] == pytest.approx(delta.mean(), abs=1e-5)

    # per-token loss change on the user's text: the bars' heights, by hand
    text = at.text_area(key=f"text::{ref}").value
    ids = model.to_tokens(text)  # (1, T)
    by_hand = (token_nll(logits(model, ids, [(layer, h)]), ids) - token_nll(logits(model, ids), ids))[0]
    (bars,) = [f for f in figures(at) if f["layout"].get("title", {}).get("text", "").startswith("per-token")]
    np.testing.assert_allclose(arr(bars["data"][0]["y"]), by_hand.numpy(), atol=1e-4)
    assert float(by_hand.abs().max()) > 0.5  # the head matters on the text too
    assert model.active_hooks() == []
