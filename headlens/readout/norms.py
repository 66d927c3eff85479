"""A model's normalisations as a linear readout sees them: ``y = P(x) / scale * weight + bias``.

``P`` centres ``x`` for LayerNorm (subtracts its mean) and is the identity for RMSNorm; ``scale`` is
``sqrt(mean(P(x)^2) + eps)``, one positive number per position; ``weight`` is the per-channel scale.

Two readers use this, one file so they agree on each family's norm:

* **Ranking** (:mod:`headlens.readout.ov`, :mod:`headlens.circuits.composition`): whatever reads a norm's
  output linearly (a head's ``W_V``, the unembedding) folds ``P`` and ``weight`` into its weights; the
  scale stays a per-row factor, which changes no ranking of a row's entries and no ratio of composition
  scores (:func:`norm_scale`, :func:`centres`).
* **Exact decomposition** (:mod:`headlens.readout.dla`): with the scale *frozen* at its clean-run value the
  norm is linear in ``x`` (plus ``bias``), so anything written to its input splits exactly into per-part
  shares: the final norm before the unembedding and, in Gemma 2 and 3, the norm each attention and MLP
  output passes *after* the sublayer (``post_attention_layernorm``), whose share of each head is
  ``P(head) / scale * weight`` (:class:`Norm`).

Why read ``weight`` by *running* the norm: the families disagree on how a stored weight becomes the scale
(Llama multiplies by ``weight``, Gemma by ``1 + weight``), and running the module on rows of equal
entries returns the scale each family really applies (:func:`norm_scale`). Nothing here is trusted
blindly: :mod:`headlens.readout.dla` checks on every run that the parts sum to the model's own logits.
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
        w = norm_scale(module)
        w = torch.ones(d_model, dtype=torch.float64) if w is None else w
        b = module.bias.detach().double() if module.bias is not None else torch.zeros(d_model).double()
        return Norm(True, w, b, float(module.eps))
    return identity_norm(d_model)


def bridge_norm(component: Any, name: str, d_model: int) -> Norm:
    """A TransformerLens normalisation bridge at hook prefix ``name`` (``ln_final``, ``blocks.3.ln1_post``)."""
    hf = getattr(component, "original_component", None)
    if hf is None or isinstance(hf, torch.nn.Identity):
        return identity_norm(d_model)
    rms = bool(getattr(component, "uses_rms_norm", False))
    w = norm_scale(hf)  # the family's own convention (Gemma's 1 + weight), read by running the module
    w = torch.ones(d_model, dtype=torch.float64) if w is None else w
    b = getattr(hf, "bias", None)
    b = torch.zeros(d_model, dtype=torch.float64) if rms or b is None else b.detach().double()
    eps = next((float(e) for e in (getattr(hf, "eps", None), getattr(hf, "variance_epsilon", None))
                if isinstance(e, int | float)), 1e-5)
    return Norm(not rms, w, b, eps, f"{name}.hook_scale")


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
    D = weight.shape[0]
    # entries of +-1e3 (RMS 1e3 >> eps): with D even their mean is 0, so a norm that centres without a bias
    # (Cohere's LayerNorm) reads them as an RMSNorm does, where a row of equal entries would centre to zeros
    sign = torch.ones(D) if D % 2 else torch.tensor([1.0, -1.0]).repeat(D // 2)
    probe = (1e3 * sign).to(weight).reshape(1, 1, D)
    with torch.no_grad():
        out = module(probe)
    out = out[0] if isinstance(out, tuple) else out
    return (out.reshape(-1).detach().double().cpu() * sign.double())  # g * x / rms(x) = g * sign


def centres(model: Any) -> bool:
    """True when the model's norms are LayerNorms, which subtract each row's mean (GPT-2, GPT-NeoX, OPT,
    Phi-1/2); False for RMSNorm (Llama, Mistral, Qwen2, Gemma) and for models without norms."""
    if hasattr(model, "bridge"):
        return getattr(model.bridge.cfg, "normalization_type", None) == "LN"
    return getattr(model.cfg, "normalization", None) == "LN"
