"""Long contexts on Hugging Face models: the LSE scan's q/k/scale/mask equal transformers' eager attention.

Every family of the architecture matrix (``tests/hf_families.py``, tiny random weights, nothing
downloads): GPT-2 (no rotary, fused qkv), GPT-NeoX (partial rotary), GPT-J (interleaved rotary), OPT
(query pre-scaled), Llama and Qwen2 (RoPE, GQA), Mistral (GQA + a sliding window of 16 < the prompt),
Gemma (multi-query, its own scaling), Phi-3 (fused qkv), BERT and RoBERTa (bidirectional, padded).
Beyond the matrix: Gemma-2 (logit soft-capping) and GPT-OSS (attention sinks), which SDPA cannot do.
Sparse scans run the HF attention fused (``headlens.models.hf.fused``) on all of them.
Targets given as a predicate over (query, key) score the same as index lists on all of them.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from headlens.detectors import DETECTORS, get_detector
from headlens.models.hf.boot import load_bridge
from headlens.probes.text import text_prompts
from headlens.scoring.lse import heads_first, implied_pattern
from headlens.scoring.scan import scan
from tests.hf_families import EXTRAS, FAMILIES, build, load_eager

FAMS = list({**FAMILIES, **EXTRAS})  # + GPT-OSS (attention sinks); Gemma 2 (soft-capping) is in both
# the bridge (TL 4.3) has hook_rot_q/k on these but never fires them: only the fused path shows q and k
SILENT_ROT = ("gpt_neox", "gptj", "phi3", "falcon")
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
    with model.fused_attention():  # the q and k a sparse scan reads
        _, cache = model.run_with_cache(tokens, names_filter=names, attention_mask=mask)
    with torch.no_grad():
        ref = eager(tokens, attention_mask=mask, output_attentions=True).attentions
    for layer, spec in enumerate(specs):
        q, k = heads_first(cache[spec.q_hook], spec.layout), heads_first(cache[spec.k_hook], spec.layout)
        assert k.shape[1] == {**FAMILIES, **EXTRAS}[name].n_kv_heads  # unrepeated key heads under GQA
        ours = implied_pattern(q, k, spec, None if model.is_causal else valid)
        rows = valid[:, None, :, None]  # compare the real query rows
        torch.testing.assert_close(ours * rows, ref[layer] * rows, atol=2e-5, rtol=0)


def test_bridge_sparse_scan_equals_dense(family, monkeypatch):
    """Index lists and predicates (every set detector by its rule: ``INDEX_MAX = 0``), dense and fused sparse,
    under GQA, Mistral's sliding window, soft-capping, sinks and BERT's padding: one set of scores to 1e-6."""
    _, model, _ = family
    monkeypatch.setattr("headlens.scoring.lse.BLOCK_BYTES", 4 * 2 * 4 * 40 * 5)  # blocks of a few query rows
    dets = [d for d in [*DETECTORS.values(), get_detector("streaming(s=2,w=5)")]
            if d.kind not in ("weights", "annotated")
            and (not d.bidirectional_only or not model.is_causal) and d.targets is not None]
    rules = [dataclasses.replace(d, name=f"{d.name}~rule", targets=None) for d in dets if d.predicate is not None]
    probe = text_prompts(model, TEXTS)
    info_d, info_s = {}, {}
    dense = scan(model, probe, dets, batch_size=2, path="dense", info=info_d)
    sparse = scan(model, probe, dets, batch_size=2, path="sparse", info=info_s)
    monkeypatch.setattr("headlens.scoring.scan.INDEX_MAX", 0)
    by_rule = {**scan(model, probe, rules, batch_size=2, path="sparse"),
               **{f"{k}@dense": v for k, v in scan(model, probe, rules, batch_size=2, path="dense").items()}}
    assert (info_d["scan_path"], info_s["scan_path"]) == ("dense", "sparse")
    assert {"duplicate_token~rule", "induction~rule", "streaming~rule"} <= set(by_rule)
    for det in dense:
        n = dense[det].counts.clamp_min(1)[:, None, None]
        torch.testing.assert_close(sparse[det].sums / n, dense[det].sums / n, atol=1e-6, rtol=0)
        for twin in (f"{det}~rule", f"{det}~rule@dense"):
            if twin in by_rule:
                torch.testing.assert_close(by_rule[twin].sums / n, dense[det].sums / n, atol=1e-6, rtol=0)
                assert torch.equal(by_rule[twin].counts, dense[det].counts)
    assert float(dense["duplicate_token"].counts.sum()) > 0
    assert model.active_hooks() == []


def test_fused_attention_skips_the_pattern(family, monkeypatch):
    """Sparse scans run the HF attention fused (no pattern) on every family; q/k hooks see what the bridge
    shows them, logits unchanged. Mistral's window mask and BERT's padding mask go through in query blocks."""
    from transformers import masking_utils
    from transformers.masking_utils import sdpa_mask

    from headlens.models.hf import fused as fused_mod

    monkeypatch.setattr(fused_mod, "MASK_BLOCK_BYTES", 4 * 2 * 40 * 7)  # an explicit mask: blocks of 7 queries
    monkeypatch.setattr(fused_mod, "BLOCK_BYTES", 4 * 2 * 4 * 40 * 7)  # soft-cap / sinks: blocks of 7 queries too
    eager = fused_mod._eager
    eager_modules: set[int] = set()
    monkeypatch.setattr(fused_mod, "_eager", lambda m, *a, **kw: eager_modules.add(id(m)) or eager(m, *a, **kw))
    full_masks: list[int] = []  # transformers' (B, 1, T, T) masks: none, the band masks replace them
    monkeypatch.setattr(masking_utils, "sdpa_mask", lambda *a, **kw: full_masks.append(1) or sdpa_mask(*a, **kw))
    name, model, _ = family
    tokens = torch.randint(10, 250, (2, 40), generator=torch.Generator().manual_seed(1))
    mask = None
    if not model.is_causal:  # a padded second prompt
        mask = torch.ones(2, 40, dtype=torch.long)
        mask[1, 25:] = 0
    specs = model.attention_specs()
    names = [n for s in specs for n in (s.q_hook, s.k_hook)]
    seen: dict[str, list[torch.Tensor]] = {}
    hooks = [(n, lambda x, hook: seen.setdefault(hook.name, []).append(x.clone())) for n in names]
    hooks += [(f"blocks.{layer}.attn.hook_pattern", lambda x, hook: seen.setdefault("pattern", []).append(x))
              for layer in range(model.n_layers)]
    with torch.no_grad():
        _, ref_cache = model.run_with_cache(tokens, names_filter=names, attention_mask=mask)
        ref = model(tokens, attention_mask=mask)
        full_masks.clear()  # the eager forwards above build theirs through sdpa_mask
        with model.fused_attention() as fused, model.hooks(hooks):
            out = model(tokens, attention_mask=mask)
    assert fused
    assert "pattern" not in seen
    assert len(eager_modules) == (model.n_layers if name in EXTRAS else 0)  # our blocked attention: soft-cap, sinks
    assert not full_masks
    for n in names:  # each q/k hook fired once, with the tensor the unfused bridge shows it
        assert len(seen[n]) == 1, n
        if name not in SILENT_ROT:
            torch.testing.assert_close(seen[n][0], ref_cache[n], atol=1e-5, rtol=0)
    assert (set(ref_cache) == set(names)) == (name not in SILENT_ROT)
    rows = slice(None) if mask is None else mask.bool()
    torch.testing.assert_close(out[rows], ref[rows], atol=1e-4, rtol=1e-4)
    assert model.active_hooks() == []
    assert model.bridge.original_model.config._attn_implementation == "eager"
    assert not fused_mod._OWNERS


def test_a_scan_whose_hooks_never_fire_fails_loudly(family, monkeypatch):
    """Unfused, the bridge never fires GPT-NeoX's, GPT-J's and Phi-3's hook_rot_q/k: an error, not zero scores."""
    from headlens.errors import HeadlensError

    name, model, _ = family
    if name not in SILENT_ROT:
        pytest.skip("the bridge fires this family's q/k hooks itself")
    monkeypatch.setattr(model, "fused_attention", None)
    with pytest.raises(HeadlensError, match=r"never fired blocks\.1\.attn\.hook_rot_q / blocks\.1\.attn\.hook_rot_k"):
        scan(model, text_prompts(model, TEXTS[:1]), [DETECTORS["previous_token"]], path="sparse")
    assert model.active_hooks() == []
