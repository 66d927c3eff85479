"""Reference multi-head attention with the classic silent bugs injectable one setting at a time.

Why: a hand-written attention that splits heads along the wrong axis still maps
``(B, T, d_model)`` to ``(B, T, d_model)``, so nothing crashes. To *name* the bug in a
user's module, the doctor copies its weights here and re-runs this reference with each
known bug switched on; the bug whose output reproduces the user's output is the diagnosis.

Every bug is an override of one or two fields of an :class:`AttentionRecipe`; the recipe
with no overrides is exactly ``headlens.models.gpt.MultiHeadAttention`` (tested).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as F

Split = Literal["standard", "no_transpose", "head_first_view", "d_head_major"]
Merge = Literal["standard", "no_transpose", "d_head_major"]
Scale = Literal["sqrt_d_head", "sqrt_d_model", "d_head", "none"]
Mask = Literal["causal", "none", "transposed"]


@dataclass(frozen=True)
class AttentionRecipe:
    """How one attention forward pass splits, scores, masks, normalises and merges heads."""

    n_heads: int  # how many heads d_model is split into
    split: Split = "standard"  # view (B, T, H, d_head) then transpose(1, 2)
    merge: Merge = "standard"  # transpose(1, 2) then reshape (B, T, H * d_head)
    scale: Scale = "sqrt_d_head"  # scores / sqrt(d_head)
    mask: Mask = "causal"  # keep key <= query ("none" for bidirectional attention)
    softmax_dim: int = -1  # normalise over keys


@dataclass(frozen=True)
class Bug:
    """One known way to get multi-head attention silently wrong."""

    name: str  # stable id used in reports and tests
    title: str  # what the bug is, in one line
    looks_like: str  # the line of code people write
    variants: tuple[tuple[str, dict[str, Any]], ...]  # (variant label, recipe overrides)


def divisors(n: int) -> list[int]:
    """All positive divisors of ``n``, ascending.

    >>> divisors(12)
    [1, 2, 3, 4, 6, 12]
    """
    return [d for d in range(1, n + 1) if n % d == 0]


def known_bugs(d_model: int, n_heads: int, causal: bool) -> list[Bug]:
    """The bug catalogue for a module with this shape (head-count variants depend on d_model)."""
    bugs = [
        Bug("missing_transpose_split", "missing transpose after the head split: heads attend over heads",
            "q = q.view(B, T, n_heads, d_head)  # no .transpose(1, 2)",
            (("view (B, T, H, d_head) used as (B, H, T, d_head)", {"split": "no_transpose"}),)),
        Bug("wrong_view_order", "heads split with the wrong view order",
            "q = q.view(B, n_heads, T, d_head)  # reshapes straight to head-first",
            (("view (B, H, T, d_head) without transpose", {"split": "head_first_view"}),
             ("d_head-major split and merge: '(d_head h)' instead of '(h d_head)'",
              {"split": "d_head_major", "merge": "d_head_major"}),
             ("d_head-major split only", {"split": "d_head_major"}))),
        Bug("missing_transpose_merge", "missing transpose before the head merge: positions and heads mixed",
            "y = y.reshape(B, T, d_model)  # y is (B, H, T, d_head)",
            (("reshape (B, H, T, d_head) straight to (B, T, d_model)", {"merge": "no_transpose"}),)),
        Bug("wrong_head_count", "d_model split into the wrong number of heads",
            "self.n_heads = 8  # hard-coded, or d_head fixed at 64",
            tuple((f"n_heads={h}", {"n_heads": h}) for h in divisors(d_model) if h != n_heads)),
        Bug("scale_by_d_model", "scores scaled by d_model instead of d_head",
            "att = q @ k.transpose(-2, -1) / math.sqrt(d_model)",
            (("1/sqrt(d_model)", {"scale": "sqrt_d_model"}), ("1/d_head (no sqrt)", {"scale": "d_head"}),
             ("no scaling", {"scale": "none"}))),
        Bug("softmax_wrong_axis", "softmax over the wrong axis",
            "att = F.softmax(att, dim=-2)",
            (("over queries (dim=-2)", {"softmax_dim": -2}), ("over heads (dim=1)", {"softmax_dim": 1}))),
    ]
    if causal:
        bugs += [
            Bug("mask_wrong_axis", "causal mask applied to the wrong axis: queries see the future",
                "att = att.masked_fill(mask[:T, :T].T == 0, float('-inf'))",
                (("mask transposed (keep key >= query)", {"mask": "transposed"}),)),
            Bug("no_mask", "no causal mask although the attention should be causal",
                "att = F.softmax(q @ k.transpose(-2, -1) * scale, dim=-1)  # mask forgotten",
                (("no mask", {"mask": "none"}),)),
        ]
    else:
        bugs.append(
            Bug("unexpected_causal_mask", "a causal mask although the attention should be bidirectional",
                "F.scaled_dot_product_attention(q, k, v, is_causal=True)",
                (("causal mask", {"mask": "causal"}),))
        )
    return bugs


def apply_bug(recipe: AttentionRecipe, overrides: dict[str, Any]) -> AttentionRecipe:
    return dataclasses.replace(recipe, **overrides)


def _split(x: torch.Tensor, n_heads: int, how: Split) -> torch.Tensor:
    """(B, T, D) -> a 4-d tensor (B, A, S, d_head); attention mixes along S."""
    B, T, D = x.shape
    d_head = D // n_heads
    if how == "standard":
        return x.view(B, T, n_heads, d_head).transpose(1, 2)  # (B, H, T, d_head)
    if how == "no_transpose":
        return x.view(B, T, n_heads, d_head)  # (B, T, H, d_head): axis 2 (heads) is read as positions
    if how == "head_first_view":
        return x.view(B, n_heads, T, d_head)  # (B, H, T, d_head) by memory order: rows of T mixed
    if how == "d_head_major":
        return x.view(B, T, d_head, n_heads).permute(0, 3, 1, 2)  # (B, H, T, d_head), heads interleaved
    raise ValueError(f"unknown split {how!r}")


def _merge(z: torch.Tensor, d_model: int, how: Merge) -> torch.Tensor:
    """A 4-d (B, A, S, d_head) head output -> (B, T, D), the way the recipe merges."""
    B = z.shape[0]
    if how == "standard":
        return z.transpose(1, 2).reshape(B, -1, d_model)  # (B, T, H * d_head)
    if how == "no_transpose":
        return z.reshape(B, -1, d_model)  # (B, H, T, d_head) read as (B, T, D): positions mixed
    if how == "d_head_major":
        return z.permute(0, 2, 3, 1).reshape(B, -1, d_model)  # (B, T, d_head * H)
    raise ValueError(f"unknown merge {how!r}")


def _keep_mask(n: int, how: Mask, device: torch.device) -> torch.Tensor | None:
    """Boolean (S, S) mask of entries that survive, indexed [query, key]; None for no mask."""
    if how == "none":
        return None
    keep = torch.tril(torch.ones(n, n, dtype=torch.bool, device=device))
    return keep if how == "causal" else keep.T


def reference_attention(
    x: torch.Tensor,
    w_qkv: torch.Tensor,
    b_qkv: torch.Tensor,
    w_o: torch.Tensor,
    b_o: torch.Tensor,
    recipe: AttentionRecipe,
    return_z: bool = False,
    pattern_hook: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> torch.Tensor:
    """Multi-head self-attention of ``x`` (B, T, D) under ``recipe``.

    Args:
        x: input ``(B, T, d_model)``.
        w_qkv: fused ``nn.Linear`` weight ``(3 * d_model, d_model)``, rows ordered q, k, v.
        b_qkv: its bias ``(3 * d_model,)``.
        w_o: output projection weight ``(d_model, d_model)`` (``nn.Linear`` layout).
        b_o: its bias ``(d_model,)``.
        recipe: how to split/score/mask/merge; the default recipe is the correct attention.
        return_z: also return the merged head outputs before the output projection.
        pattern_hook: called on the pattern ``(B, A, S, S)`` (a ``HookPoint`` in
            ``headlens.doctor.inject``); with a correct split ``A`` is heads and ``S`` positions.

    >>> x = torch.randn(1, 3, 8)
    >>> w, b = torch.randn(24, 8), torch.zeros(24)
    >>> reference_attention(x, w, b, torch.eye(8), torch.zeros(8), AttentionRecipe(n_heads=2)).shape
    torch.Size([1, 3, 8])
    """
    D = x.shape[-1]
    d_head = D // recipe.n_heads
    q, k, v = (t.contiguous() for t in F.linear(x, w_qkv, b_qkv).split(D, dim=2))  # 3 x (B, T, D)
    q, k, v = (_split(t, recipe.n_heads, recipe.split) for t in (q, k, v))  # (B, A, S, d_head)
    scores = q @ k.transpose(-2, -1)  # (B, A, S, S)
    scale = {"sqrt_d_head": math.sqrt(d_head), "sqrt_d_model": math.sqrt(D), "d_head": float(d_head),
             "none": 1.0}[recipe.scale]
    scores = scores / scale
    keep = _keep_mask(scores.shape[-1], recipe.mask, x.device)
    if keep is not None:
        scores = scores.masked_fill(~keep, float("-inf"))
    pattern = F.softmax(scores, dim=recipe.softmax_dim)  # (B, A, S, S)
    if pattern_hook is not None:
        pattern = pattern_hook(pattern)
    merged = _merge(pattern @ v, D, recipe.merge)  # (B, T, D)
    out = F.linear(merged, w_o, b_o)
    return (out, merged) if return_z else out
