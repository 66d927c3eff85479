"""sink: T(q) = {0, ..., s-1}, the first s positions, for rows q >= s (s = 4 by default).

StreamingLLM (Xiao et al. 2024, "Efficient Streaming Language Models with Attention Sinks") keeps
the KV entries of the first 4 tokens, which soak up attention whatever they say; ``first_token``
is the s = 1 case (Gu et al. 2024, "When Attention Sink Emerges"). Rows q < s are left out: every
key they see is a sink, so they would score 1 whatever the head does.

Setting: ``s`` (``get_detector("sink(s=8)")``).

Scored when named (``--detectors sink``), not by default: resting on the first token is already in every
row's ``rest`` column and in ``first_token``, and two default detectors for one state listed most heads
of a trained LM twice (docs/scores.md, "Resting").
"""

from __future__ import annotations

import torch

from headlens.detectors.base import Detector, finish_targets
from headlens.probes.base import ProbeBatch

SINKS = 4


def sink_targets(batch: ProbeBatch, s: int) -> torch.Tensor:
    """``(B, Q, s)``: keys 0 .. s-1 for every countable row q >= s."""
    B = batch.tokens.shape[0]
    dev = batch.tokens.device
    r0, r1 = batch.row_range
    q = torch.arange(r0, r1, device=dev)[None, :, None]  # (1, Q, 1)
    keys = torch.arange(s, device=dev)[None, None, :].expand(B, r1 - r0, s)  # (B, Q, s)
    return finish_targets(torch.where(q >= s, keys, torch.full_like(keys, -1)), batch)


def make(s: int = SINKS) -> Detector:
    """The sink detector with ``s`` sink positions."""
    if int(s) < 1:
        raise ValueError(f"sink needs s >= 1, got s={s}")
    s = int(s)
    name = "sink" if s == SINKS else f"sink(s={s})"
    return Detector(name, "mask", lambda batch: sink_targets(batch, s), "random_tokens",
                    f"attends to the first {s} positions (StreamingLLM's attention sinks)",
                    params={"s": s}, factory=make, windowed=True, predicate=lambda batch, q, k: (k < s) & (q >= s),
                    default=False)


DETECTOR = make()
