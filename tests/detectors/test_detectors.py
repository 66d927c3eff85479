"""Known answers for every detector: hand-built patterns with exact scores (HEAD_SCORES.md)."""

from __future__ import annotations

import pytest
import torch

from headlens.detectors import DETECTORS, get_detector
from headlens.detectors.base import targets_to_mask
from headlens.detectors.ov_copying import eigen_scores
from headlens.errors import DetectorError
from headlens.probes.base import ProbeBatch, bracket_annotations
from headlens.probes.generated import brackets, random_tokens, repeated_segments
from headlens.scoring.scan import scan
from headlens.testing import PatternModel, offset_pattern, planted_model, uniform_pattern


def _batch(tokens: list[list[int]], causal: bool = True, bos: int = 99) -> ProbeBatch:
    lengths = torch.tensor([len(t) for t in tokens])
    T = int(lengths.max())
    x = torch.full((len(tokens), T), 0, dtype=torch.long)
    for b, t in enumerate(tokens):
        x[b, : len(t)] = torch.tensor(t)
    valid = torch.arange(T)[None] < lengths[:, None]
    return ProbeBatch(x, lengths, valid, (x == bos) | ~valid, causal)


def _pooled(stats):
    return {name: (s.sums.sum(0) / s.counts.sum(), float(s.baseline.sum() / s.counts.sum()))
            for name, s in stats.items()}


def test_registry_has_every_head_type_of_head_scores():
    assert set(DETECTORS) >= {"previous_token", "next_token", "current_token", "first_token", "duplicate_token",
                              "induction", "bracket_matching", "bracket_matching_hard", "open_bracket",
                              "open_bracket_hard", "ov_copying", "ov_suppression", "successor"}
    with pytest.raises(DetectorError, match="unknown detector 'prev'"):
        get_detector("prev")


def test_targets_by_hand():
    b = _batch([[99, 5, 6, 5, 6, 7], [99, 1, 2]])  # second prompt padded
    assert DETECTORS["previous_token"].targets(b)[..., 0].tolist() == [[-1, 0, 1, 2, 3, 4], [-1, 0, 1, -1, -1, -1]]
    assert DETECTORS["first_token"].targets(b)[..., 0].tolist() == [[-1, 0, 0, 0, 0, 0], [-1, 0, 0, -1, -1, -1]]
    assert DETECTORS["current_token"].targets(b)[..., 0].tolist()[1] == [-1, 1, 2, -1, -1, -1]
    dup = targets_to_mask(DETECTORS["duplicate_token"].targets(b), 6)  # (B, Q, K)
    assert dup[0].nonzero().tolist() == [[3, 1], [4, 2]]
    ind = targets_to_mask(DETECTORS["induction"].targets(b), 6)
    assert ind[0].nonzero().tolist() == [[3, 2], [4, 3]]  # x_{k-1} = x_q, k <= q-1
    assert not dup[1].any() and not ind[1].any()


def test_bidirectional_targets_look_right():
    b = _batch([[99, 5, 6, 5, 98]], causal=False)
    b.special |= b.tokens == 98  # a [SEP]
    assert DETECTORS["next_token"].targets(b)[..., 0].tolist() == [[-1, 2, 3, 4, -1]]
    assert targets_to_mask(DETECTORS["duplicate_token"].targets(b), 5)[0].nonzero().tolist() == [[1, 3], [3, 1]]


def test_bracket_annotations_hard_subset():
    # ( a [ b ] { } )  ->  ) matches ( at 1; its nearest opener is { at 6: hard
    ids = [99, 1, 9, 3, 9, 4, 5, 6, 2]
    match, hard = bracket_annotations(ids, ((1, 2), (3, 4), (5, 6)))
    assert match == [-1, -1, -1, -1, -1, 3, -1, 6, 1]
    assert hard == [-1] * 8 + [1]
    match, _ = bracket_annotations([1, 4, 2], ((1, 2), (3, 4)))  # stray ] ignored
    assert match == [-1, -1, 0]
    # code: f ( a < b ) [ c ]  -- the < is a comparison, not a bracket: ) still matches (
    match, hard = bracket_annotations([9, 1, 9, 7, 9, 2, 3, 9, 4], ((1, 2), (3, 4), (7, 8)))
    assert match == [-1] * 5 + [1, -1, -1, 6] and hard == [-1] * 9


def test_open_bracket_targets_sit_one_before_the_closer():
    ids = [99, 1, 9, 3, 9, 4, 5, 6, 2]  # BOS ( a [ b ] { } )
    match, hard = bracket_annotations(ids, ((1, 2), (3, 4), (5, 6)))
    b = _batch([ids, [99, 1, 9, 2]])  # the second prompt is padded
    pad = [-1] * (len(ids) - 4)
    b.annotations = {"bracket_match": torch.tensor([match, [-1, -1, -1, 1, *pad]]),
                     "bracket_hard": torch.tensor([hard, [-1] * 4 + pad])}
    # b (q=4) predicts ] -> [ at 3; { at 6 predicts } but is the opener itself: no row; } (q=7) predicts ) -> ( at 1
    assert DETECTORS["open_bracket"].targets(b)[..., 0].tolist() == [[-1] * 4 + [3, -1, -1, 1, -1], [-1, -1, 1, -1, *pad]]
    assert DETECTORS["open_bracket_hard"].targets(b)[..., 0].tolist()[0] == [-1] * 7 + [1, -1]


@pytest.mark.parametrize("causal", [True, False])
def test_perfect_offset_heads_score_one_and_uniform_scores_the_baseline(causal):
    model = PatternModel([[offset_pattern(-1), offset_pattern(0), offset_pattern(1), uniform_pattern]],
                         causal=causal)
    probe = random_tokens(model, 6, 12, torch.Generator().manual_seed(0))
    names = ["previous_token", "current_token", "first_token"] + ([] if causal else ["next_token"])
    pooled = _pooled(scan(model, probe, [DETECTORS[n] for n in names], batch_size=4))
    for head, name in enumerate(["previous_token", "current_token", "next_token"]):
        if name in pooled:
            assert pooled[name][0][0, head].item() == pytest.approx(1.0, abs=1e-6)
    for score, baseline in pooled.values():
        assert score[0, 3].item() == pytest.approx(baseline, abs=1e-6)  # uniform head == baseline
    # causal baseline of a single-target detector: mean of 1/(q+1) over q = 1..T-1
    if causal:
        T = 12
        assert pooled["previous_token"][1] == pytest.approx(sum(1 / (q + 1) for q in range(1, T)) / (T - 1))


def test_first_token_sink_exact():
    def sink(tokens, valid):
        B, T = tokens.shape
        p = torch.zeros(B, T, T)
        p[:, :, 0] = 1.0
        return p

    model = PatternModel([[sink, uniform_pattern]], causal=True)
    probe = random_tokens(model, 4, 10, torch.Generator().manual_seed(1))
    score, _ = _pooled(scan(model, probe, [DETECTORS["first_token"]]))["first_token"]
    assert score[0, 0].item() == pytest.approx(1.0)


def test_induction_and_duplicate_heads_by_hand():
    def induction(tokens, valid):  # attend to k with x_{k-1} = x_q, k <= q-1
        prev = torch.cat([torch.full_like(tokens[:, :1], -1), tokens[:, :-1]], 1)
        return ((tokens[:, :, None] == prev[:, None, :]).float() * torch.ones(tokens.shape[1], tokens.shape[1])
                .tril(-1))

    def duplicate(tokens, valid):
        return (tokens[:, :, None] == tokens[:, None, :]).float().tril(-1)

    model = PatternModel([[induction, duplicate, uniform_pattern]], causal=True)
    probe = repeated_segments(model, 8, 30, torch.Generator().manual_seed(2))
    pooled = _pooled(scan(model, probe, [DETECTORS["induction"], DETECTORS["duplicate_token"]], batch_size=3))
    assert pooled["induction"][0][0, 0].item() == pytest.approx(1.0)
    assert pooled["duplicate_token"][0][0, 1].item() == pytest.approx(1.0)
    assert pooled["induction"][0][0, 1].item() == pytest.approx(0.0)
    assert pooled["induction"][0][0, 2].item() == pytest.approx(pooled["induction"][1], abs=1e-6)


def test_bracket_matching_head_and_hard_subset():
    from headlens.probes.base import bracket_annotations as ann

    pairs = ((16, 17), (18, 19))  # ( ) [ ] in the planted alphabet

    def matcher(tokens, valid):
        B, T = tokens.shape
        p = torch.zeros(B, T, T)
        for b in range(B):
            for q, k in enumerate(ann(tokens[b].tolist(), pairs)[0]):
                if k >= 0:
                    p[b, q, k] = 1.0
        return p

    model = PatternModel([[matcher, offset_pattern(-1), uniform_pattern]], causal=True)
    probe = brackets(model, 10, 32, torch.Generator().manual_seed(3))
    pooled = _pooled(scan(model, probe, [DETECTORS["bracket_matching"], DETECTORS["bracket_matching_hard"]]))
    for name in ("bracket_matching", "bracket_matching_hard"):
        assert pooled[name][0][0, 0].item() == pytest.approx(1.0)
        assert pooled[name][0][0, 1].item() == 0.0  # no closer directly follows its opener


def test_open_bracket_head_is_not_a_matching_head():
    from headlens.probes.base import bracket_annotations as ann

    pairs = ((16, 17), (18, 19))

    def innermost(tokens, valid):  # from the position before each closer to the opener it closes
        B, T = tokens.shape
        p = torch.zeros(B, T, T)
        for b in range(B):
            for q, k in enumerate(ann(tokens[b].tolist(), pairs)[0]):
                if k >= 0:
                    p[b, q - 1, k] = 1.0
        return p

    model = PatternModel([[innermost, offset_pattern(0), uniform_pattern]], causal=True)
    probe = brackets(model, 10, 32, torch.Generator().manual_seed(3))
    names = ["open_bracket", "open_bracket_hard", "bracket_matching", "bracket_matching_hard"]
    pooled = _pooled(scan(model, probe, [DETECTORS[n] for n in names]))
    assert pooled["open_bracket"][0][0, 0].item() == pytest.approx(1.0)
    assert pooled["open_bracket_hard"][0][0, 0].item() == pytest.approx(1.0)
    assert pooled["bracket_matching"][0][0, 0].item() < 2 * pooled["bracket_matching"][1]  # near chance
    assert pooled["open_bracket"][0][0, 1].item() == 0.0  # attending to itself is not attending to the opener
    assert pooled["open_bracket"][0][0, 2].item() == pytest.approx(pooled["open_bracket"][1], abs=1e-6)


def test_planted_heads_score_one_on_real_python():
    from headlens.models.tokenizer import Tokenizer
    from headlens.probes.base import bracket_annotations as ann
    from headlens.probes.text import stdlib_windows

    pairs = tuple((ord(p[0]), ord(p[1])) for p in ("()", "[]", "{}"))

    def innermost(tokens, valid):  # from the position before each closer to the opener it closes
        p = torch.zeros(tokens.shape[0], tokens.shape[1], tokens.shape[1])
        for b in range(tokens.shape[0]):
            for q, k in enumerate(ann(tokens[b].tolist(), pairs)[0]):
                if k >= 0 and q - 1 > k:
                    p[b, q - 1, k] = 1.0
        return p

    model = PatternModel([[offset_pattern(-1), innermost, uniform_pattern]], n_ctx=128,
                         tokenizer=Tokenizer.byte_level())
    probe = stdlib_windows(model, 16, 128, torch.Generator().manual_seed(0))
    names = ["previous_token", "open_bracket", "open_bracket_hard", "bracket_matching"]
    pooled = _pooled(scan(model, probe, [DETECTORS[n] for n in names]))
    assert pooled["previous_token"][0][0, 0].item() == pytest.approx(1.0)
    assert pooled["open_bracket"][0][0, 1].item() == pytest.approx(1.0)
    assert pooled["open_bracket_hard"][0][0, 1].item() == pytest.approx(1.0)
    assert pooled["open_bracket"][0][0, 0].item() < 0.1  # a previous-token head is no open_bracket head
    assert pooled["bracket_matching"][0][0, 1].item() < 0.2


def test_eigenvalue_score_of_an_identity_ov_circuit():
    model = planted_model()
    cfg = model.cfg
    with torch.no_grad():
        model.lm_head.weight.copy_(model.transformer.wte.weight)  # W_U = W_E^T: reads the token slot
    sc = eigen_scores(model)  # L0H0 copies the token into PREV, not into the token slot: 0 there
    assert sc.shape == (cfg.n_layers, cfg.n_heads)
    with torch.no_grad():
        V, D = cfg.d_vocab, cfg.d_model
        model.transformer.h[1].attn.c_attn.weight[2 * D: 2 * D + V, :V] = torch.eye(V)  # L1H0 v = token
        model.transformer.h[1].attn.c_proj.weight[:V, :V] = torch.eye(V)  # o: back into the token slot
    assert eigen_scores(model)[1, 0].item() == pytest.approx(1.0)
