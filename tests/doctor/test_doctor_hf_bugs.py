"""Silent bugs planted at the attention function of Hugging Face models, and the doctor's check of that function.

Truth: the doctor's own reference attention with the bug's recipe (``headlens.doctor.bugs.reference_attention``,
the definition the native lesson model runs) on GPT-2's weights, which have no RoPE and no grouped-query
attention to get in the way; on every family, the model is restored when the block ends and the check names
the bug planted, passes the model's own function and cannot name a change that is no known bug.
"""

from __future__ import annotations

import pytest
import torch

from headlens.doctor.bugs import AttentionRecipe, apply_bug, reference_attention
from headlens.doctor.hf_bugs import (
    LM_BUGS,
    attention_function,
    check_attention_function,
    layer_modules,
    planted,
)
from tests import hf_families as hf

FAMILIES = ("gpt2", "llama", "gemma", "phi3", "gpt_neox")  # fused and separate projections, RoPE, GQA, MQA


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    root = tmp_path_factory.mktemp("hf_bugs")
    return {name: hf.load_eager(hf.build(name, root / name), name) for name in FAMILIES}


@pytest.mark.parametrize("bug", list(LM_BUGS))
def test_a_planted_bug_is_the_doctors_recipe_on_gpt2(models, bug):
    model = models["gpt2"]
    attn = model.transformer.h[0].attn
    seen = {}
    handles = [attn.register_forward_pre_hook(lambda m, args, kw: seen.__setitem__("x", kw.get("hidden_states",
                                                                                              args[0] if args else None)),
                                              with_kwargs=True),
               attn.register_forward_hook(lambda m, args, out: seen.__setitem__("y", out[0]))]
    ids = torch.randint(0, 200, (2, 9))
    try:
        with torch.no_grad(), planted(model, bug):
            model(ids)
    finally:
        for h in handles:
            h.remove()
    recipe = apply_bug(AttentionRecipe(n_heads=model.config.n_head), LM_BUGS[bug][1])
    want = reference_attention(seen["x"], attn.c_attn.weight.T, attn.c_attn.bias, attn.c_proj.weight.T,
                               attn.c_proj.bias, recipe)  # Conv1D stores (in, out)
    assert torch.allclose(seen["y"], want, atol=1e-5)


@pytest.mark.parametrize("family", FAMILIES)
def test_a_planted_bug_runs_silently_changes_the_logits_and_is_undone(models, family):
    model = models[family]
    ids = torch.randint(0, 200, (1, 12))
    with torch.no_grad():
        clean = model(ids).logits
        for bug in LM_BUGS:
            with planted(model, bug):
                broken = model(ids).logits
            assert broken.shape == clean.shape and torch.isfinite(broken).all()
            assert (broken - clean).abs().max() > 0.1
            assert torch.equal(model(ids).logits, clean)  # restored
    with pytest.raises(RuntimeError), planted(model, "missing_transpose_split"):  # restored on error, too
        raise RuntimeError("boom")
    with torch.no_grad():
        assert torch.equal(model(ids).logits, clean)


@pytest.mark.parametrize("family", FAMILIES)
def test_the_check_passes_the_models_own_attention_and_names_each_planted_bug(models, family):
    from transformers import AttentionInterface

    module = layer_modules(models[family])[1]
    own = AttentionInterface().get_interface("sdpa", None)
    assert check_attention_function(module, own).passed  # the other implementation computes the same attention
    for bug, (_, overrides) in LM_BUGS.items():
        fn = attention_function(apply_bug(AttentionRecipe(n_heads=1), overrides))
        report = check_attention_function(module, fn)
        assert not report.passed and report.diagnosis == bug, str(report)
        assert "FAILED" in str(report) and bug in str(report)


def test_the_check_cannot_name_a_change_that_is_no_known_bug(models):
    from headlens.doctor.hf_bugs import module_reference

    module = layer_modules(models["llama"])[0]
    ref = module_reference(module)

    def noisy(m, q, k, v, mask, **kw):
        out, w = ref(m, q, k, v, mask, **kw)
        return out + 0.01 * torch.randn_like(out), w

    report = check_attention_function(module, noisy)
    assert not report.passed and report.diagnosis is None
    assert "no known bug reproduces it" in report.diagnosis_title


def test_planting_an_unknown_bug_is_a_clear_error(models):
    from headlens.errors import ConfigError

    with pytest.raises(ConfigError, match="unknown bug"), planted(models["llama"], "no_such_bug"):
        pass
