"""Logits without the vocabulary blow-up: the logits at the read positions equal the full forward's
there, and every metric read from them, in chunks of prompts and positions, equals the plain unchunked expression
written out here (log_softmax over the whole ``(B, T, V)``), to 1e-6; on the native GPT and on a Gemma 3 bridge."""

from __future__ import annotations

import dataclasses
import warnings

import pytest
import torch
import torch.nn.functional as F
from hf_families import build

import headlens.interventions.logits as lg
import headlens.interventions.runners as runners
from headlens.interventions.logits import logits_at
from headlens.interventions.metrics import get_metric, make_task
from headlens.interventions.sweep import sweep
from tests.conftest import make_gpt

TOL = 1e-6


@pytest.fixture(scope="module")
def gemma3(tmp_path_factory):
    import headlens

    path = build("gemma3", tmp_path_factory.mktemp("logits") / "gemma3")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return headlens.load(f"hf:{path}")


@pytest.fixture
def tiny_chunks(monkeypatch):
    """Chunks of one position and one prompt: every chunk boundary is crossed."""
    monkeypatch.setattr(lg, "CHUNK_BYTES", 1)
    monkeypatch.setattr(lg, "LOGITS_BUDGET", 1)
    assert len(list(lg.position_chunks(2, 3, 10))) == 3 and lg.logit_rows(make_gpt(0, n_ctx=8), 1) == 1


def _plain(metric: str, logits: torch.Tensor, task, clean: torch.Tensor) -> torch.Tensor:
    """Per-prompt value from full ``(B, T, V)`` logits, written without the code under test."""
    nxt = task.tokens[:, 1:]  # (B, T-1)
    logp = F.log_softmax(logits.float(), dim=-1)  # (B, T, V)
    if metric in ("repeated_loss", "first_half_loss", "lm_loss"):
        per = F.pad(-logp[:, :-1].gather(-1, nxt[..., None]).squeeze(-1), (0, 1))  # (B, T)
    elif metric == "kl":
        logq = F.log_softmax(clean.float(), dim=-1)
        per = (logq.exp() * (logq - logp)).sum(-1)
    elif metric == "bracket_accuracy":
        cand = task.candidates
        hit = logits[:, :-1, cand].argmax(-1) == (nxt[..., None] == cand).float().argmax(-1)
        per = F.pad(hit.float(), (0, 1))
    else:  # logit_diff
        per = torch.stack([logits[b, :, io] - logits[b, :, s] for b, (io, s) in enumerate(task.answers.tolist())])
    w = task.positions.float()
    return (per * w).sum(1) / w.sum(1).clamp(min=1)


@pytest.mark.parametrize("backend", ["native", "gemma3"])
def test_logits_at_read_positions_equal_the_full_forward(backend, gemma3, tiny_chunks):
    model = make_gpt(0, n_ctx=32) if backend == "native" else gemma3
    tokens = make_task(model, "repeated_loss", n_prompts=3, seed=1).tokens
    cols = torch.tensor([2, 5, tokens.shape[1] - 1])
    with torch.no_grad():
        full = model(tokens)  # (B, T, V)
        assert torch.allclose(logits_at(model, tokens, cols), full[:, cols], atol=TOL, rtol=0)
    assert not model.active_hooks()


@pytest.mark.parametrize("metric", ["repeated_loss", "first_half_loss", "kl", "bracket_accuracy", "logit_diff"])
def test_metrics_at_columns_in_chunks_equal_the_plain_expression(metric, gemma3, tiny_chunks):
    model = make_gpt(0, n_ctx=32, init_range=0.2) if metric == "bracket_accuracy" else gemma3
    task = make_task(model, "repeated_loss" if metric == "logit_diff" else metric, n_prompts=4, seed=0)
    if metric == "logit_diff":  # IOI's shape (answers read at one position) on a vocabulary without names
        end = F.one_hot(torch.tensor([9, 9, 20, 30]), task.tokens.shape[1]).bool()  # (B, T)
        task = dataclasses.replace(task, positions=end, answers=torch.tensor([[5, 7], [8, 2], [40, 41], [3, 99]]))
    with torch.no_grad():
        full = model(task.tokens, attention_mask=task.attention_mask)  # (B, T, V)
        clean = full.flip(0)  # another distribution per position for kl
        want = _plain(metric, full, task, clean)
        cols = lg.read_columns(task.positions)
        narrowed = task.at(cols)
        got = get_metric(metric)(full if cols is None else full[:, cols], narrowed,
                                 clean if cols is None else clean[:, cols])
    assert cols is None or len(cols) < task.tokens.shape[1]  # the repeated and IOI probes read fewer positions
    assert torch.allclose(got, want.double(), atol=TOL, rtol=0)


def test_sweep_on_a_bridge_reads_chunks_and_matches_plain_losses(gemma3, monkeypatch):
    """The sweep's clean column is the plain mean loss; chunking changes no number of the table."""
    kw = dict(groups=["L0H1", "L1H0,L1H3"], method="mean", metrics=["repeated_loss", "kl"], n_prompts=4,
              n_control=1, n_boot=50, attribution=False)
    whole = sweep(gemma3, **kw)
    seen = []
    forward = runners.logit_chunks
    monkeypatch.setattr(runners, "logit_chunks", lambda *a: seen.append(a[2]) or forward(*a))
    monkeypatch.setattr(lg, "CHUNK_BYTES", 1)
    monkeypatch.setattr(runners, "logit_rows", lambda model, n_cols: 1)
    chunked = sweep(gemma3, **kw)
    assert seen and set(seen) == {1}  # one prompt per forward
    import pandas as pd

    pd.testing.assert_frame_equal(whole, chunked, check_exact=False, rtol=0, atol=TOL)
    task = make_task(gemma3, "repeated_loss", n_prompts=4, seed=0)
    with torch.no_grad():
        plain = _plain("repeated_loss", gemma3(task.tokens), task, None).mean()
    row = whole[whole.metric == "repeated_loss"].iloc[0]
    assert abs(row["clean"] - float(plain)) < TOL


def test_attribution_estimates_a_prompt_at_a_time_equal_one_plain_backward(gemma3, tiny_chunks):
    """Zero-ablation attribution patching: the chunked estimates equal ``-z . d(loss)/dz`` from one plain backward
    over full logits, written here."""
    from headlens.interventions.ablation import Replacement
    from headlens.interventions.attribution import attribution_patching

    task = make_task(gemma3, "repeated_loss", n_prompts=3, seed=2)
    L = gemma3.n_layers
    got = attribution_patching(gemma3, task, "repeated_loss", Replacement.build(gemma3, range(L), "zero"))
    zs: dict[int, torch.Tensor] = {}
    leaves: dict[int, torch.Tensor] = {}

    def leaf(z, hook):  # d(loss)/dz with every path through later layers kept: a zero added at z
        layer = int(hook.name.split(".")[1])
        zs[layer], leaves[layer] = z.detach(), torch.zeros_like(z, requires_grad=True)
        return z + leaves[layer]

    with torch.enable_grad(), gemma3.hooks([(f"blocks.{layer}.attn.hook_z", leaf) for layer in range(L)]):
        loss = _plain("repeated_loss", gemma3(task.tokens), task, None).sum()
        grads = torch.autograd.grad(loss, [leaves[layer] for layer in range(L)])
    want = torch.stack([(-zs[layer] * g).sum((1, 3)) for layer, g in enumerate(grads)], 1)  # (B, L, H)
    assert torch.allclose(got, want.double(), atol=1e-5, rtol=1e-4)
