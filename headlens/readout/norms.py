"""The linear part of a model's norms, read off the norm modules themselves.

A norm maps a residual row ``x`` to ``g * c(x) / s(x) (+ b)``: ``c`` centres the row (LayerNorm only),
``s(x) > 0`` is one positive number per row (its standard deviation or RMS) and ``g`` is a per-channel
scale. Whatever reads a norm's output linearly (a head's ``W_Q``/``W_K``/``W_V``, the unembedding)
can fold ``c`` and ``g`` into its weights; ``s`` stays a per-row factor, which changes no ranking of a
row's entries (:mod:`headlens.readout.ov`) and no ratio of composition scores
(:mod:`headlens.circuits.composition`).

Why read ``g`` by *running* the norm: the families disagree on how a stored weight becomes the scale
(Llama multiplies by ``weight``, Gemma by ``1 + weight``), and running the module on rows of unit RMS
returns the scale each family really applies.
"""

from __future__ import annotations

from typing import Any

import torch


def norm_scale(norm: Any) -> torch.Tensor | None:
    """``(D,)`` float64: the per-channel scale ``g`` a norm module applies after normalizing, or None.

    A LayerNorm's scale is its ``weight`` as stored. An RMSNorm's is read by running the norm on a row of
    equal entries (``x / rms(x)`` is all ones there, so the output is ``g``), so every family's own
    convention (Gemma's ``1 + weight``) comes out as the family computes it. None for a module without a
    weight (an identity, a norm without elementwise affine).

    >>> norm_scale(torch.nn.LayerNorm(3)).tolist()
    [1.0, 1.0, 1.0]
    >>> rms = torch.nn.RMSNorm(3); _ = torch.nn.init.constant_(rms.weight, 2.0)
    >>> [round(g, 4) for g in norm_scale(rms).tolist()]
    [2.0, 2.0, 2.0]
    """
    if norm is None:
        return None
    module = getattr(norm, "_original_component", norm)  # a bridge wraps the family's own module
    weight = dict(module.named_parameters()).get("weight")
    if weight is None:
        return None
    if isinstance(module, torch.nn.LayerNorm) or getattr(module, "bias", None) is not None:
        return weight.detach().double().cpu()  # LayerNorm: gamma as stored
    probe = torch.full((1, 1, weight.shape[0]), 1e3, dtype=weight.dtype, device=weight.device)  # RMS 1e3 >> eps
    with torch.no_grad():
        out = module(probe)
    out = out[0] if isinstance(out, tuple) else out
    return out.reshape(-1).detach().double().cpu()  # g * x / rms(x) at x = 1e3 * ones: g


def centres(model: Any) -> bool:
    """True when the model's norms are LayerNorms, which subtract each row's mean (GPT-2, GPT-NeoX, OPT,
    Phi-1/2); False for RMSNorm (Llama, Mistral, Qwen2, Gemma) and for models without norms."""
    if hasattr(model, "bridge"):
        return getattr(model.bridge.cfg, "normalization_type", None) == "LN"
    return getattr(model.cfg, "normalization", None) == "LN"
