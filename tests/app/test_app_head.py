"""The dashboard's Head view, headless: one head's page on every family of the architecture matrix and on a zoo
model, checked against the library (the atlas' description and exemplars, the ablation API, the circuit edges)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from hf_families import FAMILIES, build, claims
from streamlit.testing.v1 import AppTest

from headlens.app import atlas_store, cache
from headlens.app import helpers as hd
from tests.app.test_app import ENTRY, TIMEOUT
from tests.conftest import make_gpt

HEAD = "L1H1"


def open_head_page(monkeypatch: pytest.MonkeyPatch, ref: str, head: str = HEAD) -> AppTest:
    """The dashboard on ``ref``, ``head`` chosen in the grid's box, then its page opened by the button."""
    monkeypatch.setattr(hd, "DEFAULT_N_PROMPTS", 4)
    monkeypatch.setenv(hd.MODEL_ENV, ref)
    at = AppTest.from_file(str(ENTRY), default_timeout=TIMEOUT)
    at.run()
    at.multiselect(key=f"heads::{ref}").set_value([head]).run()
    at.button(key="open_head_page").click().run()
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]
    assert at.segmented_control(key="view").value == "Head"
    return at


def metric(at: AppTest, start: str) -> str:
    (value,) = [m.value for m in at.metric if m.label.startswith(start)]
    return value


def expected_ablation(model, name: str, text: str) -> tuple[str, float]:
    """The metric the page ablates on and headlens' own ablation of that one head (``sweep``), as run_ablation asks."""
    from headlens.app.views.head import ablation_metric
    from headlens.interventions.sweep import sweep

    name_ = ablation_metric(model)
    prompts = None if getattr(model.tokenizer, "kind", None) == "byte" or name_ not in ("lm_loss", "kl") else [text]
    row = sweep(model, groups=[name], method="zero", metrics=[name_], prompts=prompts, n_prompts=4, n_control=0,
                n_boot=50, seed=0, attribution=False).iloc[0]
    return name_, float(row["delta"])


@pytest.fixture(scope="module")
def family_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.set_num_threads(min(2, torch.get_num_threads()))
    return tmp_path_factory.mktemp("head_families")


@pytest.mark.parametrize("family", claims("dashboard"))
def test_head_page_renders_for_every_family(family, family_root, monkeypatch):
    from headlens.atlas.build import build_atlas

    ref = f"hf:{build(family, family_root / family)}"
    at = open_head_page(monkeypatch, ref)
    model = cache.get_model(ref)
    assert at.subheader[0].value.startswith(f"{HEAD} of ")
    assert "Labels:" in " ".join(m.value for m in at.markdown)
    text = at.text_area(key=f"text::{ref}").value
    name, delta = expected_ablation(model, HEAD, text)
    assert metric(at, f"{name} change, {HEAD} zeroed") == f"{delta:+.4f}"
    if not FAMILIES[family].causal:  # an encoder: the atlas says why it cannot be built, in one line
        assert any("cannot be built" in w.value and "encoder" in w.value for w in at.warning)
        assert any("refused for an encoder" in c.value for c in at.caption)
        return
    assert not at.warning, [w.value for w in at.warning]
    atlas = build_atlas(model, atlas_store.CONFIG)  # the library's own atlas, built again: the page shows it
    layer, head = hd.parse_head(HEAD)
    (d,) = [d for d in atlas.descriptions if (d.layer, d.head) == (layer, head)]
    pages = [h.value for h in at.html]
    assert any("<p class='headlens-description'>" in h and h.count("imulated as") for h in pages)
    assert any(re.sub(r"&#x27;", "'", h).find(d.text) >= 0 for h in pages)
    assert metric(at, "held-out agreement") == f"{d.agreement:.2f}"
    (exemplars,) = [h for h in pages if "headlens-exemplars" in h]
    kept = atlas.exemplars.top["attention"][layer * atlas.exemplars.n_heads + head]
    assert exemplars.count("<div class='ex'>") == len(kept) > 0
    assert exemplars.count("class='tok key") == sum(e.key >= 0 for e in kept)  # the attended key outlined
    assert any("No circuit has been computed" in c.value for c in at.caption)


def test_zoo_induction_head_page_names_induction_and_every_ranking(monkeypatch):
    """induction-2l (a zoo model over 63 characters: the atlas reads the repeats corpus): L1H1 is an induction
    head, L0H0 a previous-token head, and each ranking shows its own exemplars."""
    at = open_head_page(monkeypatch, "induction-2l")
    assert at.subheader[0].value == "L1H1 of induction-2l: induction"
    assert any("Role: induction." in h.value for h in at.html)
    assert any("repeats corpus" in c.value for c in at.caption)
    (card,) = [h.value for h in at.html if "<div class='card'>" in h.value]  # the atlas' own card renderer
    assert "<b>Probes:</b> induction" in card and "induction; its rule" in card and "the corpus disagree" not in card
    assert "Atlas numbers from the repeats corpus, seed 0: 36 windows of 64 tokens" in card  # which windows
    atlas = cache.get_atlas("induction-2l")
    assert atlas.config.corpus == "repeats"
    for ranking in ("write", "dla_pos"):
        at.segmented_control(key="head_ranking").set_value(ranking).run()
        (shown,) = [h.value for h in at.html if "headlens-exemplars" in h.value]
        assert shown.count("<div class='ex'>") == len(atlas.exemplars.top[ranking][1 * 4 + 1])
        for e in atlas.exemplars.top[ranking][5][:3]:
            assert f"score {e.score:.3f}" in shown
    at.selectbox(key="head_page::induction-2l").set_value("L0H0").run()
    assert not at.exception and not at.error
    assert at.subheader[0].value == "L0H0 of induction-2l: previous token"


def test_head_page_lists_the_circuit_edges_found_this_session(monkeypatch, tmp_path):
    from headlens import save_checkpoint

    ref = str(save_checkpoint(make_gpt(n_ctx=96, init_range=0.2), tmp_path / "tiny.safetensors"))
    at = open_head_page(monkeypatch, ref, "L0H1")
    assert any("--receivers L1H0,L1H1,L1H2,L1H3" in c.value for c in at.caption)  # none found yet: how to
    at.segmented_control(key="view").set_value("Circuit").run()
    at.multiselect(key="circuit_receivers").set_value(["L1H2"])
    at.selectbox(key="circuit_method").set_value("zero")
    at.selectbox(key="circuit_metric").set_value("repeated_loss")
    at.button(key="run_circuit").click().run()
    (found,) = [d.value for d in at.dataframe if "effect" in d.value.columns]
    at.segmented_control(key="view").set_value("Head").run()
    assert not at.exception and not at.error
    (edges,) = [d.value for d in at.dataframe if "beats control" in d.value.columns]
    assert len(edges) == 3 and set(edges.sender) == {"L0H1"} and set(edges.input) == {"q", "k", "v"}
    assert list(edges.effect) == list(found[found.sender == "L0H1"].effect)


def test_atlas_store_reads_back_only_under_its_key(monkeypatch, tmp_path):
    import headlens
    from headlens.app import score_store
    from headlens.atlas.build import build_atlas
    from headlens.atlas.exemplars import AtlasConfig

    monkeypatch.setenv("HEADLENS_CACHE", str(tmp_path))
    config = AtlasConfig(corpus="repeats", n_windows=8, seq_len=32, k=3)
    atlas = build_atlas(headlens.load("induction-2l"), config)
    placed = ("float32", "cpu")
    assert atlas_store.read("induction-2l", placed, config) is None
    assert atlas_store.write("induction-2l", atlas, placed) == atlas_store.path("induction-2l", placed, config)
    back = atlas_store.read("induction-2l", placed, config)
    assert [d.text for d in back.descriptions] == [d.text for d in atlas.descriptions]
    assert back.exemplars.top["attention"][5][0].tokens == atlas.exemplars.top["attention"][5][0].tokens
    for name, heads in atlas.exemplars.top.items():  # every exemplar's fields but the write vector, to the bit
        for kept, got in zip(heads, back.exemplars.top[name], strict=True):
            assert [(e.window, e.position, e.score, e.query, e.key, e.attention, e.promoted, e.suppressed)
                    for e in kept] == [(e.window, e.position, e.score, e.query, e.key, e.attention, e.promoted,
                                        e.suppressed) for e in got]
    assert torch.equal(back.exemplars.profile.mass, atlas.exemplars.profile.mass)
    assert [(d.role, d.rule, d.agreement, d.ci) for d in back.descriptions] == \
        [(d.role, d.rule, d.agreement, d.ci) for d in atlas.descriptions]
    assert back.config == atlas.config and back.seen == atlas.seen and back.strings == atlas.strings
    assert atlas_store.read("induction-2l", ("bfloat16", "cpu"), config) is None  # another precision: a miss
    with monkeypatch.context() as m:
        m.setattr(score_store, "source_digest", lambda packages: "edited")  # the atlas' source changed
        assert atlas_store.read("induction-2l", placed, config) is None


def test_the_dashboard_and_headlens_atlas_give_a_head_the_same_numbers_under_the_same_settings(monkeypatch, capsys,
                                                                                              tmp_path):
    """The card's windows line names the command that reads the dashboard's windows: run it, and every head's
    role, rule and agreement are the dashboard's."""
    import pandas as pd

    from headlens.atlas.views import windows_text
    from tests.conftest import run_cli

    monkeypatch.setenv("HEADLENS_CACHE", str(tmp_path / "cache"))
    atlas = cache.get_atlas("induction-2l")
    command = re.search(r"`headlens (atlas [^`]*)`", windows_text(atlas)).group(1).split()
    code, _, err = run_cli(monkeypatch, capsys, *command, "--model", "induction-2l", "--out", str(tmp_path / "a"),
                           "--quiet")
    assert code == 0, err
    table = pd.read_csv(tmp_path / "a" / "descriptions.csv")
    assert list(zip(table.role, table.rule, table.agreement, strict=True)) == \
        [(d.role, d.rule, pytest.approx(d.agreement, abs=1e-12)) for d in atlas.descriptions]
