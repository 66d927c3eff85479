"""Grouped-query attention: rows per query head, each with its key/value group, on a tiny GQA Llama.

The references are independent of headlens and of TransformerLens: the copying score from the raw
Hugging Face weights (``v_proj`` rows of the group, ``o_proj`` columns of the head), and ablation as a forward pre-hook on
``o_proj`` that edits one query head's slice of its input.
"""

from __future__ import annotations

import pytest
import torch

import headlens
from headlens.scoring.table import COLUMNS, kv_heads, n_kv_heads
from tests.gqa_models import save_llama

TEXTS = ["abcdefg abcdefg", "xyz(1, 2) xyz(3"]


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    return save_llama(tmp_path_factory.mktemp("gqa") / "llama")


@pytest.fixture(scope="module")
def model(llama_dir):
    torch.set_num_threads(min(2, torch.get_num_threads()))
    return headlens.load(f"hf:{llama_dir}")


@pytest.fixture(scope="module")
def hf(llama_dir):
    from transformers import LlamaForCausalLM

    return LlamaForCausalLM.from_pretrained(str(llama_dir), attn_implementation="eager").eval()


def test_kv_heads_follow_repeat_kv_order():
    assert kv_heads(4, 2) == [0, 0, 1, 1] and kv_heads(8, 1) == [0] * 8 and kv_heads(3) == [0, 1, 2]
    with pytest.raises(headlens.HeadlensError, match="n_kv_heads=3"):
        kv_heads(4, 3)


def test_table_has_one_row_per_query_head_with_its_kv_group(model):
    assert (model.n_heads, n_kv_heads(model)) == (4, 2)
    table = headlens.classify(model, n_prompts=10, seq_len=24, n_boot=50)
    assert list(table.columns)[:len(COLUMNS)] == list(COLUMNS) and "ov_copying" in set(table.detector)
    assert table.attrs["n_kv_heads"] == 2
    for _, rows in table.groupby("detector"):
        assert rows[["layer", "head", "kv_head"]].values.tolist() == [
            [layer, h, h // 2] for layer in range(2) for h in range(4)]


def test_native_models_have_kv_head_equal_to_head(tiny_gpt):
    table = headlens.classify(tiny_gpt, detectors="previous_token", n_prompts=4, seq_len=16, n_boot=10)
    assert (table["kv_head"] == table["head"]).all()


def test_eigenvalue_score_uses_each_query_heads_w_o_with_its_groups_w_v(model, hf):
    from headlens.detectors.ov_copying import eigen_scores as scores

    W_E = hf.model.embed_tokens.weight.double()  # (V, D)
    W_U = hf.lm_head.weight.double().T  # (D, V)
    ref = torch.zeros(2, 4, dtype=torch.float64)
    for layer, block in enumerate(hf.model.layers):
        v = block.self_attn.v_proj.weight.double().view(2, 16, 64)  # (H_kv, dh, D): v = x W^T
        o = block.self_attn.o_proj.weight.double().view(64, 4, 16)  # (D, H, dh): out = z W^T
        for h in range(4):
            # W_E W_V W_O W_U (V x V) has the non-zero eigenvalues of W_O W_U W_E W_V (dh x dh)
            lam = torch.linalg.eigvals(o[:, h].T @ W_U @ W_E @ v[h // 2].T)  # query head h, kv group h // 2
            ref[layer, h] = lam.real.sum() / lam.abs().sum()
    ours = scores(model)
    assert ours.shape == (2, 4)
    torch.testing.assert_close(ours, ref, atol=1e-5, rtol=0)  # W_U W_E is formed in float32
    assert not torch.allclose(ours[:, 0], ours[:, 1])  # heads of one group differ by their W_O


def _o_proj_ablation(hf, tokens, layer, head, value=None):
    """Logits with query head ``head``'s slice of ``o_proj``'s input set to ``value`` (default 0)."""
    def pre(module, args):
        x = args[0].clone()  # (B, T, H * dh): o_proj's input, query heads side by side
        x[..., head * 16:(head + 1) * 16] = 0 if value is None else value[..., head * 16:(head + 1) * 16]
        return (x,)

    handle = hf.model.layers[layer].self_attn.o_proj.register_forward_pre_hook(pre)
    try:
        with torch.no_grad():
            return hf(tokens).logits
    finally:
        handle.remove()


@pytest.mark.parametrize("layer,head", [(0, 1), (1, 2)])
def test_ablating_a_query_head_removes_only_its_slice(model, hf, layer, head):
    tokens = model.to_tokens(TEXTS[0])
    with torch.no_grad():
        clean = model(tokens)
        assert float((clean - hf(tokens).logits).abs().max()) <= 1e-5
        with headlens.ablate(model, [(layer, head)], method="zero"):
            ours = model(tokens)
    ref = _o_proj_ablation(hf, tokens, layer, head)
    assert float((ours - ref).abs().max()) <= 1e-5
    assert float((ours - clean).abs().max()) > 1e-3  # the head mattered
    sibling = _o_proj_ablation(hf, tokens, layer, head ^ 1)  # same kv group, other query head
    assert float((ours - sibling).abs().max()) > 1e-3


def test_mean_ablation_matches_o_proj_mean(model, hf):
    reference = torch.stack([model.to_tokens(t)[0, :12] for t in TEXTS])  # (2, 12)
    tokens = model.to_tokens(TEXTS[1])[:, :12]
    seen = []
    handle = hf.model.layers[1].self_attn.o_proj.register_forward_pre_hook(lambda m, a: seen.append(a[0]))
    with torch.no_grad():
        hf(reference)
    handle.remove()
    mean_in = seen[0].mean(0, keepdim=True)  # (1, 12, H * dh): per-position mean over the reference
    with torch.no_grad(), headlens.ablate(model, "L1H3", method="mean", reference=reference):
        ours = model(tokens)
    ref = _o_proj_ablation(hf, tokens, 1, 3, value=mean_in)
    assert float((ours - ref).abs().max()) <= 1e-5


def test_uniform_ablation_matches_o_proj_mean_of_the_groups_values(model, hf):
    """Uniform attention by hand on the raw HF model: head h's slice of o_proj's input becomes the
    causal running mean of its key/value group's v_proj output."""
    tokens = model.to_tokens(TEXTS[1])
    layer, head = 1, 3
    vs = []
    handle = hf.model.layers[layer].self_attn.v_proj.register_forward_hook(lambda m, a, out: vs.append(out))
    with torch.no_grad():
        hf(tokens)
    handle.remove()
    n_heads, n_kv = model.n_heads, hf.config.num_key_value_heads
    group = head // (n_heads // n_kv)
    v = vs[0][..., group * 16:(group + 1) * 16]  # (1, T, dh): the group's values
    running = v.cumsum(1) / torch.arange(1, v.shape[1] + 1)[None, :, None]  # (1, T, dh): mean over k <= q
    value = torch.zeros(1, v.shape[1], n_heads * 16)
    value[..., head * 16:(head + 1) * 16] = running
    with torch.no_grad(), headlens.ablate(model, [(layer, head)], method="uniform"):
        ours = model(tokens)
    ref = _o_proj_ablation(hf, tokens, layer, head, value=value)
    assert float((ours - ref).abs().max()) <= 1e-5
    assert float((ours - model(tokens)).abs().max()) > 1e-4
