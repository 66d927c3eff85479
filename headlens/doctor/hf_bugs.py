"""The silent multi-head bugs planted in a Hugging Face causal LM, and the doctor's check of an attention function.

Why at the attention function: every ``transformers`` family (Llama, Mistral, Qwen2, Gemma, Phi-3, GPT-2 ...)
computes attention through one boundary, ``ALL_ATTENTION_FUNCTIONS[config._attn_implementation](module,
query, key, value, attention_mask, scaling=...)``, with ``query`` ``(B, H, T, d)`` after RoPE and ``key`` /
``value`` ``(B, H_kv, T, d)`` before the key/value heads are repeated. A bug registered there runs on the
model's own weights, RoPE and grouped-query attention in any family, and the model still maps tokens to
logits of the right shape: nothing crashes. The bugs are the doctor's own recipes
(:class:`headlens.doctor.bugs.AttentionRecipe` overrides, :data:`headlens.doctor.inject.LESSON_BUGS`), so the
real model breaks the way the native lesson model does:

* ``missing_transpose_split``: q, k, v stay ``(B, T, H, d)`` (the transpose after the view is missing), the key
  and value heads repeated along the head axis; attention then mixes along the heads (for every position,
  heads attend over heads, causally along the head index) and the code's merge, ``transpose(1, 2)`` and
  ``reshape(B, T, d_model)``, mixes positions too;
* ``missing_transpose_merge``: attention is right, its ``(B, H, T, d)`` output is reshaped straight to
  ``(B, T, d_model)``: positions and heads mixed, future positions leak into the past.

Both mix positions, so a bugged model is run on the whole sequence at every step (no key/value cache).

:func:`check_attention_function` is :func:`headlens.doctor.check_attention` at this boundary: random q, k, v
(scores of standard deviation ~2), the layer's own attention function with a causal mask as the reference,
then every known bug that can sit at the boundary replayed; the one that reproduces the output is the
diagnosis. It needs no weights, so it checks a layer with RoPE and grouped-query attention that
``check_attention`` (equal key/value widths, no RoPE) cannot take.
"""

from __future__ import annotations

import contextlib
import math
import sys
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.nn.functional as F

from headlens.doctor.bugs import AttentionRecipe, _keep_mask, apply_bug, known_bugs
from headlens.doctor.inject import LESSON_BUGS
from headlens.doctor.report import AttentionReport, Evidence
from headlens.errors import ConfigError

LM_BUGS = {name: LESSON_BUGS[name] for name in ("missing_transpose_split", "missing_transpose_merge")}
Record = Callable[[int, torch.Tensor], None]  # (layer index, pattern (B, A, S, S)) of a bugged pass


def recipe_attention(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, recipe: AttentionRecipe,
                     scaling: float, record: Record | None = None) -> torch.Tensor:
    """Attention of ``query`` ``(B, H, T, d)`` over ``key`` / ``value`` ``(B, H_kv, T, d)`` under ``recipe``,
    returned as the attention function returns it, ``(B, T, H, d)`` (the module reshapes it to ``(B, T, H d)``).

    The default recipe is correct causal attention (equal to ``transformers``' eager attention without
    soft-capping, sliding windows or sinks: tested).
    """
    B, H, T, d = query.shape
    if key.shape[2] != T:
        raise ConfigError(f"a planted bug needs the whole sequence at once ({T} queries, {key.shape[2]} keys): "
                          f"run without a key/value cache")
    n_rep = H // key.shape[1]
    q = query
    k, v = (t.repeat_interleave(n_rep, dim=1) for t in (key, value))  # (B, H, T, d): repeat_kv
    if recipe.split == "no_transpose":
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # (B, T, H, d): the head axis read as positions
    elif recipe.split != "standard":
        raise ConfigError(f"split {recipe.split!r} cannot be replayed at the attention function")
    scale = {"sqrt_d_head": scaling, "sqrt_d_model": 1 / math.sqrt(H * d), "d_head": 1 / d, "none": 1.0}[recipe.scale]
    scores = (q @ k.transpose(-2, -1)) * scale  # (B, A, S, S)
    keep = _keep_mask(scores.shape[-1], recipe.mask, scores.device)
    if keep is not None:
        scores = scores.masked_fill(~keep, float("-inf"))
    pattern = F.softmax(scores.float(), dim=recipe.softmax_dim).to(q.dtype)  # (B, A, S, S)
    if record is not None:
        record(int(getattr(module, "layer_idx", -1)), pattern)
    z = pattern @ v  # (B, A, S, d)
    merged = z.transpose(1, 2) if recipe.merge == "standard" else z  # memory order the code's reshape reads
    return merged.reshape(B, T, H, d)


def attention_function(recipe: AttentionRecipe, record: Record | None = None) -> Callable[..., Any]:
    """A ``transformers`` attention function computing ``recipe`` (register it with ``AttentionInterface``)."""

    def attend(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask: Any,
               scaling: float | None = None, dropout: float = 0.0, **kwargs: Any) -> tuple[torch.Tensor, None]:
        scale = scaling if scaling is not None else query.shape[-1] ** -0.5
        return recipe_attention(module, query, key, value, recipe, float(scale), record), None

    return attend


def _configs(model: Any) -> list[Any]:
    """Every config object the model's modules read ``_attn_implementation`` from (sub-configs included)."""
    seen: dict[int, Any] = {}
    for module in [model, *model.modules()]:
        cfg = getattr(module, "config", None)
        if cfg is not None and hasattr(cfg, "_attn_implementation"):
            seen.setdefault(id(cfg), cfg)
    return list(seen.values())


@contextlib.contextmanager
def planted(model: Any, bug: str, record: Record | None = None) -> Iterator[Any]:
    """Inside the block, ``model`` (a ``transformers`` causal LM) computes attention with ``bug`` (a key of
    :data:`LM_BUGS`) in every layer; its weights are untouched and it is restored on exit, also on error."""
    from transformers import AttentionInterface

    if bug not in LM_BUGS:
        raise ConfigError(f"unknown bug {bug!r}; expected one of {', '.join(LM_BUGS)}")
    name = f"headlens_{bug}"
    recipe = apply_bug(AttentionRecipe(n_heads=int(model.config.num_attention_heads)), LM_BUGS[bug][1])
    AttentionInterface.register(name, attention_function(recipe, record))
    configs = _configs(model)
    before = [cfg._attn_implementation for cfg in configs]
    try:
        for cfg in configs:
            cfg._attn_implementation = name
        yield model
    finally:
        for cfg, impl in zip(configs, before, strict=True):
            cfg._attn_implementation = impl


def module_reference(module: Any) -> Callable[..., Any]:
    """The attention function ``module`` runs with ``eager`` attention: its family's own ``eager_attention_forward``."""
    family = sys.modules.get(type(module).__module__)
    fn = getattr(family, "eager_attention_forward", None)
    if fn is None:
        raise ConfigError(f"{type(module).__name__} has no eager attention function the doctor can compare with")
    return fn


def _inputs(module: Any, seq_len: int, seed: int, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    """Random (query, key, value) for ``module``'s head layout, scaled so that scores have std ~2."""
    H = int(module.config.num_attention_heads)
    d = int(getattr(module, "head_dim", module.config.hidden_size // H))
    H_kv = H // int(getattr(module, "num_key_value_groups", 1))
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(2, H, seq_len, d, generator=g, dtype=dtype)  # (B, H, T, d)
    k, v = (torch.randn(2, H_kv, seq_len, d, generator=g, dtype=dtype) for _ in range(2))  # (B, H_kv, T, d)
    spread = float((q @ k.repeat_interleave(H // H_kv, 1).transpose(-2, -1)).std()) * float(module.scaling)
    return q * math.sqrt(2.0 / spread), k * math.sqrt(2.0 / spread), v


def check_attention_function(module: Any, fn: Callable[..., Any], seq_len: int = 11, seed: int = 0) -> AttentionReport:
    """Does ``fn`` (an attention function, as ``transformers`` calls it for ``module``) compute causal multi-head
    attention? Compared with ``module``'s own eager attention on random q, k, v; when it differs, the known bug
    that reproduces it is the diagnosis (the report reads like :func:`headlens.doctor.check_attention`'s)."""
    dtype = torch.float64
    q, k, v = _inputs(module, seq_len, seed, dtype)
    T = q.shape[2]
    mask = torch.zeros(T, T, dtype=dtype).masked_fill(~torch.tril(torch.ones(T, T, dtype=torch.bool)), float("-inf"))
    with torch.no_grad():
        ref = module_reference(module)(module, q, k, v, mask[None, None], scaling=module.scaling)[0]
        user = fn(module, q, k, v, mask[None, None], scaling=module.scaling)[0]
    if tuple(user.shape) != tuple(ref.shape):
        raise ConfigError(f"the attention function returned {tuple(user.shape)}; expected {tuple(ref.shape)}")
    tol = 1e-5 * max(1.0, float(ref.abs().max()))  # the families' eager softmax runs in float32
    diff = float((user - ref).abs().max())
    evidence = [Evidence("correct", "the layer's own attention", diff, diff <= tol)]
    base = AttentionRecipe(n_heads=q.shape[1])
    bugs = {b.name: b for b in known_bugs(q.shape[1] * q.shape[-1], q.shape[1], causal=True)}
    if diff > tol:
        for bug in bugs.values():
            for label, overrides in bug.variants:
                recipe = apply_bug(base, overrides)
                if recipe.n_heads != base.n_heads or recipe.split not in ("standard", "no_transpose"):
                    continue  # a head count or a view the attention function does not see
                with torch.no_grad():
                    d_bug = float((user - recipe_attention(module, q, k, v, recipe, float(module.scaling))).abs().max())
                evidence.append(Evidence(bug.name, label, d_bug, d_bug <= tol))
        evidence.sort(key=lambda e: (not e.matches, e.max_abs_diff))
    best = evidence[0]
    settings = {"d_model": q.shape[1] * q.shape[-1], "n_heads": q.shape[1], "n_kv_heads": k.shape[1], "causal": True,
                "input_shape": [list(q.shape), list(k.shape)], "dtype": str(dtype), "seed": seed}
    passed = diff <= tol
    if passed:
        diagnosis, title, variant = None, "no problem found", ""
    elif best.matches:
        diagnosis, title, variant = best.bug, bugs[best.bug].title, best.variant
        settings["looks_like"] = bugs[best.bug].looks_like
    else:
        diagnosis, title, variant = None, (f"output differs from multi-head attention and no known bug reproduces it "
                                           f"(closest: {best.bug}, max |diff| {best.max_abs_diff:.3g})"), ""
    layout = f"{type(module).__name__}'s attention function, q (B, H, T, d) and k, v (B, H_kv, T, d)"
    return AttentionReport(passed, diagnosis, title, variant, layout, diff, tol, evidence, [], settings)


def layer_modules(model: Any) -> list[Any]:
    """The attention modules of a ``transformers`` causal LM, in layer order (those with a ``layer_idx``)."""
    found = [m for m in model.modules() if hasattr(m, "layer_idx") and hasattr(m, "scaling")]
    return sorted(found, key=lambda m: int(m.layer_idx))
