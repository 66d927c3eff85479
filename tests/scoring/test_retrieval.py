"""Retrieval heads: the needle probe, the top-1 engine and the detector on a planted head."""

from __future__ import annotations

import pytest
import torch

import headlens
from headlens.models.attention import AttentionSpec
from headlens.probes.haystack import lengths_for, needle_haystack
from headlens.scoring.top1 import top1_share
from headlens.testing import planted_model

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def planted():
    return planted_model()  # L0H0 previous token, L1H0 induction: a perfect retrieval head


@pytest.mark.parametrize("haystack", ["random", "stdlib"])
def test_needle_probe_points_copy_steps_at_the_needle(haystack):
    model = headlens.GPT(headlens.ModelConfig(n_layers=1, n_heads=1, d_model=8, n_ctx=512, d_vocab=257))
    probe = needle_haystack(model, 6, 256, torch.Generator().manual_seed(0), haystack=haystack)
    assert probe.settings["lengths"] == lengths_for(256, 16) == [64, 128, 256]
    assert [len(p) for p in probe.prompts] == [64, 128, 256] * 2
    for ids, nxt in zip(probe.prompts, probe.annotations["needle_next"], strict=True):
        q = (nxt >= 0).nonzero().flatten()
        assert len(q) == 15 and (q[1:] - q[:-1] == 1).all()  # 15 consecutive copy steps
        assert (ids[nxt[q]] == ids[q + 1]).all()  # the target holds the token the step predicts
        assert (nxt[q] < q[0]).all()  # ... in the inserted needle, before the copy
        needle = ids[q[0]: q[0] + 16]
        assert len(set(needle.tolist())) == 16
        if haystack == "random":  # each needle token occurs exactly twice: needle and copy
            assert all(int((ids == t).sum()) == 2 for t in needle)


def test_top1_share_equals_the_argmax_of_the_full_scores():
    g = torch.Generator().manual_seed(0)
    B, H, H_kv, T, d = 2, 4, 2, 37, 8
    q, k = torch.randn(B, H, T, d, generator=g), torch.randn(B, H_kv, T, d, generator=g)
    rows = torch.tensor([[3, 20, 36, -1], [0, 5, 17, 30]])
    valid = torch.ones(B, T, dtype=torch.bool)
    valid[1, 31:] = False
    for spec in (AttentionSpec("q", "k", "BHTD"), AttentionSpec("q", "k", "BHTD", scale=0.7, window=9, softcap=2.0),
                 AttentionSpec("q", "k", "BHTD", causal=False)):
        kv = k.repeat_interleave(2, dim=1)  # (B, H, T, d)
        s = (q @ kv.transpose(-2, -1)) * (spec.scale or d ** -0.5)  # (B, H, Q, K)
        if spec.softcap:
            s = spec.softcap * torch.tanh(s / spec.softcap)
        gap = torch.arange(T)[:, None] - torch.arange(T)[None, :]
        hidden = (gap < 0) if spec.causal else torch.zeros(T, T, dtype=torch.bool)
        if spec.window:
            hidden |= gap >= spec.window
        s = s.masked_fill(hidden | ~valid[:, None, None, :], float("-inf"))
        best = s.argmax(-1).gather(2, rows.clamp_min(0)[:, None].expand(B, H, -1))  # (B, H, R)
        # targets: head 0's top-1 key, and key 0; each head scores 1 exactly where its own top-1 is there
        targets = torch.stack([best[:, 0], torch.zeros_like(best[:, 0])], -1)  # (B, R, 2)
        got = top1_share(q, k, spec, rows, targets, valid, block=5)  # (B, H, R, 2), blocks smaller than T
        want = (best[..., None] == targets[:, None]).double()
        real = (rows >= 0)[:, None, :, None].expand_as(got)
        assert torch.equal(got[real], want[real])
        assert (got[:, 0, :, 0][rows >= 0] == 1).all()


def test_ties_are_split_so_uniform_attention_scores_its_baseline():
    q, k = torch.zeros(1, 1, 6, 2), torch.randn(1, 1, 6, 2)  # every score 0: all visible keys tie
    rows = torch.tensor([[1, 3, 5]])
    share = top1_share(q, k, AttentionSpec("q", "k", "BHTD"), rows, torch.tensor([[[0], [2], [5]]]), block=4)
    assert share.flatten().tolist() == [1 / 2, 1 / 4, 1 / 6]


def test_planted_induction_head_is_the_one_retrieval_head(planted):
    df = headlens.classify(planted, detectors=["retrieval"], n_prompts=12, seq_len=32)
    score = {(r.layer, r.head): r.score for r in df.itertuples()}
    assert score.pop((1, 0)) == 1.0 and score.pop((0, 0)) == 0.0  # the previous-token head looks elsewhere
    base = df.baseline.iloc[0]
    assert all(abs(v - base) < 1e-9 for v in score.values())  # uniform heads: ties split, exactly the baseline
    assert df[df.label][["layer", "head"]].values.tolist() == [[1, 0]]
    assert 1 / 32 < df.baseline.iloc[0] < 1 / 16  # 1 / visible keys at copy rows 17..30 of 32
    assert df.n_positions.iloc[0] == 12 * df.attrs["probes"]["needle"]["copy_steps_per_prompt"]
    assert df.attrs["retrieval_wu_2024"]["heads"] == ["L1H0"]
    assert "needle" in df.attrs["probes"]["needle"]["built"]


def test_dense_and_sparse_top1_agree(planted):
    kw = dict(detectors=["retrieval", "induction"], n_prompts=12, seq_len=32)
    dense = headlens.classify(planted, scan_path="dense", **kw)
    sparse = headlens.classify(planted, scan_path="sparse", **kw)
    assert dense.attrs["scan_path"] == "dense" and sparse.attrs["scan_path"] == "sparse"
    torch.testing.assert_close(torch.tensor(dense.score.values), torch.tensor(sparse.score.values),
                               rtol=0, atol=1e-6)


def test_stdlib_haystack_and_plain_texts(planted):
    byte_model = headlens.GPT(headlens.ModelConfig(n_layers=1, n_heads=2, d_model=8, n_ctx=128, d_vocab=257))
    df = headlens.classify(byte_model, detectors=["retrieval", "previous_token"], n_prompts=10, seq_len=96,
                           corpus="stdlib")
    assert df.attrs["probes"]["needle"]["haystack"] == "stdlib" and "stdlib" in df.attrs["probes"]
    with pytest.raises(headlens.ProbeError, match="no target positions"):
        headlens.classify(planted, detectors=["retrieval"], prompts=["abcabc", "hello"])
