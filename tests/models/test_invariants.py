"""Invariants that catch the silent head-transpose bug.

A wrong reshape in multi-head attention still runs and still gives rows that sum to one; only
invariants tell. Each invariant runs on the real model, where it must hold, and on deliberately
broken copies, where it must fail (so the test can actually see the bug it is named after):

* ``missing_transpose``: the split reshapes ``(B, T, H, d_head)`` to ``(B, H, T, d_head)`` where
  a ``transpose(1, 2)`` belongs (the hooks still see the correct q, k, v);
* ``wrong_view_order``: the split views ``(B, T, D)`` directly as ``(B, H, T, d_head)`` and the
  hooks see that wrong split (numerically the same attention as ``missing_transpose``, but
  self-consistent, so only invariants that do not trust the hooks can catch it);
* ``merge_without_transpose``: heads are merged from ``(B, H, T, d_head)`` without transposing
  back to ``(B, T, H, d_head)`` first.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from conftest import make_gpt

from headlens.models.gpt import GPT, MultiHeadAttention
from headlens.models.hooks import HookPoint

TOL = 1e-5
BUGS = ["missing_transpose", "wrong_view_order", "merge_without_transpose"]


class MissingTranspose(MultiHeadAttention):
    def split_heads(self, x: torch.Tensor, hook: HookPoint) -> torch.Tensor:
        B, T, _ = x.shape
        x = hook(x.view(B, T, self.n_heads, self.d_head))  # (B, T, H, d_head)
        return x.reshape(B, self.n_heads, T, self.d_head)  # BUG: positions and heads interleaved


class WrongViewOrder(MultiHeadAttention):
    def split_heads(self, x: torch.Tensor, hook: HookPoint) -> torch.Tensor:
        B, T, _ = x.shape
        x = x.reshape(B, self.n_heads, T, self.d_head)  # BUG: (B, T, D) read as (B, H, T, d_head)
        return hook(x.transpose(1, 2)).transpose(1, 2)  # hook sees (B, T, H, d_head) of the wrong split


class MergeWithoutTranspose(MultiHeadAttention):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, D = x.shape
        q, k, v = self.c_attn(x).split(self.d_model, dim=2)  # 3 x (B, T, D)
        q, k, v = (self.split_heads(t, h) for t, h in ((q, self.hook_q), (k, self.hook_k), (v, self.hook_v)))
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(self.d_head)  # (B, H, Q, K)
        scores = self.hook_attn_scores(scores.masked_fill(~self.mask[:T, :T], float("-inf")))
        z = self.hook_pattern(F.softmax(scores, dim=-1)) @ v  # (B, H, T, d_head)
        z = self.hook_z(z.transpose(1, 2)).transpose(1, 2)  # hook sees (B, T, H, d_head)
        return self.c_proj(z.reshape(B, T, D))  # BUG: merged from (B, H, T, d_head)


BROKEN = {"missing_transpose": MissingTranspose, "wrong_view_order": WrongViewOrder,
          "merge_without_transpose": MergeWithoutTranspose}


def broken_copy(model: GPT, bug: str) -> GPT:
    """Same weights, one attention bug in every layer."""
    broken = copy.deepcopy(model)
    for block in broken.transformer.h:
        block.attn.__class__ = BROKEN[bug]
    return broken


@pytest.fixture(scope="module")
def real() -> GPT:
    return make_gpt(11, n_layers=2, n_heads=4, d_model=32, init_range=0.2)


@pytest.fixture(scope="module")
def tokens() -> torch.Tensor:
    torch.manual_seed(3)
    return torch.randint(0, 256, (2, 11))


def subject(real: GPT, which: str) -> GPT:
    return real if which == "real" else broken_copy(real, which)


# -- the invariants: each returns the largest violation --------------------------------------


@torch.no_grad()
def permute_heads(model: GPT, perms: list[torch.Tensor]) -> GPT:
    """Reorder each layer's heads: q/k/v output blocks and c_proj input blocks together."""
    out = copy.deepcopy(model)
    D, d = model.cfg.d_model, model.cfg.d_head
    for block, perm in zip(out.transformer.h, perms, strict=True):
        attn = block.attn
        idx = torch.cat([perm[h] * d + torch.arange(d) for h in range(len(perm))])  # new head h <- old perm[h]
        qkv_idx = torch.cat([part * D + idx for part in range(3)])
        attn.c_attn.weight.copy_(attn.c_attn.weight[qkv_idx])
        attn.c_attn.bias.copy_(attn.c_attn.bias[qkv_idx])
        attn.c_proj.weight.copy_(attn.c_proj.weight[:, idx])
    return out


@torch.no_grad()
def head_permutation_violation(model: GPT, tokens: torch.Tensor) -> float:
    gen = torch.Generator().manual_seed(0)
    perms = [torch.randperm(model.n_heads, generator=gen) for _ in range(model.n_layers)]
    assert all(not torch.equal(p, torch.arange(model.n_heads)) for p in perms)
    permuted = permute_heads(model, perms)
    names = lambda n: n.endswith("hook_pattern")  # noqa: E731
    logits, cache = model.run_with_cache(tokens, names_filter=names)
    logits_p, cache_p = permuted.run_with_cache(tokens, names_filter=names)
    worst = float((logits - logits_p).abs().max())
    for layer, perm in enumerate(perms):
        worst = max(worst, float((cache.pattern(layer)[:, perm] - cache_p.pattern(layer)).abs().max()))
    return worst


@torch.no_grad()
def causality_violation(model: GPT, tokens: torch.Tensor) -> float:
    """Change token j: nothing at positions < j may change; patterns above the diagonal are 0."""
    worst = 0.0
    clean, cache = model.run_with_cache(tokens, names_filter=lambda n: n.endswith("hook_pattern"))
    for j in (3, 7):
        changed = tokens.clone()
        changed[:, j] = (changed[:, j] + 101) % 256
        worst = max(worst, float((model(changed)[:, :j] - clean[:, :j]).abs().max()))
    T = tokens.shape[1]
    future = ~torch.tril(torch.ones(T, T, dtype=torch.bool))
    for pattern in cache.values():
        worst = max(worst, float(pattern[..., future].abs().max()))
    return worst


@torch.no_grad()
def pattern_from_qk_violation(model: GPT, tokens: torch.Tensor) -> float:
    """softmax(q k^T / sqrt(d_head)) from the hooked per-head q and k equals hook_pattern."""
    _, cache = model.run_with_cache(tokens, names_filter=lambda n: n.endswith(("hook_q", "hook_k", "hook_pattern")))
    T, worst = tokens.shape[1], 0.0
    causal = torch.tril(torch.ones(T, T, dtype=torch.bool))
    for layer in range(model.n_layers):
        q = cache[f"blocks.{layer}.attn.hook_q"]  # (B, Q, H, d_head)
        k = cache[f"blocks.{layer}.attn.hook_k"]  # (B, K, H, d_head)
        scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(model.cfg.d_head)  # (B, H, Q, K)
        pattern = scores.masked_fill(~causal, float("-inf")).softmax(-1)
        worst = max(worst, float((pattern - cache.pattern(layer)).abs().max()))
    return worst


@torch.no_grad()
def single_head_violation(model: GPT, tokens: torch.Tensor, layer: int = 1, head: int = 2) -> float:
    """Zeroing every head but one through hook_z leaves exactly that head's term, computed here
    from the weight slices of that head alone."""
    cfg, attn = model.cfg, model.transformer.h[layer].attn
    d, D, T = cfg.d_head, cfg.d_model, tokens.shape[1]

    def keep_one(z: torch.Tensor, hook) -> torch.Tensor:  # z: (B, T, H, d_head)
        mask = torch.zeros(cfg.n_heads, 1)
        mask[head] = 1
        return z * mask

    captured = {}

    def grab(x, hook):
        captured[hook.name] = x

    model.run_with_hooks(tokens, fwd_hooks=[
        (f"blocks.{layer}.attn.hook_z", keep_one),
        (f"blocks.{layer}.hook_resid_pre", grab),
        (f"blocks.{layer}.hook_attn_out", grab),
    ])
    x = model.transformer.h[layer].ln_1(captured[f"blocks.{layer}.hook_resid_pre"])  # (B, T, D)
    rows = slice(head * d, (head + 1) * d)
    W_Q, W_K, W_V = (attn.c_attn.weight[p * D:(p + 1) * D][rows] for p in range(3))  # each (d_head, D)
    b_Q, b_K, b_V = (attn.c_attn.bias[p * D:(p + 1) * D][rows] for p in range(3))
    q, k, v = x @ W_Q.T + b_Q, x @ W_K.T + b_K, x @ W_V.T + b_V  # (B, T, d_head)
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(d)  # (B, Q, K)
    pattern = scores.masked_fill(~torch.tril(torch.ones(T, T, dtype=torch.bool)), float("-inf")).softmax(-1)
    term = (pattern @ v) @ attn.c_proj.weight[:, rows].T + attn.c_proj.bias  # (B, T, D)
    return float((term - captured[f"blocks.{layer}.hook_attn_out"]).abs().max())


INVARIANTS = {
    "head_permutation": head_permutation_violation,
    "causality": causality_violation,
    "pattern_from_qk": pattern_from_qk_violation,
    "single_head_isolation": single_head_violation,
}
# which bugs each invariant must expose (a hook-consistent bug cannot break pattern_from_qk)
CATCHES = {
    "head_permutation": BUGS,
    "causality": BUGS,
    "pattern_from_qk": ["missing_transpose"],
    "single_head_isolation": BUGS,
}


@pytest.mark.parametrize("invariant", list(INVARIANTS))
def test_invariant_holds_on_the_real_model(real, tokens, invariant):
    assert INVARIANTS[invariant](real, tokens) <= TOL
    assert real.active_hooks() == []


@pytest.mark.parametrize(
    "invariant, bug", [(inv, bug) for inv, bugs in CATCHES.items() for bug in bugs]
)
def test_invariant_fails_on_a_broken_copy(real, tokens, invariant, bug):
    broken = broken_copy(real, bug)
    assert broken(tokens).shape == real(tokens).shape  # the bug runs silently...
    assert INVARIANTS[invariant](broken, tokens) > 1e-3  # ...and the invariant sees it


@pytest.mark.parametrize("bug", BUGS)
@torch.no_grad()
def test_causality_on_the_unhooked_sdpa_path(real, tokens, bug):
    """Causality on the unhooked SDPA path (the broken copies share split_heads with it)."""
    changed = tokens.clone()
    changed[:, 5] = (changed[:, 5] + 1) % 256
    assert float((real(changed)[:, :5] - real(tokens)[:, :5]).abs().max()) <= TOL
    if bug != "merge_without_transpose":  # that copy always runs the explicit path
        broken = broken_copy(real, bug)
        assert float((broken(changed)[:, :5] - broken(tokens)[:, :5]).abs().max()) > 1e-3
