"""Long contexts: generated probes fill --seq-len (a byte model asked for 8,192 tokens used to get 95)."""

from __future__ import annotations

import warnings

import torch

import headlens
from headlens.probes.base import Probe, short_of
from headlens.probes.generated import draw_tokens, random_tokens, repeated_segments
from tests.conftest import make_gpt


def _min_gap(ids: torch.Tensor) -> int:
    order = torch.argsort(ids * len(ids) + torch.arange(len(ids)))  # by value, then position
    same = ids[order][1:] == ids[order][:-1]
    return int((order[1:] - order[:-1])[same].min())


def test_draws_fill_the_length_and_keep_repeats_far_apart():
    pool = torch.arange(100, 195)  # 95 ids, like the printable bytes
    ids = draw_tokens(pool, 5000, torch.Generator().manual_seed(0))
    assert len(ids) == 5000 and set(ids.tolist()) == set(pool.tolist())
    assert _min_gap(ids) >= 95 // 2 + 1
    short = draw_tokens(pool, 50, torch.Generator().manual_seed(0))
    assert len(set(short.tolist())) == 50  # without replacement while it can


def test_long_generated_probes_fill_seq_len_and_say_how():
    model = make_gpt(n_ctx=2048)
    rt = random_tokens(model, 2, 2048, torch.Generator().manual_seed(0))
    assert [len(p) for p in rt.prompts] == [2048, 2048] and "with replacement" in rt.settings["draw"]
    assert _min_gap(rt.prompts[0][1:]) >= 48
    rs = repeated_segments(model, 3, 2048, torch.Generator().manual_seed(0))
    assert [len(p) for p in rs.prompts] == [2048] * 3
    for p in rs.prompts:  # ... p + r + r: the last len(r) tokens repeat the len(r) before them
        body = p[1:]
        r = next(n for n in range(len(body) // 2, 0, -1) if torch.equal(body[-n:], body[-2 * n:-n]))
        assert r >= rs.settings["repeat_len"][0]
    short = repeated_segments(model, 2, 64, torch.Generator().manual_seed(0))  # unchanged short regime
    assert short.settings["draw"] == "without replacement"


def test_a_probe_that_cannot_reach_the_length_says_so_once():
    probe = Probe("stdlib", [torch.arange(10)], settings={"why_short": "the corpus is 10 bytes"})
    assert short_of(probe, 10) is None
    assert short_of(probe, 64) == "the stdlib probe reached 10 of the 64 tokens asked for (the corpus is 10 bytes)"
    model = make_gpt(n_ctx=512)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        df = headlens.classify(model, detectors=["previous_token"], n_prompts=2, seq_len=512, n_boot=10)
    assert not [w for w in caught if "tokens asked for" in str(w.message)]
    assert df.attrs["probes"]["random_tokens"]["body_len"] == 511


def test_a_length_beyond_the_context_is_built_at_n_ctx_and_says_so_once():
    model = make_gpt(n_ctx=64)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        df = headlens.classify(model, detectors=["previous_token"], n_prompts=2, seq_len=4096, n_boot=10)
    said = [str(w.message) for w in caught if "beyond the model's context" in str(w.message)]
    assert said == ["seq_len=4096 is beyond the model's context (n_ctx=64): probes were built at 64 tokens"]
    assert said[0] in df.attrs["warnings"] and df.attrs["probes"]["random_tokens"]["body_len"] == 63
