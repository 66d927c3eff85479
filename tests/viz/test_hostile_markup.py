"""Strings from a model file and from the user's corpus never become markup: a tiny Llama whose hand-made
vocabulary holds ``<script>``, ``onerror=`` and ``</td>``, in a folder whose name is markup too, read on a
corpus of those tokens. Its atlas and its HTML report open in chromium: no payload runs (each would set
``window.__pwned`` or the title) and the strings show as text."""

from __future__ import annotations

import html
from pathlib import Path

import pytest

from tests.browser_tools import ARTIFACTS, CHROMIUM_ARGS, chromium

HOSTILE = ["<script>window.__pwned=1;document.title='pwned'</script>x",
           "<img/src=x/onerror=window.__pwned=2>y",
           "</td></tr></table><script>window.__pwned=3</script>z",
           "'\"><svg/onload=window.__pwned=4>w"]
WORDS = ["the", "cat", "sat", "on", "a", "mat", "and", "dog", "ran", "far"]
NAME = "<svg onload=window.__pwned=5>model"  # the model's folder, hence its name


@pytest.fixture(scope="module")
def hostile_model(tmp_path_factory) -> Path:
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    folder = tmp_path_factory.mktemp("hostile") / NAME
    vocab = {t: i for i, t in enumerate(["<unk>", "<s>", "</s>", *WORDS, *HOSTILE])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=32, intermediate_size=64, num_attention_heads=2, num_key_value_heads=2,
                         num_hidden_layers=2, vocab_size=len(vocab), max_position_embeddings=64, bos_token_id=1,
                         eos_token_id=2, pad_token_id=0, tie_word_embeddings=False)
    LlamaForCausalLM(config).eval().save_pretrained(folder)
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                            pad_token="<unk>").save_pretrained(folder)
    return folder


def corpus_lines(n: int = 24) -> list[str]:
    import random

    rng = random.Random(0)
    return [" ".join(rng.choice(WORDS + HOSTILE) for _ in range(30)) for _ in range(n)]


def _open(page_path: Path, screenshot: str) -> tuple[str, str, object]:
    """``page_path`` in chromium: its title, its visible text and what ``window.__pwned`` holds."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium(), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            page.goto(page_path.resolve().as_uri())
            page.wait_for_load_state("load")
            state = page.title(), page.inner_text("body"), page.evaluate("() => window.__pwned")
            ARTIFACTS.mkdir(exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / screenshot), full_page=True)
            return state
        finally:
            browser.close()


@pytest.mark.browser
def test_the_atlas_of_a_hostile_vocabulary_shows_its_tokens_as_text(hostile_model, tmp_path, monkeypatch, capsys):
    from tests.conftest import run_cli

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(corpus_lines()) + "\n")
    out = tmp_path / "site"
    code, _, err = run_cli(monkeypatch, capsys, "atlas", "--model", f"hf:{hostile_model}", "--out", str(out),
                           "--corpus", str(corpus), "--n-windows", "16", "--k", "3", "--quiet")
    assert code == 0, err
    title, text, pwned = _open(out / "index.html", "hostile-atlas-index.png")
    assert pwned is None and title != "pwned" and NAME in text and NAME in title
    title, text, pwned = _open(out / "heads" / "L0H0.html", "hostile-atlas-head.png")
    assert pwned is None and title != "pwned"
    shown = [t for t in HOSTILE if t in text]
    assert len(shown) >= 2, text[:2000]  # the exemplars' tokens, as the characters they are


@pytest.mark.browser
def test_the_report_of_a_hostile_vocabulary_shows_its_tokens_as_text(hostile_model, tmp_path):
    import headlens
    from headlens.viz.report import report_html

    model = headlens.load(f"hf:{hostile_model}")
    table = headlens.classify(model, detectors=["previous_token"], n_prompts=4)
    first = (table["layer"] == 0) & (table["head"] == 0)
    table.loc[first, "label"] = True  # a labelled head: its pattern on the prompt is drawn, tokens and all
    prompt = " ".join(HOSTILE + WORDS[:3])
    page = tmp_path / "report.html"
    page.write_text(report_html(model, table, prompt=prompt), encoding="utf-8")
    title, text, pwned = _open(page, "hostile-report.png")
    assert pwned is None and title != "pwned" and NAME in title
    assert html.unescape(prompt) in text  # the example prompt, shown as typed
