"""Query factors: a head built to rest on the first token by how much its query's token asks gets that dependence
back (order and size), says it in its sentence, and put back keeps its effect, which it loses without them."""

from __future__ import annotations

import dataclasses
from dataclasses import replace

import pytest
import torch

from headlens.atlas.corpus import split
from headlens.atlas.describe import Description, _classes
from headlens.atlas.keypref import _passes
from headlens.atlas.rules import candidate_rules
from headlens.atlas.substitute import simulated_patterns, substitute
from tests.atlas.planted import ALPHABET, QUERIED, QUERIED_ELSE, planted_atlas


@pytest.fixture(scope="module")
def queried():
    return planted_atlas(queried=True)


def _put_back_shares(model, d, windows) -> dict[str, float]:
    """The description's mean share on the first token after each query letter, put back on ``windows``."""
    classes = _classes(model, None)
    ids = {t: model.tokenizer.encode(t)[-1] for t in ALPHABET}
    mass, rows = dict.fromkeys(ALPHABET, 0.0), dict.fromkeys(ALPHABET, 0)
    for tok, preds, ok, _ in _passes(model, [d], windows, 8, classes, lambda n: None):
        at = ok.bool().any(-1)  # (B, Q)
        at[:, :2] = False  # at query 1 the previous token is the first: no share to state
        p = simulated_patterns([d], preds, ok.bool().any(-1), tok)[(d.layer, d.head)]  # (B, Q, K)
        for t in ALPHABET:
            here = at & (tok == ids[t])
            mass[t] += float(p[..., 0][here].sum())
            rows[t] += int(here.sum())
    return {t: mass[t] / max(rows[t], 1) for t in ALPHABET}


def test_a_head_that_rests_by_its_query_token_gets_that_back(queried):
    model, windows, atlas = queried
    d = next(d for d in atlas.descriptions if (d.layer, d.head) == (1, 2))
    assert d.role == "previous_token" and d.query_sink and not d.key_pref, d.text
    ids = {t: model.tokenizer.encode(t)[-1] for t in ALPHABET}
    u = {t: d.query_sink.get(ids[t], 1.0) for t in ALPHABET}
    assert u["a"] > u["b"] > max(u[t] for t in ALPHABET if t not in QUERIED) > u["c"], u  # the built order
    held = split(windows)[1]
    got = _put_back_shares(model, d, held)
    for t in ALPHABET:  # and the built size, on held-out windows
        assert got[t] == pytest.approx(QUERIED.get(t, QUERIED_ELSE), abs=0.05), (t, got)
    assert d.agreement > d.evidence["mix_r"] + 0.04 and d.agreement > 0.99  # 0.95 -> 1.00 when built
    assert "depends on the query's token: on held-out text " in d.text and "more after 'a' (0.90)" in d.text
    assert "less after 'c' (0.10)" in d.text
    assert d.share_kept is not None and d.share_kept > 0.9
    (without,), _ = substitute(model, [replace(d, query_sink={})], held, candidate_rules())
    assert without.share_kept < d.share_kept - 0.1  # the query factors are what keeps it


def test_heads_whose_rest_does_not_follow_the_query_get_no_factors_and_json_keeps_them(queried):
    _, _, atlas = queried
    by = {(d.layer, d.head): d for d in atlas.descriptions}
    assert not by[(0, 0)].query_sink and not by[(1, 1)].query_sink  # previous token; resting on the first token
    d = by[(1, 2)]
    back = Description(**{**dataclasses.asdict(d), "query_sink": {str(t): w for t, w in d.query_sink.items()}})
    assert back.query_sink == d.query_sink
    assert torch.tensor(list(d.query_sink.values())).min() > 0
