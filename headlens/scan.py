"""The scan engine: run a probe through a model once and score every detector from one hook per layer.

Why it looks like this:

* **One hook per layer** on ``blocks.{l}.attn.hook_pattern`` feeds every detector. The targets
  of a batch are built once, before the forward pass, and shared by all layers.
* **Reduce inside the hook, then drop the pattern.** Index detectors (one target per row) are
  one ``gather``; mask detectors (a target set per row) are one ``bmm`` of the flattened
  pattern ``(B, H, Q*K)`` with the stacked masks ``(B, Q*K, D)``. What survives the hook is
  ``(B, H, D)`` float64 per layer; no ``(B, H, Q, K)`` tensor outlives its layer.
* **Per-prompt sums**, not just totals, are kept (``P x L x H x D`` float64, tiny) so that
  statistics can bootstrap over prompts, and so a scan can be split and summed.
* **Right padding, uneven lengths.** Targets never point at pads and pad rows have no target;
  bidirectional models also get an ``attention_mask``. Causal models see no pads from real rows.
* The forward pass stops after the last layer's pattern: logits are never needed.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from headlens.detectors.base import Detector
from headlens.probes import Probe, ProbeBatch, collate
from headlens.vocab import vocab

Progress = Callable[[int], None]  # called with the number of prompts just scanned


@dataclass
class DetectorStats:
    """Per-prompt statistics of one detector on one probe.

    Attributes:
        sums: ``(P, L, H)`` float64: attention mass on the targets, summed over the prompt's rows.
        counts: ``(P,)`` float64: rows with a target in each prompt.
        baseline: ``(P,)`` float64: uniform attention's mass on the targets, summed the same way.
    """

    sums: torch.Tensor
    counts: torch.Tensor
    baseline: torch.Tensor


class _ScanDone(Exception):
    """Raised after the last layer's pattern has been reduced: the rest of the forward is waste."""


@dataclass
class _BatchTargets:
    idx_flat: torch.Tensor  # (B, D1*Q) long: flat q*K + k of each index target
    idx_weight: torch.Tensor  # (B, 1, D1, Q) float64: 1 where the row has its target
    masks: torch.Tensor  # (B, Q*K, D2) bool: stacked set targets, flattened over (q, k)
    n_idx: int


def _targets(batch: ProbeBatch, index_dets: Sequence[Detector], mask_dets: Sequence[Detector]) -> tuple[
        _BatchTargets, torch.Tensor, torch.Tensor]:
    B, T = batch.tokens.shape
    dev = batch.tokens.device
    visible = batch.n_visible.to(dev)  # (B, Q)
    counts, base = [], []
    if index_dets:
        idx = torch.stack([d.targets(batch) for d in index_dets], dim=1)  # (B, D1, Q)
        has = idx >= 0
        counts.append(has.sum(-1).double())  # (B, D1)
        base.append((has / visible[:, None, :]).sum(-1))  # (B, D1)
        q = torch.arange(T, device=dev)[None, None, :]
        idx_flat = (q * T + idx.clamp_min(0)).reshape(B, -1)  # (B, D1*Q)
        idx_weight = has.double()[:, None]  # (B, 1, D1, Q)
    else:
        idx_flat = torch.zeros(B, 0, dtype=torch.long, device=dev)
        idx_weight = torch.zeros(B, 1, 0, T, dtype=torch.float64, device=dev)
    if mask_dets:
        m = torch.stack([d.targets(batch) for d in mask_dets], dim=1)  # (B, D2, Q, K)
        size = m.sum(-1)  # (B, D2, Q): |T(q)|
        counts.append((size > 0).sum(-1).double())
        base.append((size / visible[:, None, :]).sum(-1))
        masks = m.reshape(B, len(mask_dets), T * T).transpose(1, 2)  # (B, Q*K, D2)
    else:
        masks = torch.zeros(B, T * T, 0, dtype=torch.bool, device=dev)
    return (_BatchTargets(idx_flat, idx_weight, masks, len(index_dets)),
            torch.cat(counts, 1), torch.cat(base, 1))


def _reduce(pattern: torch.Tensor, tg: _BatchTargets, mask_cache: dict) -> torch.Tensor:
    """``(B, H, Q, K)`` pattern -> ``(B, H, D1 + D2)`` float64 per-prompt target mass."""
    B, H, Q, K = pattern.shape
    flat = pattern.reshape(B, H, Q * K)  # (B, H, Q*K): row-major over (query_pos, key_pos)
    parts = []
    if tg.n_idx:
        g = flat.gather(2, tg.idx_flat[:, None, :].expand(B, H, -1))  # (B, H, D1*Q)
        g = g.view(B, H, tg.n_idx, Q).double()  # (B, H, D1, Q): mass on each row's one target
        parts.append((g * tg.idx_weight).sum(-1))  # (B, H, D1)
    if tg.masks.shape[2]:
        if pattern.dtype not in mask_cache:
            mask_cache[pattern.dtype] = tg.masks.to(pattern.dtype)
        parts.append(torch.bmm(flat, mask_cache[pattern.dtype]).double())  # (B, H, D2)
    return torch.cat(parts, dim=2)


def scan(
    model: Any,
    probe: Probe,
    detectors: Sequence[Detector],
    batch_size: int = 32,
    progress: Progress | None = None,
) -> dict[str, DetectorStats]:
    """Score ``detectors`` (index or mask kind) on every prompt of ``probe``.

    Args:
        model: any headlens backend (native GPT, bridge).
        probe: the prompts and their annotations.
        detectors: pattern detectors to score; all see the same forward passes.
        batch_size: prompts per forward pass (results do not depend on it).
        progress: optional callback, called with the number of prompts done per batch.

    Returns:
        detector name -> :class:`DetectorStats` with per-prompt sums.
    """
    index_dets = [d for d in detectors if d.kind == "index"]
    mask_dets = [d for d in detectors if d.kind == "mask"]
    order = index_dets + mask_dets  # column order of the reduced statistics
    L, H, P, D = model.n_layers, model.n_heads, len(probe), len(order)
    sums = torch.zeros(P, L, H, D, dtype=torch.float64)
    counts = torch.zeros(P, D, dtype=torch.float64)
    base = torch.zeros(P, D, dtype=torch.float64)
    v = vocab(model)
    pad_id = getattr(model.tokenizer, "pad_token_id", None)
    pad_id = int(pad_id) if pad_id is not None else v.ordinary[0]
    state: dict[str, Any] = {}

    def hook_for(layer: int) -> Callable[..., None]:
        def reduce_layer(pattern: torch.Tensor, hook: Any) -> None:
            state["out"][:, layer] = _reduce(pattern, state["targets"], state["mask_cache"])
            if layer == L - 1:
                raise _ScanDone

        return reduce_layer

    fwd_hooks = [(f"blocks.{layer}.attn.hook_pattern", hook_for(layer)) for layer in range(L)]
    with torch.inference_mode():
        for start in range(0, P, batch_size):
            rows = range(start, min(start + batch_size, P))
            batch = collate(probe, rows, model.is_causal, v.special, pad_id, model.device)
            tg, c, b = _targets(batch, index_dets, mask_dets)
            state.update(targets=tg, mask_cache={},
                         out=torch.zeros(len(rows), L, H, D, dtype=torch.float64, device=batch.tokens.device))
            mask = None if model.is_causal else batch.valid.long()
            try:
                with model.hooks(fwd_hooks):
                    model.forward(batch.tokens, attention_mask=mask)
            except _ScanDone:
                pass
            sums[start:start + len(rows)] = state["out"].cpu()
            counts[start:start + len(rows)] = c.cpu()
            base[start:start + len(rows)] = b.cpu()
            state.clear()  # drop this batch's targets before the next one is built
            if progress is not None:
                progress(len(rows))
    return {d.name: DetectorStats(sums[..., i], counts[:, i], base[:, i]) for i, d in enumerate(order)}


def n_batches(n_prompts: int, batch_size: int) -> int:
    return math.ceil(n_prompts / batch_size)
