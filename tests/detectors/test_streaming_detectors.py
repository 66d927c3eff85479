"""Long contexts: sink and streaming heads (StreamingLLM, DuoAttention), known answers and settings."""

from __future__ import annotations

import pytest
import torch

import headlens
from headlens.detectors import DETECTORS, get_detector, split_names
from headlens.detectors.base import targets_to_mask
from headlens.errors import DetectorError
from headlens.probes.base import ProbeBatch
from headlens.probes.generated import random_tokens
from headlens.scoring.scan import scan
from headlens.testing import PatternModel, offset_pattern, uniform_pattern


def _first(n: int):
    def fn(tokens, valid):
        B, T = tokens.shape
        p = torch.zeros(B, T, T)
        p[:, :, :n] = 1.0
        return p

    return fn


def test_targets_by_hand():
    x = torch.arange(1, 13)[None]  # 12 positions, no specials
    b = ProbeBatch(x, torch.tensor([12]), torch.ones(1, 12, dtype=torch.bool), torch.zeros(1, 12, dtype=torch.bool),
                   causal=True)
    sink = targets_to_mask(get_detector("sink(s=2)").targets(b), 12)[0]
    assert sink[:2].sum() == 0 and sink[2:, :2].all() and sink[:, 2:].sum() == 0
    st = targets_to_mask(get_detector("streaming(s=2,w=3)").targets(b), 12)[0]
    assert st[:5].sum() == 0  # rows q < s + w see nothing but targets: not counted
    assert st[7].nonzero().reshape(-1).tolist() == [0, 1, 5, 6, 7]
    windows = [get_detector("streaming(s=2,w=3)").targets(b.window(r, r + 5)) for r in (0, 5, 10)]
    assert torch.equal(torch.cat([targets_to_mask(w, 12)[0] for w in windows])[:12], st)


def test_known_answers_on_hand_built_patterns():
    model = PatternModel([[_first(4), offset_pattern(-1), _first(1), uniform_pattern]], causal=True, n_ctx=160)
    probe = random_tokens(model, 3, 150, torch.Generator().manual_seed(0))
    out = scan(model, probe, [DETECTORS["sink"], DETECTORS["streaming"], get_detector("streaming(s=1,w=8)")])
    score = {n: (s.sums.sum(0) / s.counts.sum())[0] for n, s in out.items()}
    base = {n: float(s.baseline.sum() / s.counts.sum()) for n, s in out.items()}
    assert score["sink"][0] == pytest.approx(1.0) and score["sink"][2] == pytest.approx(1.0)
    rows = float(out["sink"].counts.sum())  # the previous-token head hits a sink only at q = 4, in each prompt
    assert score["sink"][1] == pytest.approx(len(probe) / rows)
    for name in ("streaming", "streaming(s=1,w=8)"):
        assert score[name][1:3].tolist() == pytest.approx([1.0, 1.0])  # previous token, first token: inside
        assert score[name][3] == pytest.approx(base[name])  # uniform == baseline
    assert score["streaming"][0] == pytest.approx(1.0)  # four sinks: all of the first-4 head's mass
    assert 0.25 < score["streaming(s=1,w=8)"][0] < 0.26  # one sink: a quarter (more at q = 9, 10)


def test_settings_parse_and_fail_with_one_line():
    assert get_detector("streaming(s=16, w=256)").params == {"s": 16, "w": 256}
    assert get_detector("streaming").name == "streaming" and get_detector("streaming(w=64)").name == "streaming"
    assert split_names("induction,streaming(s=1,w=8)") == ["induction", "streaming(s=1,w=8)"]
    for bad, msg in (("streaming(x=1)", "bad setting 'x=1'"), ("streaming(w=abc)", "bad value 'abc'"),
                     ("previous_token(s=1)", "has no settings"), ("streaming(w=0)", "w >= 1")):
        with pytest.raises(DetectorError, match=msg):
            get_detector(bad)


def test_classify_with_a_variant_records_it():
    from tests.conftest import make_gpt

    df = headlens.classify(make_gpt(n_ctx=128), detectors="sink(s=4),streaming(s=2,w=16)", n_prompts=10,
                           seq_len=100, n_boot=50)
    assert set(df.detector) == {"sink", "streaming(s=2,w=16)"}
    assert df.attrs["thresholds"]["streaming(s=2,w=16)"] == df.attrs["thresholds"]["sink"]


def test_a_variant_takes_its_base_detectors_threshold_unless_named():
    from headlens.scoring.thresholds import thresholds as _thresholds

    variant = get_detector("streaming(w=128)")
    assert _thresholds({"streaming": 0.9}, (), [variant])[variant.name] == 0.9
    assert _thresholds({"streaming": 0.9, variant.name: 0.7}, (), [variant])[variant.name] == 0.7
    assert _thresholds(None, (), [variant])[variant.name] == 0.4
