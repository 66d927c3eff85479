"""Ablation values computed by hand, for tests that check the numbers ``ablate`` and the dashboard show.

Nothing here calls headlens' ablation code (``Replacement``, ``ablate``, ``sweep``) or its metrics: a
head is removed by a plain forward hook on ``blocks.{l}.attn.hook_z``, and losses are cross-entropies
written out with ``log_softmax`` on positions found from the token lists.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch


def repeated_positions(tokens: torch.Tensor) -> torch.Tensor:
    """``(N, T)`` bool: the positions whose next token is in the second copy of ``BOS + r + r``, its
    first token excluded (nothing earlier predicts it). Checks the layout on the way."""
    N, T = tokens.shape
    L = (T - 1) // 2
    assert T == 2 * L + 1
    for row in tokens.tolist():
        r = row[1 : L + 1]
        assert row[L + 1 :] == r and len(set(r)) == L  # r twice, no token repeated inside r
    pos = torch.zeros(N, T, dtype=torch.bool)
    pos[:, L + 1 : 2 * L] = True  # position t predicts t + 1 = L + 2 .. 2L
    return pos


def _zhooks(model, heads: Sequence[tuple[int, int]], method: str, tokens: torch.Tensor) -> list:
    """Forward hooks on hook_z that replace ``heads``: zero, or (mean) their mean z over ``tokens`` per position."""
    means = {}
    if method == "mean":
        with torch.no_grad():
            _, cache = model.run_with_cache(tokens, names_filter=lambda n: n.endswith("attn.hook_z"))
        means = {(layer, h): cache[f"blocks.{layer}.attn.hook_z"][:, :, h].mean(0) for layer, h in heads}  # (T, d)
    elif method != "zero":
        raise ValueError(method)

    def hook(layer: int):
        def fn(z: torch.Tensor, hook=None) -> torch.Tensor:  # (B, T, H, d_head)
            z = z.clone()
            for hl, h in heads:
                if hl == layer:
                    z[:, :, h] = 0 if method == "zero" else means[hl, h][: z.shape[1]]
            return z
        return fn

    return [(f"blocks.{layer}.attn.hook_z", hook(layer)) for layer in sorted({layer for layer, _ in heads})]


def logits(model, tokens: torch.Tensor, heads: Sequence[tuple[int, int]] = (), method: str = "zero",
           reference: torch.Tensor | None = None) -> torch.Tensor:
    """``(N, T, V)`` float64 logits, ``heads`` replaced by hand (mean over ``reference``, default ``tokens``)."""
    hooks = _zhooks(model, heads, method, tokens if reference is None else reference) if heads else []
    with torch.no_grad():
        out = model.run_with_hooks(tokens, fwd_hooks=hooks)
    return out.double()


def token_nll(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """``(N, T - 1)``: -log p(token t + 1 | prefix) at each position t."""
    logp = logits[:, :-1].log_softmax(-1)
    return -logp.gather(-1, tokens[:, 1:, None])[..., 0]


def per_prompt_loss(logits: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor) -> np.ndarray:
    """``(N,)``: mean next-token loss over each prompt's ``positions``."""
    nll = token_nll(logits, tokens)  # (N, T - 1)
    pos = positions[:, :-1]
    return ((nll * pos).sum(1) / pos.sum(1)).numpy()


def per_prompt_kl(clean: torch.Tensor, ablated: torch.Tensor, positions: torch.Tensor) -> np.ndarray:
    """``(N,)``: mean KL(clean || ablated) of the next-token distribution over ``positions``."""
    p, q = clean.log_softmax(-1), ablated.log_softmax(-1)
    kl = (p.exp() * (p - q)).sum(-1)  # (N, T)
    return ((kl * positions).sum(1) / positions.sum(1)).numpy()
