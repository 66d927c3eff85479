"""Metrics: probes have the structure they claim, per-prompt values have known answers."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from conftest import make_gpt

from headlens.errors import ProbeError
from headlens.interventions.ablation import AblationError
from headlens.interventions.metrics import (
    METRICS,
    bootstrap_ci,
    bracket_ids,
    bracket_task,
    get_metric,
    make_task,
    prompts_task,
    repeated_task,
)
from headlens.models.config import ModelConfig
from headlens.models.gpt import GPT
from headlens.models.tokenizer import Tokenizer

torch.set_num_threads(1)  # tiny models: one thread is fastest on a shared 2-core machine


def char_model(alphabet: str = "()[]{}<>xyz", n_ctx: int = 64) -> GPT:
    tok = Tokenizer.char_level(alphabet)
    return GPT(ModelConfig(n_layers=1, n_heads=2, d_model=8, n_ctx=n_ctx, d_vocab=tok.d_vocab), tokenizer=tok).eval()


def oracle_logits(task, d_vocab: int, big: float = 50.0) -> torch.Tensor:
    """Logits that put everything on the true next token."""
    B, T = task.tokens.shape
    logits = torch.zeros(B, T, d_vocab)
    logits[:, :-1].scatter_(-1, task.tokens[:, 1:, None], big)
    return logits


def test_repeated_probe_structure():
    model = make_gpt(0)
    task = repeated_task(model, n_prompts=5, seg_len=10, seed=1)
    toks = task.tokens
    assert toks.shape == (5, 21) and bool((toks[:, 0] == model.bos_token_id).all())
    assert torch.equal(toks[:, 1:11], toks[:, 11:])
    assert all(len(set(r[1:11].tolist())) == 10 for r in toks)  # drawn without replacement
    assert bool(((toks[:, 1:] >= 33) & (toks[:, 1:] < 127)).all())  # printable ASCII for byte models
    assert task.positions.sum(1).tolist() == [9] * 5  # r[1:] of the copy
    assert torch.equal(repeated_task(model, 5, 10, seed=1).tokens, toks)


def test_repeated_and_first_half_losses_known_answers():
    model = make_gpt(0)
    task = repeated_task(model, n_prompts=4, seg_len=8)
    V = model.cfg.d_vocab
    for name in ("repeated_loss", "first_half_loss"):
        t = make_task(model, name, n_prompts=4)
        uniform = torch.zeros(4, t.tokens.shape[1], V)
        torch.testing.assert_close(METRICS[name](uniform, t),
                                   torch.full((4,), math.log(V), dtype=torch.float64), rtol=1e-6, atol=1e-6)
    assert float(METRICS["repeated_loss"](oracle_logits(task, V), task).max()) < 1e-6
    first = make_task(model, "first_half_loss", n_prompts=4)
    seg = (first.tokens.shape[1] - 1) // 2
    assert first.positions[0].nonzero().flatten().tolist() == list(range(seg))


def test_bracket_probe_is_balanced_and_scores_closers():
    model = char_model()
    pairs, filler = bracket_ids(model)
    assert len(pairs) == 4 and len(filler) == 3
    task = bracket_task(model, n_prompts=6, length=40, seed=2)
    closer_of = {o: c for o, c in pairs}
    deepest = []
    for row, pos in zip(task.tokens.tolist(), task.positions.tolist(), strict=True):
        stack, depth = [], 0
        for t, tok in enumerate(row[1:], start=1):
            if tok in closer_of:
                stack.append(closer_of[tok])
                depth = max(depth, len(stack))
            elif tok in closer_of.values():
                assert stack.pop() == tok  # each closer matches the innermost opener
            assert pos[t - 1] == (tok in closer_of.values())
        assert not stack  # balanced
        deepest.append(depth)
    assert max(deepest) <= 8 and max(deepest) >= 3  # max_depth=8 holds, and the strings do nest
    shallow = bracket_task(model, n_prompts=6, length=40, seed=2, max_depth=2)
    for row in shallow.tokens.tolist():  # the depth cap binds: never three openers unclosed
        level = 0
        for tok in row[1:]:
            level += (tok in closer_of) - (tok in closer_of.values())
            assert 0 <= level <= 2
    acc = METRICS["bracket_accuracy"]
    assert acc(oracle_logits(task, model.cfg.d_vocab), task).tolist() == [1.0] * 6
    # constant logits: argmax among closers is the first closer, so accuracy = share of ')' closers
    share = [(r[1:] == pairs[0][1]).sum() / task.positions[i].sum() for i, r in enumerate(task.tokens)]
    torch.testing.assert_close(acc(torch.zeros(6, 41, model.cfg.d_vocab), task), torch.stack(share).double())


def test_bracket_probe_on_byte_model_and_errors():
    task = bracket_task(make_gpt(0), n_prompts=2, length=30)
    assert task.candidates.tolist() == [ord(c) for c in ")]}>"]
    with pytest.raises(ProbeError, match="two bracket pairs"):
        bracket_task(char_model("abc()"))


def test_lm_loss_ignores_padding():
    model = make_gpt(0)
    prompts = ["def f(x):\n    return x", "import os"]
    task = prompts_task(model, prompts)
    assert task.tokens.shape == (2, 23) and task.attention_mask[1].sum() == 10
    loss = METRICS["lm_loss"](model(task.tokens), task)
    alone = prompts_task(model, prompts[1:])
    torch.testing.assert_close(loss[1], METRICS["lm_loss"](model(alone.tokens), alone)[0])
    assert make_task(model, "lm_loss", n_prompts=3).n_prompts == 3  # stdlib snippets by default
    with pytest.raises(ProbeError, match="needs prompts"):
        make_task(char_model(), "lm_loss")
    with pytest.raises(ProbeError, match="no prompts"):
        prompts_task(model, ["  ", ""])


def test_kl_known_answers():
    model = make_gpt(0)
    task = make_task(model, "kl", n_prompts=3)
    clean = torch.randn(3, task.tokens.shape[1], 257)
    kl = METRICS["kl"]
    assert kl(clean, task, clean).abs().max() < 1e-6
    p, q = torch.log_softmax(clean, -1), torch.log_softmax(clean * 0.5, -1)
    manual = (p.exp() * (p - q)).sum(-1)[task.positions].view(3, -1).mean(1)
    torch.testing.assert_close(kl(clean * 0.5, task, clean), manual.double(), rtol=1e-5, atol=1e-6)
    with pytest.raises(AblationError):
        kl(clean, task)


def test_unknown_metric():
    with pytest.raises(AblationError, match="unknown metric 'loss'"):
        get_metric("loss")


def test_bootstrap_ci():
    v = np.random.default_rng(0).normal(1.0, 0.1, size=40)
    lo, hi = bootstrap_ci(v, seed=1)
    assert lo < v.mean() < hi and hi - lo < 0.1
    assert bootstrap_ci(np.full(10, 2.0)) == (2.0, 2.0)
    assert all(math.isnan(x) for x in bootstrap_ci(np.ones(1)))


def test_headless_encoder_refused():
    from types import SimpleNamespace

    encoder = SimpleNamespace(output_kind="hidden", name="minilm", is_causal=False)
    for name in METRICS:
        with pytest.raises(ProbeError, match="no output head"):
            make_task(encoder, name, prompts=["a b c"])
