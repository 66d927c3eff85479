"""Hooks: observe, replace, cache, and never leak (also when a hook or the block raises)."""

from __future__ import annotations

import pytest
import torch
from conftest import make_gpt

from headlens.errors import HeadlensError
from headlens.models.hooks import HookPoint, tl_hook_name

PATTERN = "blocks.0.attn.hook_pattern"


@pytest.fixture(scope="module")
def model():
    return make_gpt(0)


@pytest.fixture(scope="module")
def tokens():
    torch.manual_seed(0)
    return torch.randint(0, 256, (2, 10))


def test_hook_names_follow_transformerlens(model):
    names = set(model.hook_dict)
    for layer in range(model.n_layers):
        for suffix in ("hook_q", "hook_k", "hook_v", "hook_z", "hook_attn_scores", "hook_pattern"):
            assert f"blocks.{layer}.attn.{suffix}" in names
        for suffix in ("hook_resid_pre", "hook_attn_out", "hook_resid_mid", "hook_mlp_out", "hook_resid_post"):
            assert f"blocks.{layer}.{suffix}" in names
        assert f"blocks.{layer}.mlp.hook_post" in names
    assert {"hook_embed", "hook_pos_embed"} <= names
    assert tl_hook_name("transformer.h.11.attn.hook_z") == "blocks.11.attn.hook_z"


def test_cache_shapes(model, tokens):
    _, cache = model.run_with_cache(tokens)
    B, T, H, d = 2, 10, model.cfg.n_heads, model.cfg.d_head
    assert cache["blocks.1.attn.hook_q"].shape == (B, T, H, d)
    assert cache["blocks.1.attn.hook_z"].shape == (B, T, H, d)
    assert cache["blocks.1.attn.hook_pattern"].shape == (B, H, T, T)
    assert cache.pattern(1) is cache["blocks.1.attn.hook_pattern"]
    torch.testing.assert_close(cache.pattern(0).sum(-1), torch.ones(B, H, T))
    assert model.active_hooks() == []


def test_observing_hook_changes_nothing_and_replacing_hook_does(model, tokens):
    clean = model(tokens)
    seen = []
    out = model.run_with_hooks(tokens, fwd_hooks=[(PATTERN, lambda x, hook: seen.append(hook.name))])
    assert seen == [PATTERN]
    torch.testing.assert_close(out, clean, atol=1e-6, rtol=0)
    zeroed = model.run_with_hooks(tokens, fwd_hooks=[("blocks.0.attn.hook_z", lambda z, hook: z * 0)])
    assert (zeroed - clean).abs().max() > 1e-4


@pytest.mark.parametrize(
    "names_filter, expected",
    [
        (PATTERN, {PATTERN}),
        ([PATTERN, "blocks.1.attn.hook_z"], {PATTERN, "blocks.1.attn.hook_z"}),
        (lambda n: n.endswith("hook_pattern"), {PATTERN, "blocks.1.attn.hook_pattern"}),
    ],
)
def test_names_filter_forms(model, tokens, names_filter, expected):
    _, cache = model.run_with_cache(tokens, names_filter=names_filter)
    assert set(cache) == expected
    assert model.active_hooks() == []


def test_hook_that_raises_leaves_no_hook(model, tokens):
    def boom(x, hook):
        raise RuntimeError("hook failed")

    with pytest.raises(RuntimeError, match="hook failed"):
        model.run_with_hooks(tokens, fwd_hooks=[(PATTERN, boom), ("blocks.1.attn.hook_z", lambda x, hook: None)])
    assert model.active_hooks() == []
    with pytest.raises(RuntimeError, match="hook failed"), model.hooks([(lambda n: n.endswith("hook_q"), boom)]):
        model.run_with_cache(tokens)  # the cache's own hooks go too
    assert model.active_hooks() == []


def test_context_manager_removes_hooks_when_the_block_raises(model, tokens):
    with pytest.raises(KeyError), model.hooks([(PATTERN, lambda x, hook: None)]):
        assert model.active_hooks() == [PATTERN]
        raise KeyError("user code failed")
    assert model.active_hooks() == []


def test_unknown_hook_name_is_an_error_and_partial_installs_are_undone(model, tokens):
    with pytest.raises(HeadlensError, match="hook_patern"):
        model.run_with_hooks(tokens, fwd_hooks=[(PATTERN, lambda x, hook: None), ("blocks.0.attn.hook_patern", print)])
    assert model.active_hooks() == []


def test_nested_contexts_remove_only_their_own_hooks(model, tokens):
    outer = lambda x, hook: None  # noqa: E731
    with model.hooks([(PATTERN, outer)]):
        with model.hooks([(PATTERN, lambda x, hook: None)]):
            assert len(model.hook_dict[PATTERN].fns) == 2
        assert model.hook_dict[PATTERN].fns == [outer]
    assert model.active_hooks() == []


def test_hookpoint_context_is_cleared_with_its_hooks(model, tokens):
    def stash(x, hook):
        hook.ctx["n"] = hook.ctx.get("n", 0) + 1

    with model.hooks([(PATTERN, stash)]):
        model(tokens)
        assert model.hook_dict[PATTERN].ctx == {"n": 1}
    assert model.hook_dict[PATTERN].ctx == {}


def test_hookpoint_chains_replacements():
    hp = HookPoint()
    hp.add_hook(lambda x, hook: x + 1)
    hp.add_hook(lambda x, hook: None)
    hp.add_hook(lambda x, hook: x * 3)
    assert hp(torch.zeros(1)).item() == 3.0
    hp.remove_hooks()
    assert not hp.has_hooks
