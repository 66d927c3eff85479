"""Long contexts: sparse targets and the LSE scan agree with the dense reference to 1e-6.
So do targets given as a predicate over (query, key), evaluated block by block."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from headlens.detectors import DETECTORS, get_detector
from headlens.detectors.base import (
    lower,
    mask_to_targets,
    n_targets,
    predicate_counts,
    predicate_mask,
    predicate_targets,
    targets_to_mask,
)
from headlens.models.attention import AttentionSpec
from headlens.probes.base import ProbeBatch
from headlens.probes.generated import random_tokens, repeated_segments
from headlens.probes.text import stdlib_windows, text_prompts
from headlens.scoring.engine import choose_path
from headlens.scoring.lse import PackedTargets, PredicateTargets, target_mass
from headlens.scoring.scan import _form, _reduce_pattern, _targets, scan
from tests.conftest import make_gpt

PATTERN = [d for d in DETECTORS.values() if d.kind not in ("weights", "annotated")]  # annotated: headlens.scoring.annotated
VARIANTS = [get_detector("sink(s=2)"), get_detector("streaming(s=2,w=5)")]
RULES = [d for d in [*PATTERN, *VARIANTS] if d.predicate is not None]


def as_rule(det):
    """The same detector defined by its predicate alone (index lists built from it when asked)."""
    return dataclasses.replace(det, name=f"{det.name}~rule", targets=None)


def test_every_position_detector_has_a_rule():
    assert {d.name for d in RULES} >= {"previous_token", "next_token", "current_token", "first_token",
                                       "duplicate_token", "induction", "sink", "streaming"}
    assert as_rule(DETECTORS["previous_token"]).windowed  # built from the rule, a row window at a time


@pytest.fixture(scope="module")
def model():
    return make_gpt(seed=5, n_ctx=160)


def _batch(x: torch.Tensor, lengths: list[int], causal: bool, special_id: int = 0) -> ProbeBatch:
    T = x.shape[1]
    valid = torch.arange(T)[None] < torch.tensor(lengths)[:, None]
    return ProbeBatch(x, torch.tensor(lengths), valid, (x == special_id) | ~valid, causal)


def _old_duplicate(b: ProbeBatch) -> torch.Tensor:  # the pre-issue-13 (B, Q, K) definition
    x = b.tokens
    same = (x[:, :, None] == x[:, None, :]) & ~torch.eye(x.shape[1], dtype=torch.bool)[None] & ~b.special[:, None, :]
    same &= b.query_ok[:, :, None] & b.valid[:, None, :]
    return same & lower(x.shape[1])[None] if b.causal else same


def _old_induction(b: ProbeBatch) -> torch.Tensor:
    x = b.tokens
    prev = torch.cat([torch.full_like(x[:, :1], -1), x[:, :-1]], dim=1)
    prev_special = torch.cat([torch.ones_like(b.special[:, :1]), b.special[:, :-1]], dim=1)
    hit = (x[:, :, None] == prev[:, None, :]) & ~prev_special[:, None, :] & lower(x.shape[1], diagonal=-1)[None]
    hit &= b.query_ok[:, :, None] & b.valid[:, None, :]
    return hit & lower(x.shape[1])[None] if b.causal else hit


@pytest.mark.parametrize("causal", [True, False])
def test_set_targets_equal_the_old_masks_without_building_them(causal):
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, 6, (3, 40), generator=g)  # few values: many repeats, specials (0) inside
    b = _batch(x, [40, 17, 3], causal)
    for det, old in (("duplicate_token", _old_duplicate), ("induction", _old_induction)):
        idx = DETECTORS[det].targets(b)
        assert torch.equal(targets_to_mask(idx, 40), old(b)), det
        kept = idx[idx >= 0]
        assert len(kept) and (idx >= -1).all()
        windows = [DETECTORS[det].targets(b.window(r0, min(40, r0 + 7))) for r0 in range(0, 40, 7)]
        assert torch.equal(torch.cat([targets_to_mask(w, 40) for w in windows], 1), old(b)), det
    m = _old_induction(b)
    assert torch.equal(targets_to_mask(mask_to_targets(m), 40), m)


@pytest.mark.parametrize("causal", [True, False])
def test_predicates_equal_the_index_lists(causal):
    """Every rule gives the detector's own index lists, counts and row windows (padding, specials inside)."""
    g = torch.Generator().manual_seed(3)
    x = torch.randint(0, 6, (3, 90), generator=g)
    b = _batch(x, [90, 37, 3], causal)
    for det in RULES:
        ref = targets_to_mask(det.targets(b), 90)
        assert torch.equal(predicate_mask(det.predicate, b, 0, 90, 0, 90), ref), det.name
        assert torch.equal(predicate_mask(det.predicate, b, 20, 41, 7, 60), ref[:, 20:41, 7:60]), det.name
        assert torch.equal(targets_to_mask(predicate_targets(det.predicate, b), 90), ref), det.name
        rows = [as_rule(det).targets(b.window(r0, min(90, r0 + 13))) for r0 in range(0, 90, 13)]
        assert torch.equal(torch.cat([targets_to_mask(w, 90) for w in rows], 1), ref), det.name
        assert torch.equal(predicate_counts(det.predicate, b), n_targets(det.targets(b))), det.name
    assert int(targets_to_mask(DETECTORS["duplicate_token"].targets(b), 90).sum()) > 500  # many targets


def test_the_scan_takes_the_cheaper_form(monkeypatch):
    g = torch.Generator().manual_seed(4)
    b = _batch(torch.randint(1, 4, (1, 200), generator=g), [200], True)
    dup = DETECTORS["duplicate_token"]
    n = int(n_targets(dup.targets(b)).sum())  # ~200^2 / 6 pairs
    monkeypatch.setattr("headlens.scoring.scan.INDEX_MAX", n)
    assert isinstance(_form(dup, b), PackedTargets)
    monkeypatch.setattr("headlens.scoring.scan.INDEX_MAX", n - 1)
    assert isinstance(_form(dup, b), PredicateTargets)
    monkeypatch.setattr("headlens.scoring.scan.PackedTargets.pack", None)  # a rule never lists its pairs
    assert isinstance(_form(dup, b), PredicateTargets)
    monkeypatch.setattr("headlens.scoring.scan.INDEX_MAX", 0)
    with pytest.raises(TypeError):  # one target a row: always the list
        _form(DETECTORS["previous_token"], b)


def _dense_reference(q, k, spec, key_valid):
    """The pattern the spec implies, built the O(T^2) way: (B, H, Q, K)."""
    _, H, T, d = q.shape
    k = k.repeat_interleave(H // k.shape[1], dim=1)
    s = (q @ k.transpose(-2, -1)) * (spec.scale or 1 / math.sqrt(d))
    if spec.softcap:
        s = spec.softcap * torch.tanh(s / spec.softcap)
    gap = torch.arange(T)[:, None] - torch.arange(T)[None, :]
    hide = torch.zeros(T, T, dtype=torch.bool)
    if spec.causal:
        hide |= gap < 0
    if spec.window:
        hide |= gap >= spec.window
    hide = hide[None, None] | ~key_valid[:, None, None, :]
    s = s.masked_fill(hide, float("-inf"))
    if spec.sinks is None:
        return s.softmax(-1)
    sink = torch.tensor(spec.sinks).view(1, H, 1, 1).expand(s.shape[0], H, T, 1)  # one extra logit per row
    return torch.cat([s, sink], -1).double().softmax(-1)[..., :-1]  # GPT-OSS: the sink's share is dropped


@pytest.mark.parametrize("causal,window,softcap,kv,sinks", [
    (True, None, None, 4, None), (False, None, None, 4, None), (True, 5, None, 2, None), (True, None, 3.0, 1, None),
    (False, 7, 2.0, 2, None), (True, 5, None, 2, (0.5, -1.0, 2.0, 0.0))])
def test_target_mass_equals_the_dense_pattern(causal, window, softcap, kv, sinks):
    """Causal/bidirectional, padding, GQA (kv < 4 heads), sliding window, soft-capping, sinks; tiny blocks."""
    g = torch.Generator().manual_seed(2)
    B, H, T, d = 2, 4, 23, 8
    q, k = torch.randn(B, H, T, d, generator=g) * 2, torch.randn(B, kv, T, d, generator=g) * 2
    x = torch.randint(1, 5, (B, T), generator=g)
    b = _batch(x, [T, 15], causal)
    packed, counts, _ = _targets(b, RULES)
    rules = [PredicateTargets(d.predicate, b, predicate_counts(d.predicate, b)) for d in RULES]
    assert [int(r.n.sum()) for r in rules] == [int(p.counts().sum()) for p in packed]
    per_row = counts.clamp_min(1)[:, None, :]  # (B, 1, D): scores are mass per counted row
    spec = AttentionSpec("q", "k", "BHTD", 0.3, causal, window, softcap, sinks)
    pattern = _dense_reference(q, k, spec, b.valid)
    dense = _reduce_pattern(pattern, packed) / per_row
    torch.testing.assert_close(_reduce_pattern(pattern, rules) / per_row, dense, atol=1e-6, rtol=0)
    assert dense[..., [d.name for d in RULES].index("duplicate_token")].min() > 0.01  # the test sees real mass
    for budget in (1, 10_000, 10**9):  # one row per block, a few rows, everything at once
        sparse = target_mass(q, k, spec, packed, b.valid, budget=budget) / per_row
        torch.testing.assert_close(sparse, dense, atol=1e-6, rtol=0)
        by_rule = target_mass(q, k, spec, [*rules, *packed], b.valid, budget=budget)  # both forms in one call
        torch.testing.assert_close(by_rule / per_row.repeat(1, 1, 2), torch.cat([dense, dense], -1), atol=1e-6, rtol=0)


def _scan_both(model, probe, dets, **kw):
    info_d, info_s = {}, {}
    dense = scan(model, probe, dets, path="dense", info=info_d, **kw)
    sparse = scan(model, probe, dets, path="sparse", info=info_s, **kw)
    assert info_d["scan_path"] == "dense" and info_s["scan_path"] == "sparse"
    return dense, sparse


@pytest.mark.parametrize("index_max", [2**19, 0])  # lists where short / every set detector by its rule
def test_native_sparse_scan_equals_dense_on_every_detector_with_padding(model, monkeypatch, index_max):
    monkeypatch.setattr("headlens.scoring.scan.WINDOW_BYTES", 20_000)  # set detectors asked for a few rows at a time
    monkeypatch.setattr("headlens.scoring.lse.BLOCK_BYTES", 4 * 3 * 4 * 160 * 9)  # blocks of ~9 query rows
    monkeypatch.setattr("headlens.scoring.scan.INDEX_MAX", index_max)
    texts = ["def f(x): return [x, (x)]", "a", "import os", "{'k': [1, 2]} (", "aaaa bbbb aaaa bbbb", "x = y"]
    dets = [d for d in [*PATTERN, *VARIANTS] if not d.bidirectional_only]
    dets += [as_rule(d) for d in RULES if not d.bidirectional_only]  # the rule alone: lists, or rule when over
    for probe in (text_prompts(model, texts),
                  repeated_segments(model, 3, 150, torch.Generator().manual_seed(0)),
                  stdlib_windows(model, 2, 120, torch.Generator().manual_seed(0))):
        dense, sparse = _scan_both(model, probe, dets, batch_size=3)
        for name in dense:  # per-prompt scores (mass per counted row) agree to 1e-6
            n = dense[name].counts.clamp_min(1)[:, None, None]
            torch.testing.assert_close(sparse[name].sums / n, dense[name].sums / n, atol=1e-6, rtol=0)
            assert torch.equal(sparse[name].counts, dense[name].counts)
            if name.endswith("~rule"):  # the rule and the list give the same scores on both paths
                base = name.removesuffix("~rule")
                torch.testing.assert_close(sparse[name].sums / n, dense[base].sums / n, atol=1e-6, rtol=0)
                assert torch.equal(sparse[name].counts, dense[base].counts)
                torch.testing.assert_close(sparse[name].baseline, dense[base].baseline, atol=1e-9, rtol=0)
        assert any(float(s.counts.sum()) > 0 for s in dense.values())


def test_sparse_scan_never_asks_for_the_pattern(model):
    probe = random_tokens(model, 2, 64, torch.Generator().manual_seed(0))
    seen = []
    hp = model.transformer.h[0].attn.hook_pattern
    orig = hp.forward
    hp.forward = lambda x: seen.append(x.shape) or orig(x)
    try:
        scan(model, probe, [DETECTORS["previous_token"]], path="sparse")
    finally:
        del hp.forward
    assert seen == [] and model.active_hooks() == []


def test_auto_path_picks_dense_for_short_and_sparse_for_long(model):
    assert choose_path("auto", model, (4, 64)) == "dense"
    assert choose_path("auto", model, (1, 4096)) == "sparse"
    from headlens.testing import PatternModel, uniform_pattern
    assert choose_path("auto", PatternModel([[uniform_pattern]]), (1, 4096)) == "dense"  # no q/k hooks


def test_classify_records_the_path_and_old_target_forms_still_work(model):
    import headlens
    from headlens.detectors.base import Detector
    from headlens.errors import HeadlensError

    kw = dict(detectors=["previous_token", "induction"], n_prompts=4, seq_len=48, n_boot=20)
    dense = headlens.classify(model, scan_path="dense", **kw)
    sparse = headlens.classify(model, scan_path="sparse", **kw)
    assert dense.attrs["scan_path"] == "dense" and sparse.attrs["scan_path"] == "sparse"
    assert sparse.attrs["probes"]["repeated_segments"]["scan_path"] == "sparse"
    assert (dense.score - sparse.score).abs().max() <= 1e-6
    with pytest.raises(HeadlensError, match="unknown scan path 'fast'"):
        headlens.classify(model, scan_path="fast", **kw)
    probe = random_tokens(model, 3, 20, torch.Generator().manual_seed(0))
    new = DETECTORS["previous_token"]
    as_index = Detector("prev_2d", "index", lambda b: new.targets(b)[..., 0], None, "(B, Q) form")
    as_mask = Detector("prev_mask", "mask", lambda b: targets_to_mask(new.targets(b), b.tokens.shape[1]), None, "")
    out = scan(model, probe, [new, as_index, as_mask], path="sparse")
    for name in ("prev_2d", "prev_mask"):
        torch.testing.assert_close(out[name].sums, out["previous_token"].sums, atol=1e-6, rtol=0)
