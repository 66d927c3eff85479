"""A native twin of a bridged GPT-2: the same weights in headlens' own GPT, so the fast path applies.

Through the bridge every patched edge costs a whole forward (TransformerBridge's ``start_at_layer`` still
runs the blocks before it). A Hugging Face ``GPT2LMHeadModel`` with GPT-2's own choices (``gelu_new``,
scores scaled by ``1/sqrt(d_head)`` only, no unembedding bias) is exactly headlens' native GPT, so its
weights are copied once into one (read in TransformerLens' layout from the bridge: ``W_Q (H, D, d)``,
``W_O (H, d, D)``, ...) and edges run on the cached fast path. Any other model gets None and keeps the
bridge path. The twin's logits equal the bridge's up to float rounding (tested).
"""

from __future__ import annotations

from typing import Any

import torch

from headlens.models.config import ModelConfig
from headlens.models.gpt import GPT


def _plain_gpt2(model: Any) -> Any:
    """The bridged model's Hugging Face config when it is a plain GPT-2, else None."""
    if "GPT2LMHeadModel" not in (getattr(model, "hf_config", {}).get("architectures") or []):
        return None
    hf = getattr(getattr(model.bridge, "original_model", None), "config", None)
    if hf is None or hf.activation_function != "gelu_new" or not hf.scale_attn_weights:
        return None
    if hf.scale_attn_by_inverse_layer_idx or hf.reorder_and_upcast_attn:
        return None
    return hf


def native_twin(model: Any) -> GPT | None:
    """A native ``GPT`` with ``model``'s weights when ``model`` is a bridged plain GPT-2, else None (cached)."""
    if hasattr(model, "_native_twin"):
        return model._native_twin
    twin = _build(model) if hasattr(model, "bridge") else None
    model._native_twin = twin
    return twin


def _build(model: Any) -> GPT | None:
    hf = _plain_gpt2(model)
    b = model.bridge
    if hf is None or b.b_U.abs().max() > 0 or model.cfg.d_vocab < 257:
        return None
    c = model.cfg
    cfg = ModelConfig(n_layers=c.n_layers, n_heads=c.n_heads, d_model=c.d_model, n_ctx=c.n_ctx, d_vocab=c.d_vocab,
                      d_mlp=int(b.blocks[0].mlp.W_in.shape[1]), layer_norm_eps=float(hf.layer_norm_epsilon))
    twin = GPT(cfg, name=model.name)
    H, d, D = c.n_heads, c.d_head, c.d_model
    with torch.no_grad():
        t = twin.transformer
        t.wte.weight.copy_(b.W_E)
        t.wpe.weight.copy_(b.W_pos)
        for layer, block in enumerate(t.h):
            src = b.blocks[layer]
            a = src.attn
            w = [getattr(a, n).permute(0, 2, 1).reshape(H * d, D) for n in ("W_Q", "W_K", "W_V")]  # (H*d, D) each
            block.attn.c_attn.weight.copy_(torch.cat(w))  # (3D, D): q, k, v rows, heads in order
            block.attn.c_attn.bias.copy_(torch.cat([getattr(a, n).reshape(H * d) for n in ("b_Q", "b_K", "b_V")]))
            block.attn.c_proj.weight.copy_(a.W_O.reshape(H * d, D).T)  # (D, H*d): heads merged on the input
            block.attn.c_proj.bias.copy_(a.b_O)
            block.ln_1.weight.copy_(src.ln1.w)
            block.ln_1.bias.copy_(src.ln1.b)
            block.ln_2.weight.copy_(src.ln2.w)
            block.ln_2.bias.copy_(src.ln2.b)
            block.mlp.c_fc.weight.copy_(src.mlp.W_in.T)  # (d_mlp, D)
            block.mlp.c_fc.bias.copy_(src.mlp.b_in)
            block.mlp.c_proj.weight.copy_(src.mlp.W_out.T)  # (D, d_mlp)
            block.mlp.c_proj.bias.copy_(src.mlp.b_out)
        t.ln_f.weight.copy_(b.ln_final.w)
        t.ln_f.bias.copy_(b.ln_final.b)
        twin.lm_head.weight.copy_(b.W_U.T)  # (V, D)
    return twin.to(model.device).eval()
