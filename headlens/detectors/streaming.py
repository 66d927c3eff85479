"""streaming: T(q) = {0, ..., s-1} U {q-w+1, ..., q} (s sinks, w recent keys; s = 4, w = 64 by default).

DuoAttention (Xiao et al. 2024, "DuoAttention: Efficient Long-Context LLM Inference with Retrieval
and Streaming Heads") splits heads into retrieval heads, which need the full KV cache, and
streaming heads, which lose nothing when their cache keeps only the attention sinks and a window
of recent tokens (StreamingLLM's pattern, Xiao et al. 2024). A head whose mass on this set is
near 1 can be served by such a cache. DuoAttention learns the split with per-KV-head gates and
uses s = 64-128 sinks and w = 256 recent tokens; the defaults here follow StreamingLLM's 4 sinks
and a short window, and both are settable: ``get_detector("streaming(s=16,w=256)")``.

Rows q < s + w are left out: their set already holds every key they see (the score would be 1
for any head).
"""

from __future__ import annotations

import torch

from headlens.detectors.base import Detector, finish_targets
from headlens.probes.base import ProbeBatch

SINKS, WINDOW = 4, 64


def streaming_targets(batch: ProbeBatch, s: int, w: int) -> torch.Tensor:
    """``(B, Q, s + w)``: the sinks and the last w keys (q included) for every countable row q >= s + w."""
    B = batch.tokens.shape[0]
    dev = batch.tokens.device
    r0, r1 = batch.row_range
    q = torch.arange(r0, r1, device=dev)[:, None]  # (Q, 1)
    recent = q - torch.arange(w - 1, -1, -1, device=dev)[None, :]  # (Q, w): q-w+1 .. q
    sinks = torch.arange(s, device=dev)[None, :].expand(r1 - r0, s)  # (Q, s)
    keys = torch.cat([sinks, recent], dim=1)  # (Q, s + w): disjoint for q >= s + w
    keys = torch.where(q >= s + w, keys, torch.full_like(keys, -1))
    return finish_targets(keys[None].expand(B, -1, -1), batch)


def streaming_predicate(q: torch.Tensor, k: torch.Tensor, s: int, w: int) -> torch.Tensor:
    """``(C, K)``: k is a sink or one of the last w keys (q included), for rows q >= s + w."""
    gap = q - k  # (C, K)
    return ((k < s) | ((gap >= 0) & (gap < w))) & (q >= s + w)


def make(s: int = SINKS, w: int = WINDOW) -> Detector:
    """The streaming detector with ``s`` sinks and a window of ``w`` recent keys."""
    s, w = int(s), int(w)
    if s < 0 or w < 1:
        raise ValueError(f"streaming needs s >= 0 and w >= 1, got s={s}, w={w}")
    name = "streaming" if (s, w) == (SINKS, WINDOW) else f"streaming(s={s},w={w})"
    return Detector(name, "mask", lambda batch: streaming_targets(batch, s, w), "random_tokens",
                    f"attends to the first {s} positions and the last {w} (DuoAttention's streaming heads)",
                    params={"s": s, "w": w}, factory=make, windowed=True,
                    predicate=lambda batch, q, k: streaming_predicate(q, k, s, w))


DETECTOR = make()
