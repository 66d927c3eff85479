"""Ablation removes exactly what flows through the chosen heads, and never leaks a hook."""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import make_gpt

import headlens
from headlens.errors import HeadlensError, ProbeError
from headlens.interventions.ablation import AblationError, Replacement, format_heads, parse_heads

torch.set_num_threads(1)  # tiny models: one thread is fastest on a shared 2-core machine


def tokens(seed: int = 1, batch: int = 3, T: int = 12) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (batch, T), generator=g)


def cache_z(model, toks, layer):
    _, cache = model.run_with_cache(toks, names_filter=f"blocks.{layer}.attn.hook_z")
    return cache[f"blocks.{layer}.attn.hook_z"]  # (B, T, H, d_head)


# -- parsing ------------------------------------------------------------------------------------
def test_parse_heads_forms():
    assert parse_heads("L1H2,L0H3", 2, 4) == [(1, 2), (0, 3)]
    assert parse_heads(" l1h2 , L1H2 ", 2, 4) == [(1, 2)]  # case-insensitive, duplicates dropped
    assert parse_heads(["L0H0", (1, 3)], 2, 4) == [(0, 0), (1, 3)]
    assert format_heads([(1, 2), (0, 3)]) == "L1H2+L0H3"


@pytest.mark.parametrize(
    ("spec", "needle"),
    [("L1X2", "malformed head id 'L1X2'"), ("1.2", "malformed"), ("L2H0", "out of range"), ("L0H4", "out of range"),
     ("", "no heads"), ([(0, 1, 2)], "malformed head"), ([(0, True)], "malformed head")],
)
def test_parse_heads_errors(spec, needle):
    with pytest.raises(AblationError, match=needle) as err:
        parse_heads(spec, 2, 4)
    assert isinstance(err.value, HeadlensError) and err.value.exit_code == 2


# -- exact expectations -------------------------------------------------------------------------
@pytest.mark.parametrize("head", [(0, 1), (1, 3)])
def test_zero_ablation_equals_zeroing_the_heads_output_weights(head):
    model = make_gpt(0)
    layer, h = head
    d = model.cfg.d_head
    surgery = copy.deepcopy(model)
    with torch.no_grad():  # nn.Linear is (out, in): head h reads z columns h*d:(h+1)*d
        surgery.transformer.h[layer].attn.c_proj.weight[:, h * d : (h + 1) * d] = 0
    x = tokens()
    with torch.no_grad(), headlens.ablate(model, [head]):
        ablated = model(x)
    torch.testing.assert_close(ablated, surgery(x), rtol=0, atol=1e-6)


def test_ablation_changes_only_that_heads_slice():
    model = make_gpt(0, n_layers=3)
    x = tokens()
    clean = {layer: cache_z(model, x, layer) for layer in range(3)}
    with headlens.ablate(model, "L1H2"):
        z0, z1 = cache_z(model, x, 0), cache_z(model, x, 1)
    torch.testing.assert_close(z0, clean[0], rtol=0, atol=0)  # upstream untouched
    others = [0, 1, 3]
    torch.testing.assert_close(z1[:, :, others], clean[1][:, :, others], rtol=0, atol=0)
    assert torch.all(z1[:, :, 2] == 0)


def test_head_with_no_output_weights_is_a_noop():
    model = make_gpt(0)
    with torch.no_grad():
        model.transformer.h[1].attn.c_proj.weight[:, 8:16] = 0  # head 1 of layer 1 writes nothing
    x = tokens()
    ref = tokens(seed=7, batch=4, T=16)
    clean = model(x)
    for method in ("zero", "mean", "resample"):
        with torch.no_grad(), headlens.ablate(model, "L1H1", method=method, reference=ref):
            torch.testing.assert_close(model(x), clean, rtol=0, atol=0)


def test_zero_ablating_a_whole_layer_leaves_only_the_output_bias():
    model = make_gpt(0)
    x = tokens()
    bias = model.transformer.h[0].attn.c_proj.bias
    with torch.no_grad():
        only_bias = model.run_with_hooks(x, fwd_hooks=[("blocks.0.hook_attn_out", lambda a, hook: bias.expand_as(a))])
        with headlens.ablate(model, [(0, h) for h in range(4)]):
            ablated = model(x)
        torch.testing.assert_close(ablated, only_bias, rtol=0, atol=1e-6)
        # with the bias zeroed too, it is exactly "no attention sublayer in block 0"
        bias.zero_()
        no_attn = model.run_with_hooks(x, fwd_hooks=[("blocks.0.hook_attn_out", lambda a, hook: torch.zeros_like(a))])
        with headlens.ablate(model, [(0, h) for h in range(4)]):
            torch.testing.assert_close(model(x), no_attn, rtol=0, atol=1e-6)


def test_weights_never_modified():
    model = make_gpt(0)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad(), headlens.ablate(model, "L0H0,L1H1", method="mean", reference=tokens(5, 4, 16)):
        model(tokens())
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


# -- reference set semantics --------------------------------------------------------------------
def test_mean_ablation_uses_the_per_position_reference_mean():
    model = make_gpt(0)
    ref = tokens(seed=5, batch=4, T=8)
    ref_z = cache_z(model, ref, 1)[:, :, 3]  # (R, T_ref, d_head)
    x = tokens(seed=1, batch=2, T=12)  # longer than the reference
    with headlens.ablate(model, "L1H3", method="mean", reference=ref):
        z = cache_z(model, x, 1)[:, :, 3]  # (B, T, d_head)
    for b in range(2):
        torch.testing.assert_close(z[b, :8], ref_z.mean(0))  # position t gets the mean at t
        torch.testing.assert_close(z[b, 8:], ref_z.mean((0, 1)).expand(4, -1))  # past the reference: overall mean


def test_mean_reference_from_texts():
    model = make_gpt(0)
    texts = ["abcdefgh", "hello world", "0123456789"]
    ref = torch.stack([model.to_tokens(t)[0][:9] for t in texts])  # cut to the shortest (1 + 8 tokens)
    a = Replacement.build(model, [0], "mean", texts).z(0, torch.zeros(1, 9, 4, 8))
    b = Replacement.build(model, [0], "mean", ref).z(0, torch.zeros(1, 9, 4, 8))
    torch.testing.assert_close(a, b)


def test_resample_takes_another_reference_prompt_seeded():
    model = make_gpt(0)
    x = tokens(seed=1, batch=6, T=10)
    ref_z = cache_z(model, x, 0)
    with headlens.ablate(model, "L0H2", method="resample", reference=x, seed=3):
        z = cache_z(model, x, 0)

    def drawn(z: torch.Tensor) -> list[int]:
        """The reference row whose L0H2 activations each input row now carries, found by comparison."""
        out = []
        for b in range(6):
            same = [r for r in range(6) if torch.allclose(z[b, :, 2], ref_z[r, :, 2], atol=1e-6)]
            assert len(same) == 1, (b, same)  # exactly one reference prompt, whole
            torch.testing.assert_close(z[b, :, 0], ref_z[b, :, 0])  # other heads keep their own
            out.append(same[0])
        return out

    rows = drawn(z)
    assert all(r != b for b, r in enumerate(rows))  # never its own activations
    with headlens.ablate(model, "L0H2", method="resample", reference=x, seed=3):
        assert drawn(cache_z(model, x, 0)) == rows  # the seed fixes the draw
    others = []
    for s in range(4, 8):
        with headlens.ablate(model, "L0H2", method="resample", reference=x, seed=s):
            others.append(drawn(cache_z(model, x, 0)))
    assert any(o != rows for o in others)  # another seed, another draw


def test_resample_needs_a_long_enough_reference():
    model = make_gpt(0)
    with pytest.raises(ProbeError, match="at least as long"), headlens.ablate(
        model, "L0H0", method="resample", reference=tokens(T=5)
    ):
        model(tokens(T=10))
    assert model.active_hooks() == []


def test_method_errors():
    model = make_gpt(0)
    with pytest.raises(AblationError, match="unknown ablation method 'mean2'"), headlens.ablate(model, "L0H0", "mean2"):
        pass
    with pytest.raises(AblationError, match="needs reference prompts"), headlens.ablate(model, "L0H0", "mean"):
        pass
    assert model.active_hooks() == []


def test_uniform_ablation_equals_a_hand_computed_uniform_head():
    model = make_gpt(0)
    x = tokens()
    layer, h = 1, 2
    with torch.no_grad():
        _, cache = model.run_with_cache(x, names_filter=lambda n: n.startswith("blocks.1.attn.hook_"))
        v = cache["blocks.1.attn.hook_v"][:, :, h]  # (B, T, d_head)
        T = x.shape[1]
        by_hand = torch.stack([v[:, : q + 1].mean(1) for q in range(T)], dim=1)  # (B, T, d): mean over k <= q
        z = cache["blocks.1.attn.hook_z"].clone()
        z[:, :, h] = by_hand
        want = model.run_with_hooks(x, fwd_hooks=[("blocks.1.attn.hook_z", lambda t, hook: z)])
        # the same head through its pattern: uniform weights 1/(q+1) on the causal window
        uniform = torch.tril(torch.ones(T, T)) / torch.arange(1, T + 1)[:, None]  # (Q, K)

        def flat(p, hook):
            p = p.clone()
            p[:, h] = uniform
            return p

        via_pattern = model.run_with_hooks(x, fwd_hooks=[("blocks.1.attn.hook_pattern", flat)])
        with headlens.ablate(model, [(layer, h)], method="uniform"):
            got = model(x)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    torch.testing.assert_close(got, via_pattern, rtol=0, atol=1e-5)
    assert not torch.allclose(got, model(x), atol=1e-4)
    assert model.active_hooks() == []


def test_uniform_z_with_grouped_kv_heads_and_padding():
    from headlens.interventions.ablation import uniform_z

    v = torch.arange(12.0).view(1, 3, 2, 2)  # (B, T, H_kv=2, d=2)
    z = uniform_z(v, 4)  # heads 0, 1 read kv head 0; heads 2, 3 read kv head 1
    assert z.shape == (1, 3, 4, 2)
    torch.testing.assert_close(z[0, 2, 1], v[0, :, 0].mean(0))
    torch.testing.assert_close(z[0, 1, 3], v[0, :2, 1].mean(0))
    visible = torch.tensor([[True, False, True]])
    torch.testing.assert_close(uniform_z(v, 2, visible)[0, 1, 1], (v[0, 0, 1] + v[0, 2, 1]) / 2)
    with pytest.raises(AblationError, match="3 query heads"):
        uniform_z(v, 3)


# -- hooks never leak ---------------------------------------------------------------------------
def test_hooks_removed_on_exit_and_on_error():
    model = make_gpt(0)
    with headlens.ablate(model, "L0H0,L1H1"):
        assert sorted(model.active_hooks()) == ["blocks.0.attn.hook_z", "blocks.1.attn.hook_z"]
    assert model.active_hooks() == []
    with pytest.raises(RuntimeError, match="boom"), headlens.ablate(model, "L1H1"):
        model(tokens())
        raise RuntimeError("boom")
    assert model.active_hooks() == []
    with pytest.raises(AblationError), headlens.ablate(model, "L9H9"):
        pass
    assert model.active_hooks() == []


def test_hooks_removed_when_forward_fails():
    model = make_gpt(0, n_ctx=16)
    with pytest.raises(ProbeError), headlens.ablate(model, "L0H0"):
        model(tokens(T=20))  # longer than the context
    assert model.active_hooks() == []
    clean = model(tokens())
    with headlens.ablate(model, "L0H0"):
        pass
    torch.testing.assert_close(model(tokens()), clean, rtol=0, atol=0)


def test_nested_ablations_compose():
    model = make_gpt(0)
    x = tokens()
    with torch.no_grad():
        with headlens.ablate(model, "L0H1"), headlens.ablate(model, "L1H2"):
            nested = model(x)
        with headlens.ablate(model, "L0H1,L1H2"):
            joint = model(x)
    torch.testing.assert_close(nested, joint, rtol=0, atol=0)
    assert model.active_hooks() == []


# -- TransformerBridge backend ------------------------------------------------------------------
@pytest.fixture(scope="module")
def bridged(tmp_path_factory):
    from headlens.models import export
    from headlens.models.hf.boot import load_bridge

    native = make_gpt(0)
    out = export.export_hf(native, tmp_path_factory.mktemp("hf") / "tiny")
    return native, load_bridge(out)


def test_bridge_ablation_matches_native(bridged):
    native, bridge = bridged
    x = tokens(seed=2, batch=2, T=10)
    x[:, 0] = native.bos_token_id
    with torch.no_grad():
        for spec, method in (("L1H2", "zero"), ("L0H1,L1H3", "mean"), ("L0H2,L1H0", "uniform")):
            with headlens.ablate(native, spec, method, reference=x):
                want = native(x)
            with headlens.ablate(bridge, spec, method, reference=x):
                got = bridge(x)
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
            assert not torch.allclose(want, native(x), atol=1e-5)  # the ablation did something
    assert bridge.active_hooks() == []


def test_lazy_export_and_light_import():
    import subprocess
    import sys

    code = ("import sys, headlens; assert 'headlens.interventions.ablation' not in sys.modules; "
            "f = headlens.ablate; assert f.__module__ == 'headlens.interventions.ablation'; "
            "assert 'pandas' not in sys.modules and 'transformer_lens' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)
