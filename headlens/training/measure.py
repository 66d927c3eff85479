"""Direct attention-pattern measurements used by the zoo's model cards and tests.

A deliberately small, independent implementation of the definitions on the scores page of the docs (docs/scores.md)
(target mass averaged over the query rows that have a target), so that the zoo can
say which heads formed without depending on the classification engine.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def all_patterns(model, tokens: torch.Tensor) -> torch.Tensor:
    """Every head's attention pattern: ``(n_layers, B, H, T, T)``."""
    names = [f"blocks.{layer}.attn.hook_pattern" for layer in range(model.cfg.n_layers)]
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens, names_filter=lambda n: n in names)
    return torch.stack([cache[n].float() for n in names])  # (L, B, H, T, T)


def target_scores(patterns: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean attention mass on the targets over rows that have one.

    Args:
        patterns: ``(L, B, H, T, T)`` attention patterns.
        targets: ``(B, T, T)`` bool, ``targets[b, q, k]`` if key k is a target of query q.

    Returns:
        ``(L, H)`` scores in [0, 1].
    """
    mass = (patterns * targets[None, :, None].float()).sum(-1)  # (L, B, H, T)
    rows = targets.any(-1)  # (B, T)
    n = rows.sum().clamp(min=1)
    return (mass * rows[None, :, None].float()).sum(dim=(1, 3)) / n  # (L, H)


def previous_token_targets(tokens: torch.Tensor) -> torch.Tensor:
    """``(B, T, T)``: query q >= 1 targets key q - 1 (the BOS row has none)."""
    B, T = tokens.shape
    eye = torch.zeros(T, T, dtype=torch.bool)
    eye[torch.arange(1, T), torch.arange(0, T - 1)] = True
    return eye[None].expand(B, T, T)


def first_token_targets(tokens: torch.Tensor) -> torch.Tensor:
    """``(B, T, T)``: query q >= 1 targets key 0 (the BOS sink)."""
    B, T = tokens.shape
    m = torch.zeros(T, T, dtype=torch.bool)
    m[1:, 0] = True
    return m[None].expand(B, T, T)


def induction_targets(tokens: torch.Tensor, special: set[int] | None = None) -> torch.Tensor:
    """``(B, T, T)``: key k (1 <= k <= q - 1) is a target of q when ``tokens[k - 1] == tokens[q]``."""
    B, T = tokens.shape
    prev = torch.cat([torch.full((B, 1), -1, dtype=tokens.dtype), tokens[:, :-1]], dim=1)  # x_{k-1}
    same = tokens[:, :, None] == prev[:, None, :]  # (B, Q, K)
    q_idx = torch.arange(T)[:, None]
    k_idx = torch.arange(T)[None, :]
    allowed = (k_idx >= 1) & (k_idx <= q_idx - 1)  # (Q, K)
    mask = same & allowed[None]
    for s in special or ():
        mask &= (tokens != s)[:, :, None]
    return mask


def shifted_induction_targets(tokens: torch.Tensor, special: set[int] | None = None) -> torch.Tensor:
    """``(B, T, T)``: key k (2 <= k <= q) is a target of q when ``tokens[k - 2] == tokens[q]``.

    Induction one position late: the head attends to the token *after* the one that
    followed the earlier occurrence, and copies that key's previous-token channel.
    """
    B, T = tokens.shape
    prev2 = torch.cat([torch.full((B, 2), -1, dtype=tokens.dtype), tokens[:, :-2]], dim=1)  # x_{k-2}
    same = tokens[:, :, None] == prev2[:, None, :]  # (B, Q, K)
    q_idx = torch.arange(T)[:, None]
    k_idx = torch.arange(T)[None, :]
    mask = same & ((k_idx >= 2) & (k_idx <= q_idx))[None]
    for s in special or ():
        mask &= (tokens != s)[:, :, None]
    return mask


def bracket_targets(matches: list[dict[int, int]], T: int) -> torch.Tensor:
    """``(B, T, T)`` from per-row ``{closer_pos: opener_pos}`` dicts."""
    m = torch.zeros(len(matches), T, T, dtype=torch.bool)
    for b, pairs in enumerate(matches):
        for q, k in pairs.items():
            m[b, q, k] = True
    return m


def heads_above(scores: torch.Tensor, threshold: float, layer: int | None = None) -> list[str]:
    """Head names ``L{l}H{h}`` whose score exceeds ``threshold``, best first."""
    found = [
        (float(scores[layer_, h]), f"L{layer_}H{h}")
        for layer_ in range(scores.shape[0])
        for h in range(scores.shape[1])
        if (layer is None or layer_ == layer) and scores[layer_, h] > threshold
    ]
    return [name for _, name in sorted(found, reverse=True)]


def score_dict(scores: torch.Tensor) -> dict[str, float]:
    """``{"L0H1": 0.93, ...}`` rounded to 4 places."""
    return {
        f"L{i}H{h}": round(float(scores[i, h]), 4)
        for i in range(scores.shape[0])
        for h in range(scores.shape[1])
    }


def token_losses(model, tokens: torch.Tensor) -> torch.Tensor:
    """Per-position next-token loss ``(B, T - 1)`` (position t predicts token t + 1)."""
    with torch.no_grad():
        logits = model(tokens[:, :-1])  # (B, T-1, V)
    return F.cross_entropy(logits.transpose(1, 2), tokens[:, 1:], reduction="none")  # (B, T-1)
