"""Key weights: a head built to weigh every key by its token gets those weights in its description, agrees
better with them on held-out windows, and put back keeps its effect; JSON keeps them."""

from __future__ import annotations

import dataclasses
from dataclasses import replace

import pytest
import torch

from headlens.atlas.corpus import split
from headlens.atlas.describe import Description
from headlens.atlas.rules import candidate_rules
from headlens.atlas.substitute import substitute
from tests.atlas.planted import ALPHABET, KEYED, planted_atlas


@pytest.fixture(scope="module")
def keyed():
    return planted_atlas(keyed=True)


def test_a_head_that_weighs_keys_by_their_token_gets_those_weights(keyed):
    model, windows, atlas = keyed
    d = next(d for d in atlas.descriptions if (d.layer, d.head) == (1, 2))
    assert d.key_pref, d.text
    ids = {t: model.tokenizer.encode(t)[-1] for t in ALPHABET}
    w = {t: d.key_pref.get(ids[t], 1.0) for t in ALPHABET}
    plain = sorted(w[t] for t in ALPHABET if t not in KEYED)  # the letters built to score 0: the reference
    ref = plain[len(plain) // 2]
    # built: e^2, e^1 and e^-2 against a plain letter; its mixture's other rule (a key the model predicts, often
    # the "a" this head writes) takes part of the preference for "a", so the order and the sides are asserted
    assert w["a"] / ref > 2 and w["a"] > w["b"] and w["b"] / ref > 1.5 and w["c"] / ref < 0.3, w
    assert d.agreement > d.evidence["mix_r"] + 0.05 and d.agreement > 0.9
    assert "weighs some by their token (most 'a' " in d.text
    held = split(windows)[1]
    # its mean ablation, -0.03 [-0.09, +0.01] on the 8 held-out windows, leaves the atlas no effect to keep
    # (share_how "no_effect"); put back all the same, the description keeps it, and without its weights it does not
    (kept,), _ = substitute(model, [d], held, candidate_rules(), every_share=True)
    (without,), _ = substitute(model, [replace(d, key_pref={})], held, candidate_rules(), every_share=True)
    assert kept.share_kept > 0.9 and without.share_kept < kept.share_kept - 0.1  # the key weights keep it


def test_heads_the_weights_do_not_help_keep_their_mixture_and_json_keeps_the_weights(keyed):
    _, _, atlas = keyed
    by = {(d.layer, d.head): d for d in atlas.descriptions}
    assert not by[(0, 0)].key_pref and by[(0, 0)].role == "previous_token"  # its rule fits: nothing to weigh
    d = by[(1, 2)]
    back = Description(**{**{k: v for k, v in dataclasses.asdict(d).items()},
                          "key_pref": {str(t): w for t, w in d.key_pref.items()}})
    assert back.key_pref == d.key_pref


def test_the_gate_errors_match_a_brute_force_of_the_patterns_and_the_writes():
    """The gate's squared errors (attention over whole rows and off the first token; what the head writes, through
    ``W_O W_O^T``) against the same four patterns built and written out one by one through ``W_O`` itself."""
    from headlens.atlas.keypref import _errors, _grams
    from headlens.atlas.sinkbands import key_weighted, query_rested
    from tests.atlas.planted import planted_gpt

    gen = torch.Generator().manual_seed(0)
    B, T, d_head, V = 2, 6, 4, 5
    x = torch.rand(B, T, T, generator=gen).tril()
    x = x / x.sum(-1, keepdim=True)
    p = torch.rand(B, T, T, generator=gen).tril()
    p = p / p.sum(-1, keepdim=True)
    tokens = torch.randint(0, V, (B, T), generator=gen)
    odds, weight = torch.rand(V, generator=gen) * 3, torch.rand(V, generator=gen) * 3
    v = torch.randn(B, T, d_head, generator=gen)
    w_o = torch.randn(d_head, 7, generator=gen, dtype=torch.float64)
    got = _errors(x, p, tokens, odds, weight, v, w_o @ w_o.T)  # (3, 4)
    pu = query_rested(p, tokens, odds)
    for i, y in enumerate((p, pu, key_weighted(p, tokens, weight), key_weighted(pu, tokens, weight))):
        write = ((y.double() @ v.double()) @ w_o) - ((x.double() @ v.double()) @ w_o)  # (B, T, D)
        want = [((x - y).double() ** 2).sum(), ((x - y).double()[..., 1:] ** 2).sum(), (write ** 2).sum()]
        assert got[:, i].tolist() == pytest.approx([float(w) for w in want], rel=1e-6)  # the patterns are float32
    model = planted_gpt()
    d = Description(1, 0, "induction", "induction", 0.9, (0.8, 1.0), "")
    w = model.transformer.h[1].attn.c_proj.weight.detach().T[:32].double()  # (d_head, D): L1H0's W_O
    assert torch.allclose(_grams(model, [d])[0], w @ w.T)
