"""A model's normalisations as a linear readout sees them: ``y = P(x) / scale * weight + bias``.

``P`` centres ``x`` for LayerNorm (subtracts its mean) and is the identity for RMSNorm; ``scale`` is
``sqrt(mean(P(x)^2) + eps)``, one number per position. With the scale *frozen* at its clean-run value the
norm is linear in ``x`` (plus ``bias``), so anything written to its input splits exactly into per-part
shares: the final norm before the unembedding (direct logit attribution) and, in Gemma 2 and 3, the norm
each attention and MLP output passes *after* the sublayer (``post_attention_layernorm``), whose share of
each head is ``P(head) / scale * weight``.

Each family's own form is read from the module itself: ``nn.LayerNorm`` / ``nn.Identity`` in the native
GPT; for bridged models TransformerLens' normalisation bridge says LayerNorm or RMSNorm and whether the
weight is stored as an offset from 1 (Gemma's ``1 + w``), and its ``hook_scale`` shows the scale the
model used in the run. Nothing here is trusted blindly: :mod:`headlens.readout.dla` checks on every run
that the parts sum to the model's own logits.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class Norm:
    """One normalisation, linearised around a run (all tensors float64, ``(d_model,)``).

    Attributes:
        center: LayerNorm (subtract the mean) rather than RMSNorm.
        weight: the effective elementwise weight (Gemma's ``1 + w`` already added).
        bias: the bias (zeros for RMSNorm).
        eps: added to the mean square before the root.
        scale_hook: the hook that shows this norm's scale ``(B, T, 1)`` in a run (bridged models), or None:
            the scale is computed from the norm's input.
        identity: no normalisation at all (the native GPT's ``normalization="none"``).
    """

    center: bool
    weight: torch.Tensor
    bias: torch.Tensor
    eps: float = 1e-5
    scale_hook: str | None = None
    identity: bool = False

    def project(self, x: torch.Tensor) -> torch.Tensor:
        """``P(x)`` over the last axis (centred for LayerNorm)."""
        return x - x.mean(-1, keepdim=True) if self.center else x

    def scale(self, x: torch.Tensor) -> torch.Tensor:
        """``(..., 1)``: the scale the norm divides its input ``x`` ``(..., d_model)`` by."""
        if self.identity:
            return torch.ones_like(x[..., :1])
        return (self.project(x).pow(2).mean(-1, keepdim=True) + self.eps).sqrt()

    def apply(self, x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        """The linear part at a frozen ``scale``: ``P(x) / scale * weight`` (add ``bias`` once for the sum)."""
        return self.project(x) / scale * self.weight

    def pullback(self, u: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        """The direction ``g`` with ``x . g == apply(x, scale) . u`` for every ``x``: ``P(weight * u) / scale``.

        ``P`` is an orthogonal projection (self-adjoint), so a readout direction moves through the norm
        onto its input without ever forming the parts' normalised vectors.
        """
        return self.project(self.weight * u) / scale


def identity_norm(d_model: int) -> Norm:
    one = torch.ones(d_model, dtype=torch.float64)
    return Norm(False, one, torch.zeros_like(one), 0.0, None, identity=True)


def native_norm(module: torch.nn.Module, d_model: int) -> Norm:
    """The native GPT's ``ln_f`` / ``ln_1`` (``nn.LayerNorm``) or ``nn.Identity``."""
    if isinstance(module, torch.nn.LayerNorm):
        w = module.weight.detach().double() if module.weight is not None else torch.ones(d_model).double()
        b = module.bias.detach().double() if module.bias is not None else torch.zeros(d_model).double()
        return Norm(True, w, b, float(module.eps))
    return identity_norm(d_model)


def bridge_norm(component: Any, name: str, d_model: int) -> Norm:
    """A TransformerLens normalisation bridge at hook prefix ``name`` (``ln_final``, ``blocks.3.ln1_post``)."""
    hf = getattr(component, "original_component", None)
    if hf is None or isinstance(hf, torch.nn.Identity):
        return identity_norm(d_model)
    rms = bool(getattr(component, "uses_rms_norm", False))
    w = getattr(hf, "weight", None)
    w = torch.ones(d_model, dtype=torch.float64) if w is None else w.detach().double()
    if getattr(component, "uses_weight_offset", False):
        w = 1.0 + w
    b = getattr(hf, "bias", None)
    b = torch.zeros(d_model, dtype=torch.float64) if rms or b is None else b.detach().double()
    eps = next((float(e) for e in (getattr(hf, "eps", None), getattr(hf, "variance_epsilon", None))
                if isinstance(e, int | float)), 1e-5)
    return Norm(not rms, w, b, eps, f"{name}.hook_scale")
