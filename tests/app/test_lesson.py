"""The Learn view's library: the split on real tensors, planted bugs, the head-count sweep, head examples.

Known answers: the split's tensors are the model's own hooked queries; a planted bug is named by
the doctor; the zoo's induction model, read back with every divisor of d_model as n_heads, is best
at the count it was trained with; its labelled heads find their textbook example in a repeated text.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import make_gpt

import headlens
from headlens.app import lesson
from headlens.app.helpers import DEFAULT_N_PROMPTS  # the shipped tables are scanned with it
from headlens.doctor import check_attention
from headlens.doctor.inject import LESSON_BUGS, BuggedAttention, inject_bug
from headlens.errors import ConfigError, ProbeError
from headlens.viz import lesson as viz_lesson
from headlens.viz import tokenview
from headlens.zoo import available
from headlens.zoo import scores as shipped

needs_zoo = pytest.mark.skipif("induction-2l" not in available(), reason="zoo weights not installed")
TEXT = "abcdefgh abcdefgh (a[b]c)"


@pytest.fixture(scope="module")
def model():
    return make_gpt(n_ctx=64)


def test_split_step_is_the_models_own_view_and_transpose(model):
    step = lesson.split_step(model, TEXT, layer=1)
    T, H, d_head = len(model.to_str_tokens(TEXT)), model.n_heads, model.cfg.d_head
    assert step.q.shape == (T, model.cfg.d_model) and step.q_split.shape == (T, H, d_head)
    assert step.q_heads.shape == (H, T, d_head) and step.patterns.shape == (H, T, T)
    _, cache = model.run_with_cache(TEXT, names_filter="blocks.1.attn.hook_q")
    np.testing.assert_allclose(step.q_split, cache["blocks.1.attn.hook_q"][0].numpy(), atol=1e-6)
    for h in range(H):  # head h reads exactly its band of the residual
        np.testing.assert_array_equal(step.q_heads[h], step.q[:, h * d_head:(h + 1) * d_head])
    np.testing.assert_allclose(step.patterns.sum(-1), 1.0, atol=1e-5)
    fig = viz_lesson.residual_split_figure(step.q, H, step.tokens, range(T))
    assert [a.text for a in fig.layout.annotations] == [f"H{h}" for h in range(H)]
    assert len(viz_lesson.head_slices_figure(step.q_heads, step.tokens, range(T)).data) == H


@pytest.mark.parametrize("bug", list(LESSON_BUGS))
def test_a_planted_bug_runs_changes_the_loss_and_the_doctor_names_it(model, bug):
    step = lesson.bug_step(model, TEXT, bug, layer=1)
    assert step.diagnosis == bug
    assert step.bugged_loss != pytest.approx(step.clean_loss, abs=1e-6)
    T, H = len(step.tokens), model.n_heads
    assert step.token_diff.shape == (T - 1,)
    expected = (T, H, H) if bug == "missing_transpose_split" else (H, T, T)
    assert step.bugged_patterns.shape == expected
    assert model.active_hooks() == [] and not any(isinstance(b.attn, BuggedAttention) for b in model.transformer.h)
    fig = viz_lesson.bugged_pattern_figure(step.bugged_patterns, step.tokens, range(T))
    assert fig.data and all(t.type == "heatmap" for t in fig.data)


def test_the_merge_bug_leaves_the_first_layers_patterns_alone(model):
    step = lesson.bug_step(model, TEXT, "missing_transpose_merge", layer=0)
    np.testing.assert_allclose(step.bugged_patterns, step.clean_patterns, atol=1e-6)


def test_a_bugged_layer_with_the_bug_switched_off_is_the_native_attention(model):
    correct = BuggedAttention(model.transformer.h[0].attn, {})
    x = torch.randn(2, 7, model.cfg.d_model)
    with torch.no_grad():
        torch.testing.assert_close(correct(x), model.transformer.h[0].attn(x), atol=1e-5, rtol=1e-5)
    assert check_attention(correct, d_model=model.cfg.d_model, n_heads=model.n_heads).passed
    with pytest.raises(ConfigError, match="unknown bug 'nope'"):
        inject_bug(model, "nope")


def test_steps_that_need_the_native_model_say_so():
    class Bridged:
        name = "bridged"

    with pytest.raises(ConfigError, match="native GPT"):
        lesson.split_step(Bridged(), TEXT)
    with pytest.raises(ConfigError, match="native GPT"):
        inject_bug(Bridged(), "missing_transpose_split")


def test_empty_text_is_a_probe_error(model):
    with pytest.raises(ProbeError, match="empty"):
        lesson.split_step(model, "  ")


@needs_zoo
def test_head_count_sweep_picks_out_the_trained_count_and_examples_show_each_heads_job():
    ind = headlens.load("induction-2l")
    text = "dkryFMT07e dkryFMT07e dkryF"
    tokens, rows = lesson.head_count_step(lesson.checkpoint_source("induction-2l"), text, layer=1)
    assert [r.n_heads for r in rows] == [1, 2, 4, 8, 16, 32, 64]
    best = min(rows, key=lambda r: r.loss)
    assert best.n_heads == ind.n_heads == 4
    assert all(r.patterns.shape == (r.n_heads, len(tokens), len(tokens)) for r in rows)
    assert tokens == ind.to_str_tokens(text)
    # labelled heads, each with its best example: the induction head at the second 'F' looks at 'M'
    str_tokens, examples = lesson.head_examples(ind, text, shipped.read("induction-2l", DEFAULT_N_PROMPTS, 0))
    by_head = {(e.layer, e.head): e for e in examples}
    pt, induction = by_head[(0, 0)], by_head[(1, 1)]
    assert (pt.detector, induction.detector) == ("previous_token", "induction")
    assert pt.keys == (pt.query - 1,) and pt.weight > 0.5
    assert all(str_tokens[k - 1] == str_tokens[induction.query] for k in induction.keys) and induction.weight > 0.5
    assert lesson.checkpoint_source("minilm") is None


def test_token_view_colours_a_query_row_and_escapes_the_text():
    pattern = np.array([[1.0, 0.0, 0.0], [0.5, 0.5, 0.0], [0.1, 0.2, 0.7]])
    page = tokenview.token_view_html(["<bos>", "a", "</script>"], {"L0H0": pattern, "L0H1": np.eye(3)})
    assert page.count('class="hl-tok"') == 6 and page.count('class="hl-head"') == 2
    assert "rgba(31,119,180,0.7)" in page and "</script>\"" not in page  # the last row, the text escaped
    assert "&lt;/script&gt;" in page
    with pytest.raises(ValueError, match="expected \\(3, 3\\)"):
        tokenview.token_view_html(["a", "b", "c"], {"L0H0": np.eye(2)})


def test_head_count_step_labels_tokens_with_the_model_it_was_given(tmp_path):
    from headlens import load_checkpoint, save_checkpoint

    path = save_checkpoint(make_gpt(n_ctx=32), tmp_path / "m.safetensors")
    given = load_checkpoint(path)
    given.to_str_tokens = lambda tokens: [f"t{int(i)}" for i in tokens[0]]  # e.g. a bridged model's own labels
    tokens, rows = lesson.head_count_step(path, "abc ab", model=given)
    assert tokens == ["t256", "t97", "t98", "t99", "t32", "t97", "t98"] and len(rows) == 6
