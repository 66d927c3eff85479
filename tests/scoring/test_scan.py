"""The scan engine: batch-composition invariance, padding, no leaked hooks, streaming memory."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from headlens.detectors import DETECTORS
from headlens.probes.base import Probe
from headlens.probes.generated import repeated_segments
from headlens.probes.text import text_prompts
from headlens.scoring.scan import scan
from headlens.testing import PatternModel, offset_pattern, uniform_pattern
from tests.conftest import make_gpt

PATTERN_DETECTORS = [d for d in DETECTORS.values() if d.kind in ("index", "mask") and not d.bidirectional_only]


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return make_gpt(seed=3)


@pytest.fixture(scope="module")
def uneven_probe(model):
    texts = ["def f(x): return [x, (x)]", "a", "import os", "{'k': [1, 2]} (", "aaaa bbbb aaaa bbbb", "x = y"]
    return text_prompts(model, texts)


def _all(stats):
    return torch.stack([s.sums for s in stats.values()]), torch.stack([s.counts for s in stats.values()])


def test_one_batch_equals_many_and_padding_changes_nothing(model, uneven_probe):
    ref_sums, ref_counts = _all(scan(model, uneven_probe, PATTERN_DETECTORS, batch_size=len(uneven_probe)))
    for bs in (1, 2, 4):
        sums, counts = _all(scan(model, uneven_probe, PATTERN_DETECTORS, batch_size=bs))
        torch.testing.assert_close(sums, ref_sums, atol=1e-6, rtol=0)
        assert torch.equal(counts, ref_counts)
    assert ref_counts.sum() > 0


@settings(max_examples=8, deadline=None)
@given(order=st.permutations(list(range(6))), bs=st.integers(1, 6))
def test_prompt_order_and_batch_size_do_not_matter(model, uneven_probe, order, bs):
    ref_sums, _ = _all(scan(model, uneven_probe, PATTERN_DETECTORS, batch_size=6))
    shuffled = Probe("prompts", [uneven_probe.prompts[i] for i in order],
                     {k: [v[i] for i in order] for k, v in uneven_probe.annotations.items()})
    sums, _ = _all(scan(model, shuffled, PATTERN_DETECTORS, batch_size=bs))
    torch.testing.assert_close(sums, ref_sums[:, order], atol=1e-6, rtol=0)


def test_bidirectional_padding_is_masked():
    model = PatternModel([[offset_pattern(1), uniform_pattern]], causal=False)
    probe = text_prompts(model, ["abcdef", "ab", "abcdefghij"])
    dets = [DETECTORS["next_token"], DETECTORS["previous_token"]]
    alone = [scan(model, Probe("p", [p]), dets) for p in probe.prompts]
    together = scan(model, probe, dets, batch_size=3)
    for name in ("next_token", "previous_token"):
        stacked = torch.cat([a[name].sums for a in alone])
        torch.testing.assert_close(together[name].sums, stacked, atol=1e-6, rtol=0)
    # the uniform head scores exactly the baseline per prompt: pads are invisible
    torch.testing.assert_close(together["next_token"].sums[:, 0, 1], together["next_token"].baseline,
                               atol=1e-6, rtol=0)


def test_hooks_never_leak_even_when_a_detector_raises(model):
    probe = repeated_segments(model, 4, 20, torch.Generator().manual_seed(0))
    scan(model, probe, PATTERN_DETECTORS, batch_size=2)
    assert model.active_hooks() == []
    bad = DETECTORS["induction"].__class__("boom", "mask", lambda b: 1 / 0, None, "raises")
    with pytest.raises(ZeroDivisionError):
        scan(model, probe, [bad], batch_size=2)
    assert model.active_hooks() == []


def test_the_hook_keeps_no_pattern(model):
    """Only (B, H, D) float64 leaves a hook; the (B, H, Q, K) pattern is not referenced afterwards."""
    import gc
    import weakref

    seen: list[weakref.ref] = []
    orig = model.transformer.h[0].attn.hook_pattern.forward

    def spy(x):
        seen.append(weakref.ref(x))
        return orig(x)

    model.transformer.h[0].attn.hook_pattern.forward = spy
    try:
        scan(model, repeated_segments(model, 4, 20, torch.Generator().manual_seed(0)), PATTERN_DETECTORS)
    finally:
        del model.transformer.h[0].attn.hook_pattern.forward
    gc.collect()
    assert seen and all(r() is None for r in seen)
