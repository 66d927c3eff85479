"""The dashboard and its Learn view on the real SmolLM2, driven headlessly through AppTest (in-process: the test run's
loaded model is handed to the page, so nothing loads twice; the scores are a small stored scan, smollm2_cache).

Truth comes from plain ``transformers`` on the same directory, loaded here with eager attention: the split's
queries and keys are its ``q_proj`` / ``k_proj`` outputs, the clean continuation is its own greedy ``generate``.
Known answers: SmolLM2 continues "The Eiffel Tower is in the city of" with " Paris"; broken (a missing transpose,
or 3 query heads of 192 instead of 9 of 64) it does not, and is far worse on the text; the doctor names the bug
and finds the 9 heads the weights were trained with.
"""

from __future__ import annotations

import re

import pytest
import torch
from smollm2_cache import smollm2_dashboard_cache  # noqa: F401  (the fixture)
from test_app import arr, figures, grid, start

from headlens.app import cache, cache_lm
from headlens.app import helpers as hd
from headlens.app.lesson_lm import EIFFEL
from headlens.app.page import VIEWS

REF = "smollm2"
LONG = ("Zebras live on the grasslands of eastern and southern Africa, where they graze in large herds. Each zebra has "
        "its own pattern of black and white stripes, and no two are alike. Scientists still argue about why the stripes "
        "evolved: they may confuse predators, keep biting flies away, or help the animals stay cool in the midday sun.")


@pytest.fixture(scope="module")
def reference(smollm2):
    """SmolLM2 in plain transformers (eager attention), from the directory the bridge booted."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(smollm2.tokenizer_dir, attn_implementation="eager",
                                                dtype=torch.float32).eval()


@pytest.fixture
def app(monkeypatch, smollm2, smollm2_dashboard_cache):  # noqa: F811
    import headlens.models.loading as loading

    real = loading.load
    monkeypatch.setattr(loading, "load", lambda ref, **kw: smollm2 if ref == REF else real(ref, **kw))
    monkeypatch.setenv("HEADLENS_CACHE", str(smollm2_dashboard_cache))
    for fn in (cache._load_model, cache._stored, cache_lm._plain):
        fn.clear()
    return start(monkeypatch, REF)


def no_failure(at) -> None:
    assert not at.exception, [e.value for e in at.exception]
    assert not [e.value for e in at.error if "Could not" in e.value or "unexpected" in e.value]


def continuations(at) -> list[str]:
    return [h.value for h in at.html if "headlens-continuation" in h.value]


def q_and_k(reference, ids: torch.Tensor, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Layer ``layer``'s q_proj and k_proj outputs in plain transformers: ``(T, H d)``, ``(T, H_kv d)``."""
    seen = {}
    attn = reference.model.layers[layer].self_attn
    hooks = [attn.q_proj.register_forward_hook(lambda m, a, out: seen.__setitem__("q", out[0])),
             attn.k_proj.register_forward_hook(lambda m, a, out: seen.__setitem__("k", out[0]))]
    try:
        with torch.no_grad():
            reference(ids)
    finally:
        for h in hooks:
            h.remove()
    return seen["q"], seen["k"]


def test_every_view_renders_on_smollm2_from_its_stored_scores(app, smollm2):
    at = app
    no_failure(at)
    assert "smollm2" in at.caption[0].value
    assert len(grid(at)["data"][0]["x"]) == 30 * 9
    text = at.text_area(key=f"text::{REF}").value
    assert text == hd.LM_TEXT and 30 < smollm2.to_tokens(text).shape[1] <= 40
    for view in VIEWS:
        at.segmented_control(key="view").set_value(view).run()
        no_failure(at)
    at.segmented_control(key="view").set_value("Patterns").run()
    ticks = next(f for f in figures(at) if "attention on your text" in f["layout"]["title"]["text"])["layout"]
    assert "·Paris" in ticks["xaxis"]["ticktext"] and "⏎" in "".join(ticks["xaxis"]["ticktext"])  # not 'ĠParis', 'Ċ'
    long = " ".join([LONG] * 4)  # a few hundred tokens: a window of them, every one labelled, and a slider
    at.text_area(key=f"text::{REF}").set_value(long).run()
    no_failure(at)
    n = smollm2.to_tokens(long).shape[1]
    assert 250 < n < 400 and any(f"64 of {n}" in s.label for s in at.slider)
    (view,) = [h.value for h in at.html if "headlens-token-view" in h.value]
    assert view.count('class="hl-tok"') == n and " Africa" in view and "ĠAfrica" not in view


def test_learn_on_smollm2_shows_its_real_split_bugs_head_count_and_specialists(app, smollm2, reference):
    at = app
    at.segmented_control(key="view").set_value("Learn").run()
    at.selectbox(key="learn_layer").set_value(17).run()
    no_failure(at)
    # 1: the split: the bridged model's own q and k are plain transformers' q_proj and k_proj outputs
    ids = smollm2.to_tokens(hd.LM_TEXT)
    q, k = q_and_k(reference, ids, 17)
    by_title = {f["layout"]["title"]["text"][:1]: f for f in figures(at) if f["layout"].get("title", {}).get("text")}
    assert arr(by_title["①"]["data"][0]["z"]) == pytest.approx(q.numpy(), abs=1e-3)
    assert arr(by_title["②"]["data"][0]["z"]) == pytest.approx(k.numpy(), abs=1e-3)
    assert [a["text"] for a in by_title["②"]["layout"]["annotations"]] == ["kv 0", "kv 1", "kv 2"]
    assert "k = repeat_kv(k, 3)" in at.code[0].value
    assert "L17H4 · kv 1" in [a["text"] for a in by_title["⑤"]["layout"]["annotations"]]

    # 2: the missing transpose: the clean continuation is transformers' own; broken, no Paris
    at.radio(key="learn_step").set_value("2 · Silent bugs").run()
    no_failure(at)
    want = reference.generate(smollm2.to_tokens(EIFFEL), max_new_tokens=8, do_sample=False)
    clean, broken = continuations(at)[0].split("with the bug:")
    said = smollm2.tokenizer.decode(want[0, -8:])
    assert said.startswith(" Paris") and said.split("\n")[0].strip() in clean
    assert "Paris" not in broken
    losses = {m.label: float(m.value.split()[0]) for m in at.metric}
    assert losses["loss, with the bug"] > losses["loss, clean model"] + 3
    assert "missing_transpose_split" in at.error[0].value

    # 3: three heads of 192 load without a word, answer noise, and the doctor finds the 9 heads
    at.radio(key="learn_step").set_value("3 · How many heads?").run()
    no_failure(at)
    assert "said:** nothing" in at.warning[0].value and "n_heads=3, n_kv_heads=1, head_dim=192" in at.warning[0].value
    right, wrong = continuations(at)[0].split("3 heads:")
    assert "Paris" in right and "Paris" not in wrong
    at.button(key="run_learn_doctor::smollm2::3").click().run()
    no_failure(at)
    assert "FAILED" in at.error[0].value and "trained with **9** query heads and 3" in at.error[0].value

    # 4: the real induction, duplicate-token and previous-token heads on the text
    at.radio(key="learn_step").set_value("4 · Heads specialise").run()
    no_failure(at)
    shown = " ".join(m.value for m in at.markdown)
    for head, kind in (("L18H6", "induction"), ("L14H3", "duplicate_token"), ("L16H0", "previous_token")):
        assert f"**{head}** · `{kind}`" in shown, head
    # ... and which heads wrote the word the strongest induction head helps predict: the Attribution view
    link = at.button(key="learn_attribution")
    position = int(re.search(r"\(#(\d+)\)\?", link.label).group(1))
    induction = [m.value for m in at.markdown if "· `induction`" in m.value]
    assert f"(#{position - 1}) it puts" in induction[0]  # the token after the strongest induction head's query
    link.click().run()
    no_failure(at)
    assert at.segmented_control(key="view").value == "Attribution"
    assert at.selectbox(key=f"attr_pos::{REF}").value == position
