"""How a layer makes its attention scores: the facts a model states about each attention layer.

The native GPT and the bridge both describe their layers with :class:`AttentionSpec`; the LSE scan
(:mod:`headlens.scoring.lse`) redoes the scores from q and k with it, and the fused attention of
long-context runs reads the same record.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class AttentionSpec:
    """How one layer's attention scores are made, as the LSE scan needs to redo them.

    Attributes:
        q_hook, k_hook: hook names carrying q and k (after any rotary embedding).
        layout: ``"BTHD"`` (native hooks, ``(B, T, H, d)``) or ``"BHTD"`` (``(B, H, T, d)``).
        scale: multiplies ``q·k`` (``1/sqrt(d_head)`` unless the model says otherwise).
        causal: keys ``k <= q`` only.
        window: sliding window: key k is visible from q only when ``q - k < window``; None: all.
        softcap: Gemma-2 style ``cap * tanh(s / cap)`` on the scaled scores; None: none.
        sinks: per query head, an attention-sink logit (GPT-OSS) that joins every row's softmax
            and takes its share of the mass without being a key: ``LSE_q`` includes it; None: none.
    """

    q_hook: str
    k_hook: str
    layout: str = "BTHD"
    scale: float | None = None
    causal: bool = True
    window: int | None = None
    softcap: float | None = None
    sinks: tuple[float, ...] | None = None
