"""Direct logit attribution is exact on every causal family of the architecture matrix, on Gemma 2 / 3 style
post-attention norms, on grouped-query attention and on the native GPT: the parts plus the bias sum to the
logit that ``transformers`` alone computes (within 1e-4, float32), and each query head's row equals the
head's write read off a pre-hook on the output projection, passed through the norms with their scales
frozen (an independent computation in plain transformers)."""

from __future__ import annotations

import dataclasses
import warnings

import pytest
import torch
from hf_families import FAMILIES, build, claims, load_eager, out_proj

from headlens.readout.dla import attribute, decompose
from headlens.readout.parts import ReadoutError, model_parts
from tests.conftest import make_gpt

TOL = 1e-4
PROMPTS = ["def f(x):\n    return x + 1", "import os\nprint(os.sep)"]
CAUSAL = claims("attribute", causal_only=True)  # the matrix's causal families (encoders: refused, below)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root, cache = tmp_path_factory.mktemp("dla"), {}

    def get(family: str):
        if family not in cache:
            import headlens

            path = build(family, root / family)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                cache[family] = (headlens.load(f"hf:{path}"), load_eager(path, family))
        return cache[family]

    return get


def _truth_logits(hf, model, texts):
    """Each prompt's logits from plain transformers, one prompt at a time (no padding, no hooks)."""
    with torch.no_grad():
        return [hf(model.to_tokens(t)).logits[0] for t in texts]  # (T, V) each


@pytest.mark.parametrize("family", CAUSAL)
def test_parts_sum_to_the_transformers_logit(built, family):
    model, hf = built(family)
    df = attribute(model, PROMPTS, position="all")
    truth = _truth_logits(hf, model, PROMPTS)
    assert df.attrs["max_error"] < TOL
    total = df.groupby(["prompt", "position"]).attribution.sum()
    want, cap = {}, df.attrs["softcap"]
    for b, t in total.index:
        raw = truth[b][t].max()  # the default target: the model's own top prediction
        want[b, t] = float(cap * torch.atanh(raw / cap)) if cap else float(raw)  # the logit before the soft-cap
    assert max(abs(total[k] - v) for k, v in want.items()) < TOL
    n_components = 1 + 2 * (model.n_heads + 1) + 1  # embed, per layer heads + mlp, bias
    assert df.component.nunique() == n_components


def _head_truth(hf, family, tokens, layer, head, tid, pos):
    """One head's attribution, from plain transformers: its slice of the output projection's input, through
    the post-attention norm (Gemma 2 / 3) and the final norm at their clean scales, dotted with W_U[tid]."""
    cfg, mod = hf.config, hf.model
    d_head = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    seen = {}
    proj = out_proj(hf, family, layer) if family in FAMILIES else mod.layers[layer].self_attn.o_proj
    hooks = [proj.register_forward_pre_hook(lambda m, a: seen.__setitem__("z", a[0])),
             mod.norm.register_forward_pre_hook(lambda m, a: seen.__setitem__("x", a[0]))]
    post = getattr(mod.layers[layer], "post_attention_layernorm", None) if family.startswith("gemma") else None
    if post is not None and family != "gemma":
        hooks.append(post.register_forward_pre_hook(lambda m, a: seen.__setitem__("o", a[0])))
    else:
        post = None
    with torch.no_grad():
        hf(tokens)
    for h in hooks:
        h.remove()
    z = seen["z"][0, pos, head * d_head:(head + 1) * d_head].double()  # (d_head,)
    write = z @ proj.weight[:, head * d_head:(head + 1) * d_head].double().T  # (D,)
    rms = lambda v, eps: (v.pow(2).mean() + eps).sqrt()  # noqa: E731
    offset = 1.0 if family.startswith("gemma") else 0.0  # Gemma's RMSNorm weight is stored as w - 1
    if post is not None:
        write = write / rms(seen["o"][0, pos].double(), post.eps) * (offset + post.weight.double())
    final = write / rms(seen["x"][0, pos].double(), mod.norm.variance_epsilon if hasattr(mod.norm, "variance_epsilon")
                        else mod.norm.eps) * (offset + mod.norm.weight.double())
    return float(final @ hf.lm_head.weight[tid].detach().double())


@pytest.mark.parametrize("family", ["llama", "gemma2", "gemma3"])
def test_each_query_head_equals_its_output_projection_slice(built, family):
    model, hf = built(family)
    df = attribute(model, PROMPTS[:1], position=-1)
    tokens = model.to_tokens(PROMPTS[0])
    tid = int(hf(tokens).logits[0, -1].argmax())
    for layer, head in [(0, 1), (1, 2), (1, 3)]:  # under GQA L1H2 and L1H3 share a key/value head
        ours = float(df[df.component == f"L{layer}H{head}"].attribution.iloc[0])
        assert ours == pytest.approx(_head_truth(hf, family, tokens, layer, head, tid, tokens.shape[1] - 1), abs=TOL)


@pytest.mark.parametrize("family", ["gemma2", "gemma3"])
def test_post_attention_norm_is_not_left_in_a_remainder(built, family):
    """Reading heads as ``z W_O`` through the final norm alone (TransformerLens' stack) misses the logit."""
    model, _ = built(family)
    parts = model_parts(model)
    assert all(p is not None for p in parts.post)
    from headlens.readout.dla import read_activations

    tokens = model.to_tokens(PROMPTS[0])
    pos = torch.tensor([[tokens.shape[1] - 1]])
    got = read_activations(model, parts, tokens, torch.ones_like(tokens), pos)
    logits = got.pop("logits")
    pair = torch.stack([logits.argmax(-1), torch.full_like(pos, -1)], -1)
    exact = decompose(parts, got, pair).sum(-1)
    naive = decompose(dataclasses.replace(parts, post=[None] * parts.n_layers), got, pair).sum(-1)
    assert abs(float(exact - logits.max())) < TOL < abs(float(naive - logits.max()))


def test_gqa_llama(tmp_path):
    from gqa_models import save_llama
    from transformers import LlamaForCausalLM

    import headlens

    path = save_llama(tmp_path / "gqa")
    model, hf = headlens.load(f"hf:{path}"), LlamaForCausalLM.from_pretrained(path).eval()
    df = attribute(model, "hello there", target="e", position=-2)
    assert df.component.str.fullmatch(r"L1H\d").sum() == 4  # one row per query head, 2 key/value heads
    with torch.no_grad():
        want = float(hf(model.to_tokens("hello there")).logits[0, -2, ord("e")])
    assert df.attribution.sum() == pytest.approx(want, abs=TOL)


@pytest.mark.parametrize("kind", ["layernorm", "attn_only"])
def test_native_gpt(kind):
    model = make_gpt(3) if kind == "layernorm" else make_gpt(3, attn_only=True, normalization="none")
    df = attribute(model, ["abc abd", "hello"], target="d", position="all")
    with torch.no_grad():
        logits = [model(model.to_tokens(t))[0, :, ord("d")] for t in ["abc abd", "hello"]]
    total = df.groupby(["prompt", "position"]).attribution.sum()
    assert max(abs(total[b, t] - float(logits[b][t])) for b, t in total.index) < TOL
    assert ("mlp0" in set(df.component)) == (kind == "layernorm")


def test_encoders_are_refused(built):
    model, _ = built("bert")
    with pytest.raises(ReadoutError, match="encoder"):
        attribute(model, "hello")


def test_padding_and_batches_change_nothing(built):
    model, _ = built("qwen2")
    one = attribute(model, PROMPTS, position=-1, batch_size=1)
    both = attribute(model, PROMPTS, position=-1)
    assert (one.attribution - both.attribution).abs().max() < 1e-6


@pytest.mark.parametrize("family", ["gemma2", "llama"])
def test_logit_free_read_gives_decompose_head_columns_bit_for_bit(built, family):
    """The atlas's read (every position, stopped before the unembedding) and ``head_columns`` give exactly
    ``decompose``'s head columns from the full read at every position."""
    from headlens.readout.dla import head_columns, read_activations, reads

    model, _ = built(family)
    parts = model_parts(model)
    tokens = model.to_tokens(PROMPTS[0])
    T = tokens.shape[1]
    full = read_activations(model, parts, tokens, torch.ones_like(tokens), torch.arange(T)[None])
    assert full.pop("logits").shape[-1] == model.cfg.d_vocab
    short = read_activations(model, parts, tokens, torch.ones_like(tokens), None,
                             names=reads(parts, heads_only=True), logits=False)
    assert "logits" not in short
    pair = torch.stack([tokens.roll(-1, 1), torch.full_like(tokens, -1)], -1)  # (1, T, 2): the next token
    heads = [i for i, c in enumerate(parts.components) if c.startswith("L")]
    want = decompose(parts, full, pair)[..., heads].reshape(1, T, parts.n_layers, parts.n_heads)
    assert torch.equal(head_columns(parts, short, pair), want)
