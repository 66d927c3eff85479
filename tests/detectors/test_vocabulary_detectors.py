"""ov_copying, ov_suppression and successor: planted heads, exact ranks, GQA, post-attention norms, the null.

Planted heads are set by hand (``headlens.testing.vocabulary_model``, and tiny Hugging Face models whose
heads get a projection as their OV); the detectors must label exactly those. The rank engine's screens
are checked against a brute-force ranking of every row.
"""

from __future__ import annotations

import pytest
import torch
from hf_families import hf_config

import headlens
from headlens.errors import DetectorError
from headlens.readout.ov import OVReadout
from headlens.readout.ranks import SCREENS, rank_hits
from headlens.testing import VOCAB_HEADS, vocabulary_model

VOCAB = "ov_copying,ov_suppression,successor"


def _labels(df) -> set[tuple[int, int, str]]:
    return set(df[df.label][["layer", "head", "detector"]].itertuples(index=False, name=None))


def _planted(heads: dict[str, list[tuple[int, int]]]) -> set[tuple[int, int, str]]:
    return {(layer, head, det) for det, hs in heads.items() for layer, head in hs}


def test_rank_hits_equal_a_brute_force_ranking():
    """Screens on (a vocabulary larger than both subsets) decide nothing wrong: every target at the top, at
    rank k and k + 1, at the bottom, in the middle, and a head that writes nothing (all ties)."""
    gen = torch.Generator().manual_seed(0)
    L, H, H_kv, D, dh, V, n, k = 2, 4, 2, 24, 6, 4 * SCREENS[-1] + 100, 12, 5
    w_v = torch.randn(L, H_kv, D, dh, generator=gen)
    w_o = torch.randn(L, H, dh, D, generator=gen)
    w_o[1, 3] = 0.0  # writes nothing: every logit ties
    ov = OVReadout(w_v, w_o, torch.randn(D, V, generator=gen), torch.arange(H) // (H // H_kv))
    e = torch.randn(n, D, generator=gen)
    full = torch.einsum("nd,lhde,lhef,fv->lhnv", e.double(), w_v.double()[:, ov.kv], w_o.double(), ov.unembed.double())
    order = full[0, 0].argsort(-1, descending=True)  # (n, V): pick targets by their rank in L0H0's rows
    picks = [0, k - 1, k, V - 1, V - k, V - k - 1, V // 2, 1, 2, k + 1, V - 2, 3]
    targets = torch.stack([order[i, picks[i]] for i in range(n)])[:, None]  # (n, 1)
    targets = torch.cat([targets, torch.randint(0, V, (n, 1), generator=gen)], 1)  # (n, 2)
    hits = rank_hits(ov, e, targets, k=k)
    lt = full.gather(-1, targets.expand(L, H, n, 2))  # (L, H, n, T)
    above = (full[..., None, :] >= lt[..., None]).sum(-1) - 1  # (L, H, n, T): others at least as high
    below = (full[..., None, :] <= lt[..., None]).sum(-1) - 1
    assert torch.equal(hits.top, above < k) and torch.equal(hits.bottom, below < k)
    assert hits.top[0, 0, :6, 0].tolist() == [True, True, False, False, False, False]
    assert hits.bottom[0, 0, 3:6, 0].tolist() == [True, True, False]
    assert not hits.top[1, 3].any() and not hits.bottom[1, 3].any()
    assert hits.whole_rows < L * H * n  # the screens settled some pairs


def test_planted_vocabulary_heads_are_labelled_and_nothing_else():
    df = headlens.classify(vocabulary_model(), detectors=VOCAB)
    assert _labels(df) == _planted(VOCAB_HEADS)
    row = df[(df.detector == "ov_copying") & (df["head"] == 0)].iloc[0]
    assert row.score == 1.0 and row.ci_low > 0.9 and row.null == 0.0 and row.eigen == pytest.approx(1.0)
    assert row.baseline == pytest.approx(5 / 37) and row.n_positions == 36  # every ordinary token, chance k / V
    succ = df.attrs["weights"]["successor"]
    assert set(succ["lists"]) == {"digits", "letters_lower"} and succ["per_list"]["digits"][0][2] == 1.0
    assert succ["chance"] == pytest.approx(2 / 34)  # 1 / (n - 1) per item, averaged over the items


def test_raw_eigenvalues_copy_but_the_normed_ov_suppresses():
    """The final LayerNorm's scale is -1: W_E W_V W_O W_U is the identity for L0H0 (eigenvalue score 1, the
    old label), but what reaches the logits is minus the identity, and the labels follow what reaches them."""
    df = headlens.classify(vocabulary_model(flip_final_norm=True), detectors=VOCAB)
    eigen = df[df.detector == "ov_copying"].set_index("head").eigen
    assert eigen[0] == pytest.approx(1.0) and eigen[1] == pytest.approx(-1.0)
    assert {(h, d) for _, h, d in _labels(df)} == {(0, "ov_suppression"), (1, "ov_copying")}


def test_successor_needs_the_successor_not_a_neighbour():
    """A head mapping each item to its predecessor scores 1 on the null and is no successor head."""
    model = vocabulary_model()
    attn, D = model.transformer.h[0].attn, model.cfg.d_model
    with torch.no_grad():  # head h occupies rows / columns 40h .. 40h + 36 of its v and o weights
        attn.c_attn.weight[2 * D + 120:2 * D + 157, :37] = torch.eye(37)  # L0H3 reads the token
        attn.c_proj.weight[:37, 120:157] = attn.c_proj.weight[:37, 80:117].T  # L0H2's map reversed
    df = headlens.classify(model, detectors="successor")
    h3 = df[df["head"] == 3].iloc[0]
    assert h3.null == 1.0 and h3.score == 0.0 and not h3.label
    assert _labels(df) == {(0, 2, "successor")}


def _plant(family: str, flip_post_norm: bool = False):
    """A tiny ``family`` model (GQA: 4 query heads on 2 key/value groups) with tied embeddings and MLPs that
    write nothing; layer 0's query head 1 copies (value: group 0's projection onto a random 16-dim subspace,
    output: back), query head 3 suppresses (group 1, minus its projection). Heads 0 and 2 share those groups'
    W_V with random W_O."""
    import transformers

    cfg = hf_config(family, vocab_size=300)
    torch.manual_seed(0)
    hf = getattr(transformers, {"llama": "LlamaForCausalLM", "gemma2": "Gemma2ForCausalLM"}[family])(cfg).eval()
    with torch.no_grad():
        hf.lm_head.weight.copy_(hf.model.embed_tokens.weight)
        for layer in hf.model.layers:
            layer.mlp.down_proj.weight.zero_()
        attn, dh = hf.model.layers[0].self_attn, 16
        for group, head, sign in ((0, 1, 1.0), (1, 3, -1.0)):
            q = torch.linalg.qr(torch.randn(64, dh))[0]  # (D, dh) orthonormal
            attn.v_proj.weight[group * dh:(group + 1) * dh] = q.T  # v = x q
            attn.o_proj.weight[:, head * dh:(head + 1) * dh] = sign * q  # out = z q^T
        if flip_post_norm:  # Gemma 2 scales by 1 + weight: -1 after layer 0's attention
            hf.model.layers[0].post_attention_layernorm.weight.fill_(-2.0)
    return hf


@pytest.mark.parametrize("family", ["llama", "gemma2"])
def test_grouped_query_heads_copy_with_their_own_w_o(family, tmp_path):
    from hf_families import save_tokenizer

    for flip in (False, True) if family == "gemma2" else (False,):
        path = tmp_path / f"{family}-{flip}"
        _plant(family, flip).save_pretrained(path)
        save_tokenizer(path)
        df = headlens.classify(f"hf:{path}", detectors="ov_copying,ov_suppression")
        want = {(0, 1, "ov_suppression" if flip else "ov_copying"), (0, 3, "ov_copying" if flip else "ov_suppression")}
        assert _labels(df) == want, (family, flip)
        null = df.attrs["weights"]["ov_copying"]["null_score"]
        assert null["ci"][0] <= 5 / 300 <= null["ci"][1]  # the shuffled null sits at chance, k / V


def test_successor_without_ordered_lists_is_one_line():
    from headlens.testing import planted_model

    with pytest.raises(DetectorError, match="no ordered list"):
        headlens.classify(planted_model(), detectors="successor")
    assert "no ordered list" in headlens.classify(planted_model()).attrs["skipped"]["successor"]
