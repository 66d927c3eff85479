"""check_attention on a gallery of attention modules: correct ones pass, broken ones get the right name."""

from __future__ import annotations

import json

import pytest
import torch
from attention_gallery import BROKEN, CORRECT, D_MODEL, N_HEADS, build
from torch import nn

from headlens.doctor import check_attention
from headlens.doctor.bugs import AttentionRecipe, known_bugs, reference_attention
from headlens.doctor.layouts import LayoutError
from headlens.errors import HeadlensError
from headlens.models.config import ModelConfig
from headlens.models.gpt import MultiHeadAttention


@pytest.mark.parametrize("name", sorted(CORRECT))
def test_correct_modules_pass(name: str) -> None:
    report = check_attention(build(CORRECT[name]), d_model=D_MODEL, n_heads=N_HEADS, causal=True)
    assert report.passed, str(report)
    assert report.diagnosis is None
    assert report.max_abs_diff <= report.tolerance
    assert {p.name for p in report.probes} == {"causality", "head_permutation", "single_head_isolation"}
    assert all(p.passed for p in report.probes)


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_broken_modules_are_flagged_and_named(name: str) -> None:
    factory, expected = BROKEN[name]
    report = check_attention(build(factory), d_model=D_MODEL, n_heads=N_HEADS, causal=True)
    assert not report.passed
    assert report.diagnosis == expected, str(report)
    best = report.evidence[0]
    assert best.matches and best.max_abs_diff <= report.tolerance
    assert report.max_abs_diff > 100 * report.tolerance  # a real difference, not rounding


def test_invariant_probes_catch_layout_bugs() -> None:
    for name in ("missing_transpose_split", "missing_transpose_merge", "hard_coded_head_dim"):
        probes = {p.name: p for p in check_attention(build(BROKEN[name][0]), D_MODEL, N_HEADS).probes}
        assert not probes["head_permutation"].passed, name
    for name in ("mask_wrong_axis", "forgot_mask", "softmax_wrong_axis"):
        probes = {p.name: p for p in check_attention(build(BROKEN[name][0]), D_MODEL, N_HEADS).probes}
        assert not probes["causality"].passed, name
        assert probes["head_permutation"].passed, name  # heads are still heads


def test_bidirectional_mha_passes_and_a_causal_one_is_named() -> None:
    mha = build(lambda: nn.MultiheadAttention(D_MODEL, N_HEADS, batch_first=True))
    report = check_attention(mha, d_model=D_MODEL, n_heads=N_HEADS, causal=False)
    assert report.passed and "causality" not in {p.name for p in report.probes}
    causal = build(CORRECT["nanogpt_fused"])
    report = check_attention(causal, d_model=D_MODEL, n_heads=N_HEADS, causal=False)
    assert report.diagnosis == "unexpected_causal_mask"


def test_reference_recipe_equals_headlens_attention() -> None:
    torch.manual_seed(0)
    mha = MultiHeadAttention(ModelConfig(n_layers=1, n_heads=4, d_model=32, n_ctx=9, d_vocab=1))
    with torch.no_grad():
        mha.c_attn.bias.normal_()
    x = torch.randn(2, 9, 32)
    out = reference_attention(x, mha.c_attn.weight, mha.c_attn.bias, mha.c_proj.weight, mha.c_proj.bias,
                              AttentionRecipe(n_heads=4))
    torch.testing.assert_close(out, mha(x), atol=1e-5, rtol=1e-5)


def test_every_bug_changes_the_output() -> None:
    torch.manual_seed(0)
    w, b, wo, bo = torch.randn(96, 32) / 3, torch.randn(96), torch.randn(32, 32), torch.randn(32)
    x = torch.randn(2, 7, 32, dtype=torch.float64)
    w, b, wo, bo = (t.double() for t in (w, b, wo, bo))
    base = AttentionRecipe(n_heads=4)
    ref = reference_attention(x, w, b, wo, bo, base)
    for bug in known_bugs(32, 4, causal=True):
        for label, overrides in bug.variants:
            out = reference_attention(x, w, b, wo, bo, AttentionRecipe(**{**base.__dict__, **overrides}))
            assert not torch.allclose(out.nan_to_num(), ref, atol=1e-6), (bug.name, label)


def test_user_module_is_not_modified() -> None:
    module = build(CORRECT["nanogpt_fused"]).train()
    before = {k: v.clone() for k, v in module.state_dict().items()}
    check_attention(module, D_MODEL, N_HEADS)
    assert module.training
    for k, v in module.state_dict().items():
        assert v.dtype == torch.float32 and torch.equal(v, before[k])


def test_report_renders_and_serialises() -> None:
    report = check_attention(build(BROKEN["missing_transpose_merge"][0]), D_MODEL, N_HEADS)
    text = str(report)
    assert "FAILED" in text and "missing_transpose_merge" in text and "head_permutation" in text
    data = json.loads(json.dumps(report.to_dict()))
    assert data["diagnosis"] == "missing_transpose_merge" and data["passed"] is False
    assert data["evidence"][0]["matches"] is True


def test_unrecognised_module_is_a_clear_error() -> None:
    class Weird(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.mixer = nn.Linear(D_MODEL, D_MODEL)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.mixer(x)

    with pytest.raises(LayoutError, match="cannot find q/k/v/out projections"):
        check_attention(Weird(), D_MODEL, N_HEADS)
    with pytest.raises(HeadlensError, match=r"not divisible|positive multiple"):
        check_attention(build(CORRECT["nanogpt_fused"]), D_MODEL, 5)


def test_conv1d_layout_is_accepted() -> None:
    class Conv1D(nn.Module):  # Hugging Face's GPT-2 projection: weight stored (in, out)
        def __init__(self, nf: int, nx: int) -> None:
            super().__init__()
            self.weight = nn.Parameter(torch.randn(nx, nf) * 0.2)
            self.bias = nn.Parameter(torch.randn(nf) * 0.1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x @ self.weight + self.bias

    module = build(CORRECT["nanogpt_fused"])
    module.c_attn, module.c_proj = Conv1D(3 * D_MODEL, D_MODEL), Conv1D(D_MODEL, D_MODEL)
    assert check_attention(module, D_MODEL, N_HEADS).passed


def test_bias_free_projections_and_custom_call() -> None:
    class NoBias(nn.Module):
        """Separate bias-free projections; forward takes (x, mask) like many codebases."""

        def __init__(self) -> None:
            super().__init__()
            self.query, self.key, self.value = (nn.Linear(D_MODEL, D_MODEL, bias=False) for _ in range(3))
            self.output = nn.Linear(D_MODEL, D_MODEL, bias=False)

        def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
            B, T, _ = x.shape
            q, k, v = (p(x).view(B, T, N_HEADS, -1).transpose(1, 2) for p in (self.query, self.key, self.value))
            y = nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # (B, H, T, d_head)
            return self.output(y.transpose(1, 2).reshape(B, T, D_MODEL))

    def call(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
        T = x.shape[1]
        return module(x, torch.ones(T, T, dtype=torch.bool).tril())

    report = check_attention(build(NoBias), D_MODEL, N_HEADS, call=call)
    assert report.passed, str(report)
    assert "query/key/value" in report.layout
    wrong = check_attention(build(NoBias), D_MODEL, N_HEADS,
                            call=lambda m, x: m(x, torch.ones(x.shape[1], x.shape[1], dtype=torch.bool)))
    assert wrong.diagnosis == "no_mask"


def test_an_unknown_difference_is_reported_not_misnamed() -> None:
    class WithResidual(CORRECT["nanogpt_fused"]):  # returns x + attention(x): not a known bug
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + super().forward(x)

    report = check_attention(build(WithResidual), D_MODEL, N_HEADS)
    assert not report.passed and report.diagnosis is None
    assert "no known bug reproduces it" in report.diagnosis_title
    assert not any(e.matches for e in report.evidence)
