"""What compiled tracr models need of the native GPT: free head widths, ReLU MLPs, bidirectional attention.

None of this needs tracr itself; ``tests/circuits/test_tracr.py`` converts real compiled programs.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from headlens.errors import HeadlensError
from headlens.models.export import export_hf
from tests.conftest import make_gpt

TRACR_LIKE = dict(n_layers=2, n_heads=3, d_model=20, d_head=7, d_mlp=11, act_fn="relu", normalization="none",
                  n_ctx=16, causal=False, init_range=0.3)


def reference_forward(model, tokens):
    """The model written out by hand: einsums over explicit per-head weights, no hooks, no fused kernels."""
    cfg = model.cfg
    H, d, A = cfg.n_heads, cfg.d_head, cfg.d_attn
    T = tokens.shape[1]
    x = model.transformer.wte.weight[tokens] + model.transformer.wpe.weight[:T]  # (B, T, D)
    for block in model.transformer.h:
        w, b = block.attn.c_attn.weight, block.attn.c_attn.bias  # (3A, D), (3A,)
        q, k, v = (torch.einsum("btD,hdD->bhtd", x, w[i * A:(i + 1) * A].view(H, d, -1))
                   + b[i * A:(i + 1) * A].view(H, 1, d) for i in range(3))  # 3 x (B, H, T, d)
        scores = q @ k.transpose(-1, -2) / math.sqrt(d)  # (B, H, T, T)
        if cfg.causal:
            scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
        z = (scores.softmax(-1) @ v).transpose(1, 2).reshape(x.shape[0], T, A)  # (B, T, H*d)
        x = x + block.attn.c_proj(z)
        x = x + block.mlp.c_proj(F.relu(block.mlp.c_fc(x)))
    return model.lm_head(x)


@pytest.mark.parametrize("causal", [False, True])
def test_free_head_width_relu_and_bidirectional_attention_compute_what_they_say(causal):
    model = make_gpt(**(TRACR_LIKE | {"causal": causal}))
    assert model.cfg.d_attn == 21 != model.cfg.d_model
    assert model.transformer.h[0].attn.c_attn.weight.shape == (63, 20)
    tokens = torch.randint(0, 256, (2, 9))
    with torch.no_grad():
        want = reference_forward(model, tokens)
        fused = model(tokens)
        _, cache = model.run_with_cache(tokens, names_filter=lambda n: n.endswith("hook_pattern"))
    assert torch.allclose(fused, want, atol=1e-5)
    pattern = cache["blocks.0.attn.hook_pattern"]  # (B, H, Q, K)
    assert pattern.shape == (2, 3, 9, 9)
    upper = pattern[..., torch.ones(9, 9, dtype=torch.bool).triu(1)]
    assert (upper.abs().max() > 0.01) != causal  # bidirectional heads look ahead; causal ones never do
    assert model.is_causal == causal and model.attention_specs()[0].causal == causal


def test_the_explicit_pattern_path_equals_the_fused_kernel_when_bidirectional():
    model = make_gpt(**TRACR_LIKE)
    tokens = torch.randint(0, 256, (2, 9))
    with torch.no_grad():
        fused = model(tokens)
        with model.hooks([("blocks.1.attn.hook_pattern", lambda x, hook: x)]):
            explicit = model(tokens)
    assert torch.allclose(fused, explicit, atol=1e-5)


@pytest.mark.parametrize("fused", [True, False])
def test_a_bidirectional_native_model_hides_padding_from_every_query(fused):
    """Each row of a right-padded batch gives, at its real positions, what it gives alone and unpadded."""
    model = make_gpt(**TRACR_LIKE)
    lengths = [9, 6, 4]
    rows = [torch.randint(0, 256, (n,)) for n in lengths]
    tokens = torch.zeros(3, 9, dtype=torch.long)
    mask = torch.zeros(3, 9, dtype=torch.long)
    for i, r in enumerate(rows):
        tokens[i, : len(r)], mask[i, : len(r)] = r, 1
    hooks = [] if fused else [("blocks.0.attn.hook_pattern", lambda x, hook: x)]  # the explicit path
    with torch.no_grad(), model.hooks(hooks):
        padded = model(tokens, attention_mask=mask)
        alone = [model(r[None])[0] for r in rows]
        unmasked = model(tokens)
    for i, n in enumerate(lengths):
        assert torch.allclose(padded[i, :n], alone[i], atol=1e-5)
    assert not torch.allclose(unmasked[2, :4], alone[2], atol=1e-3)  # without the mask the pads would be read
    assert all(b.attn.key_mask is None for b in model.transformer.h)  # the mask lives for one forward


def test_export_to_gpt2_names_what_gpt2_cannot_hold(tmp_path):
    with pytest.raises(HeadlensError, match=r"no d_head != d_model / n_heads, ReLU MLPs, bidirectional attention"):
        export_hf(make_gpt(**TRACR_LIKE), tmp_path / "x")
