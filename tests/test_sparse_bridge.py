"""Issue 13 on Hugging Face models: the LSE scan's q/k/scale/mask equal transformers' eager attention.

Tiny random-weight families from ``tests/hf_families.py`` (nothing downloads): GPT-2 (no rotary),
Llama and Qwen2 (RoPE, GQA), Mistral (GQA + a sliding window of 16 < the prompt), Gemma (multi-query,
its own scaling), BERT (bidirectional, padded).
"""

from __future__ import annotations

import pytest
import torch

from headlens.backends.bridge import load_bridge
from headlens.detectors import DETECTORS
from headlens.lse import heads_first, implied_pattern
from headlens.probes import text_prompts
from headlens.scan import scan
from tests.hf_families import FAMILIES, build, load_eager

FAMS = ["gpt2", "llama", "qwen2", "mistral", "gemma", "bert"]
TEXTS = ["def f(x):\n    return [x, (x)] + f(x)", "import os", "x = {'k': [1, 2]} ( y ) x = {'k'",
         "for i in range(10):\n    print(i, i, i)"]


@pytest.fixture(scope="module", params=FAMS)
def family(request, tmp_path_factory):
    path = build(request.param, tmp_path_factory.mktemp(request.param))
    return request.param, load_bridge(path), load_eager(path, request.param)


def test_implied_patterns_equal_eager_attention(family):
    name, model, eager = family
    specs = model.attention_specs()
    assert specs is not None and len(specs) == model.n_layers
    if name == "mistral":
        assert all(s.window == 16 for s in specs)
    g = torch.Generator().manual_seed(0)
    T = 40  # longer than Mistral's window
    tokens = torch.randint(10, 250, (2, T), generator=g)
    valid = torch.ones(2, T, dtype=torch.bool)
    mask = None
    if not model.is_causal:  # a padded second prompt
        valid[1, 25:] = False
        mask = valid.long()
    names = [h for s in specs for h in (s.q_hook, s.k_hook)]
    _, cache = model.run_with_cache(tokens, names_filter=names, attention_mask=mask)
    with torch.no_grad():
        ref = eager(tokens, attention_mask=mask, output_attentions=True).attentions
    for layer, spec in enumerate(specs):
        q, k = heads_first(cache[spec.q_hook], spec.layout), heads_first(cache[spec.k_hook], spec.layout)
        assert k.shape[1] == FAMILIES[name].n_kv_heads  # unrepeated key heads under GQA
        ours = implied_pattern(q, k, spec, None if model.is_causal else valid)
        rows = valid[:, None, :, None]  # compare the real query rows
        torch.testing.assert_close(ours * rows, ref[layer] * rows, atol=2e-5, rtol=0)


def test_bridge_sparse_scan_equals_dense(family):
    _, model, _ = family
    dets = [d for d in DETECTORS.values() if d.kind not in ("weights", "annotated")
            and (not d.bidirectional_only or not model.is_causal) and d.targets is not None]
    probe = text_prompts(model, TEXTS)
    info_d, info_s = {}, {}
    dense = scan(model, probe, dets, batch_size=2, path="dense", info=info_d)
    sparse = scan(model, probe, dets, batch_size=2, path="sparse", info=info_s)
    assert (info_d["scan_path"], info_s["scan_path"]) == ("dense", "sparse")
    for det in dense:
        n = dense[det].counts.clamp_min(1)[:, None, None]
        torch.testing.assert_close(sparse[det].sums / n, dense[det].sums / n, atol=1e-6, rtol=0)
    assert model.active_hooks() == []


def test_fused_attention_skips_the_pattern_on_rotary_models(family, monkeypatch):
    """Sparse scans run the HF attention fused (no pattern); q/k hooks still fire, logits unchanged."""
    from headlens.backends import fused as fused_mod

    monkeypatch.setattr(fused_mod, "MASK_BLOCK_BYTES", 4 * 2 * 40 * 7)  # Mistral's window mask: blocks of 7 queries
    name, model, _ = family
    tokens = torch.randint(10, 250, (2, 40), generator=torch.Generator().manual_seed(1))
    specs = model.attention_specs()
    fired: list[str] = []
    hooks = [(n, lambda x, hook: fired.append(hook.name)) for s in specs for n in (s.q_hook, s.k_hook)]
    hooks += [(f"blocks.{layer}.attn.hook_pattern", lambda x, hook: fired.append("pattern"))
              for layer in range(model.n_layers)]
    with torch.no_grad():
        ref = model(tokens)
        with model.fused_attention() as fused, model.hooks(hooks):
            out = model(tokens)
    assert fused == (name in ("llama", "qwen2", "mistral", "gemma"))
    assert ("pattern" in fired) != fused
    assert len([n for n in fired if n != "pattern"]) == 2 * model.n_layers
    torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)
    assert model.active_hooks() == []
    assert model.bridge.original_model.config._attn_implementation == "eager"
