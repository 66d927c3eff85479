"""copying (weight-based, Elhage et al. 2021): positive-eigenvalue fraction of the OV circuit.

score = Σλ / Σ|λ| over the eigenvalues λ of the full OV circuit ``W_E W_V W_O W_U``
(d_vocab x d_vocab). Its non-zero eigenvalues are those of the cyclic product
``W_O W_U W_E W_V`` (d_head x d_head), so every head costs a tiny eigen-decomposition.
LayerNorms are ignored, as in Elhage et al. Needs embed and unembed: native GPTs, and
bridged models with a language-model head. Under grouped- or multi-query attention each query
head's OV circuit is its own W_O with its key/value group's W_V (HF ``repeat_kv`` order: query
head ``h`` reads value head ``h // (n_heads // n_kv_heads)``).
"""

from __future__ import annotations

from typing import Any

import torch

from headlens.detectors.base import Detector
from headlens.errors import DetectorError


def ov_weights(model: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """``(W_E (V, D), W_V (L, H, D, dh), W_O (L, H, dh, D), W_U (D, V))`` or None if not exposed."""
    if hasattr(model, "transformer") and hasattr(model, "lm_head"):  # native GPT
        L, H, D, dh = model.cfg.n_layers, model.cfg.n_heads, model.cfg.d_model, model.cfg.d_head
        A = H * dh  # the heads' width: d_model unless d_head was set freely (tracr)
        blocks = model.transformer.h
        w_v = torch.stack([b.attn.c_attn.weight[2 * A:] for b in blocks])  # (L, H*dh, D): v = x W^T
        w_v = w_v.view(L, H, dh, D).transpose(-1, -2)  # (L, H, D, dh): per-head V, x @ W_V
        w_o = torch.stack([b.attn.c_proj.weight for b in blocks])  # (L, D, H*dh): out = z W^T
        w_o = w_o.view(L, D, H, dh).permute(0, 2, 3, 1)  # (L, H, dh, D): per-head O, z_h @ W_O
        return model.transformer.wte.weight, w_v, w_o, model.lm_head.weight.T
    bridge = getattr(model, "bridge", None)
    if bridge is not None and getattr(model, "output_kind", "logits") == "logits":
        try:
            return bridge.W_E, bridge.W_V, bridge.W_O, bridge.W_U  # TL layout: (L, H, D, dh) ...
        except Exception:  # the bridge raises various errors for architectures it cannot split
            return None
    return None


def scores(model: Any) -> torch.Tensor:
    """``(n_layers, n_heads)`` float64 positive-eigenvalue fractions."""
    weights = ov_weights(model)
    if weights is None:
        raise DetectorError(
            f"copying needs the embedding and unembedding of {getattr(model, 'name', 'the model')!r}, "
            f"which this backend does not expose (a checkpoint without an LM head)"
        )
    w_e, w_v, w_o, w_u = (w.detach().to(torch.float64) for w in weights)
    n_heads, n_kv = w_o.shape[1], w_v.shape[1]
    if n_kv != n_heads:  # GQA/MQA: W_V is (L, H_kv, D, dh); give each query head its group's W_V
        if n_kv < 1 or n_heads % n_kv:
            raise DetectorError(f"copying: {n_heads} query heads cannot share {n_kv} value heads evenly")
        w_v = w_v.repeat_interleave(n_heads // n_kv, dim=1)  # (L, H, D, dh): query head h -> kv head h // group
    ue = w_u @ w_e  # (D, D): unembed then embed, shared by every head
    circuit = w_o @ ue @ w_v  # (L, H, dh, dh): cyclic permutation of W_E W_V W_O W_U
    lam = torch.linalg.eigvals(circuit)  # (L, H, dh) complex
    return (lam.real.sum(-1) / lam.abs().sum(-1).clamp_min(1e-300)).to(torch.float64)


DETECTOR = Detector("copying", "weights", None, None,
                    "OV circuit copies tokens (positive-eigenvalue fraction)", weights_fn=scores)
