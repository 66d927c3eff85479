"""Where each head looks from one named position: the attention rows a gate on what heads write also needs.

A name mover is defined by what it attends to *and* what it writes (:mod:`headlens.detectors.name_mover`);
whether a head "writes against the name it attends to" is a per-prompt question, so the attention row of
every head at END is read here, one forward over the probe, keeping only that row of each layer's pattern
(``(B, H, T)``, never the ``(B, H, T, T)`` pattern beyond one layer).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from headlens.progress import report


def attention_rows(model: Any, prompts: list[torch.Tensor], position: torch.Tensor, batch_size: int = 16
                   ) -> torch.Tensor:
    """``(P, L, H, T)`` float32: each query head's attention from ``position[p]`` of prompt ``p`` to every key
    (``T`` the longest prompt; keys past a prompt's end are 0).

    Args:
        model: any headlens backend whose layers show ``blocks.{l}.attn.hook_pattern``.
        prompts: token ids per prompt (specials included).
        position: ``(P,)`` long: the query position read in each prompt.
        batch_size: prompts per forward (each reported to :func:`headlens.progress.report`).
    """
    T = max(len(t) for t in prompts)
    out = []
    for i in range(0, len(prompts), batch_size):
        out.append(_rows(model, prompts[i:i + batch_size], position[i:i + batch_size], T))
        report(min(len(prompts), i + batch_size), len(prompts), "attention rows, prompt by prompt")
    return torch.cat(out)


def _rows(model: Any, chunk: list[torch.Tensor], position: torch.Tensor, T: int) -> torch.Tensor:
    """``(B, L, H, T)``: one forward over ``chunk``, right-padded to ``T``."""
    tokens = torch.zeros(len(chunk), T, dtype=torch.long)
    mask = torch.zeros_like(tokens)
    for b, t in enumerate(chunk):
        tokens[b, : len(t)], mask[b, : len(t)] = t, 1
    pos = position.to(model.device)
    rows = torch.arange(len(chunk), device=model.device)
    got: dict[int, torch.Tensor] = {}

    def keep(layer: int) -> Callable[..., None]:
        def hook(x: torch.Tensor, hook: Any) -> None:
            got[layer] = x[rows, :, pos].detach().float()  # (B, H, K): the query row at pos of (B, H, Q, K)
        return hook

    names = [(f"blocks.{layer}.attn.hook_pattern", keep(layer)) for layer in range(model.n_layers)]
    with torch.no_grad(), model.hooks(names):
        model(tokens.to(model.device), attention_mask=mask.to(model.device))
    return torch.stack([got[layer] for layer in range(model.n_layers)], 1).cpu()  # (B, L, H, T)
