"""Where each head looks from one named position: the attention rows a gate on what heads write also needs.

A name mover is defined by what it attends to *and* what it writes (:mod:`headlens.detectors.name_mover`);
whether a head "writes against the name it attends to" is a per-prompt question, so the attention row of
every head at END is read, keeping only that row of each layer's pattern (``(B, H, T)``, never the
``(B, H, T, T)`` pattern beyond one layer). :class:`EndRows` reads them inside the pattern hooks of forwards
that run anyway (the name movers' direct logit attribution, :func:`headlens.readout.dla.head_attributions`);
:func:`attention_rows` runs forwards of its own, each stopped at the last layer's pattern (the last MLP and
the ``(B, T, V)`` unembedding would be waste).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from headlens.progress import report


class EndRows:
    """Each query head's attention row from one position per prompt, read batch after batch in the
    ``blocks.{l}.attn.hook_pattern`` hooks that :meth:`hooks` gives for each batch's forward."""

    def __init__(self, n_layers: int) -> None:
        self.n_layers = n_layers
        self.batches: list[dict[int, torch.Tensor]] = []  # per batch, layer -> (B, H, K)

    def hooks(self, position: torch.Tensor) -> dict[str, Callable[[torch.Tensor], None]]:
        """The next batch's reads: hook name -> ``fn(pattern)``; ``position`` ``(B,)`` or ``(B, 1)`` long, the
        query position read in each prompt (on the model's device)."""
        pos = position.reshape(-1)
        rows = torch.arange(len(pos), device=pos.device)
        got: dict[int, torch.Tensor] = {}
        self.batches.append(got)

        def keep(layer: int) -> Callable[[torch.Tensor], None]:
            def read(x: torch.Tensor) -> None:
                got[layer] = x[rows, :, pos].detach().float()  # (B, H, K): the query row at pos of (B, H, Q, K)
            return read

        return {f"blocks.{layer}.attn.hook_pattern": keep(layer) for layer in range(self.n_layers)}

    def done(self) -> bool:
        """Whether the current batch has every layer's row."""
        return bool(self.batches) and len(self.batches[-1]) == self.n_layers

    def rows(self, T: int) -> torch.Tensor:
        """``(P, L, H, T)`` float32 over the batches read so far; keys past a batch's width are 0."""
        out = []
        for got in self.batches:
            r = torch.stack([got[layer] for layer in range(self.n_layers)], 1).cpu()  # (B, L, H, K)
            out.append(F.pad(r, (0, T - r.shape[-1])))  # (B, L, H, T)
        return torch.cat(out)


class _Rows(Exception):
    """Raised once every layer's row is read: the rest of the forward is not needed."""


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
    reader = EndRows(model.n_layers)
    for i in range(0, len(prompts), batch_size):
        _rows(model, reader, prompts[i:i + batch_size], position[i:i + batch_size], T)
        report(min(len(prompts), i + batch_size), len(prompts), "attention rows, prompt by prompt")
    return reader.rows(T)


def _rows(model: Any, reader: EndRows, chunk: list[torch.Tensor], position: torch.Tensor, T: int) -> None:
    """One forward over ``chunk``, right-padded to ``T``, read by ``reader`` and stopped at the last pattern."""
    tokens = torch.zeros(len(chunk), T, dtype=torch.long)
    mask = torch.zeros_like(tokens)
    for b, t in enumerate(chunk):
        tokens[b, : len(t)], mask[b, : len(t)] = t, 1

    def hook(read: Callable[[torch.Tensor], None]) -> Callable[..., None]:
        def run(x: torch.Tensor, hook: Any) -> None:
            read(x)
            if reader.done():
                raise _Rows
        return run

    names = [(name, hook(read)) for name, read in reader.hooks(position.to(model.device)).items()]
    with contextlib.suppress(_Rows), torch.no_grad(), model.hooks(names):
        model(tokens.to(model.device), attention_mask=mask.to(model.device))
