"""The atlas' prose corpus: no line is read twice, in one window or across windows."""

from __future__ import annotations

from headlens.atlas.corpus import corpus_windows, distinct_lines
from headlens.probes.prose import prose_corpus
from tests.conftest import make_gpt


def test_prose_windows_share_no_line():
    model = make_gpt()
    windows = corpus_windows(model, "prose", 48, 64, seed=3).prompts
    assert len(windows) == 48 and all(len(w) == len(windows[0]) for w in windows)
    lines = [ln for ln in distinct_lines(prose_corpus()) if len(ln) > 40]
    texts = [model.tokenizer.decode(w.tolist()) for w in windows]
    seen = {}
    for i, text in enumerate(texts):  # every whole line the windows hold, with the window it is in
        for ln in text.split("\n")[:-1]:  # the last line of a window may be cut: its start is still unique
            if len(ln) > 40:
                assert ln not in seen, f"window {i} repeats a line of window {seen[ln]}: {ln[:60]!r}"
                seen[ln] = i
    assert seen and all(ln in set(lines) for ln in seen if "\ufffd" not in ln)


def test_near_duplicate_lines_are_read_once():
    text = "Python Character Mapping Codec cp1252 generated from 'CP1252.TXT'.\n" \
           "Python Character Mapping Codec cp437 generated from 'CP437.TXT'.\nA line."
    assert distinct_lines(text) == ["Python Character Mapping Codec cp1252 generated from 'CP1252.TXT'.", "A line."]


def test_windows_past_the_context_are_cut_and_said():
    import pytest

    model = make_gpt(n_ctx=32)
    with pytest.warns(UserWarning, match=r"seq_len=64 is beyond the model's context \(n_ctx=32\)"):
        windows = corpus_windows(model, "repeats", 4, 64)
    assert max(len(w) for w in windows.prompts) <= 32
