"""What a bridged model's config says about its attention layers: key/value heads under GQA and MQA,
and per layer the :class:`~headlens.models.attention.AttentionSpec` (q/k hooks, scale, causal, sliding
window, soft-cap, sinks) that the LSE scan and the fused attention need.
"""

from __future__ import annotations

from typing import Any

import torch

from headlens.models.attention import AttentionSpec


def n_kv_heads(bridge: Any) -> int:
    """Key/value heads per layer: TransformerLens' ``n_key_value_heads``, else the HF config's
    ``num_key_value_heads`` / ``num_kv_heads`` / ``multi_query`` (Falcon, GPT-BigCode), else n_heads."""
    n = getattr(bridge.cfg, "n_key_value_heads", None)
    if n:
        return int(n)
    hf = getattr(getattr(bridge, "original_model", None), "config", None)
    for key in ("num_key_value_heads", "num_kv_heads"):
        if getattr(hf, key, None):
            return int(getattr(hf, key))
    if getattr(hf, "multi_query", False):
        return 1
    return int(bridge.cfg.n_heads)


def attention_specs(bridge: Any, causal: bool) -> list[Any] | None:
    hf = getattr(getattr(bridge, "original_model", None), "config", None)
    hf = getattr(hf, "text_config", None) or hf
    specs = []
    points = bridge.hook_dict  # rebuilt, aliases and all, on every access: read once, not three times a layer
    for layer in range(int(bridge.cfg.n_layers)):
        pre = f"blocks.{layer}.attn."
        rot = pre + "hook_rot_q" in points
        q_hook, k_hook = (pre + "hook_rot_q", pre + "hook_rot_k") if rot else (pre + "hook_q", pre + "hook_k")
        if q_hook not in points or k_hook not in points:
            return None
        module = getattr(bridge.blocks[layer].attn, "original_component", None)
        scale = getattr(module, "scaling", None)
        scale = float(scale) if isinstance(scale, int | float) else 1.0 / float(bridge.cfg.d_head) ** 0.5
        if getattr(hf, "scale_attn_by_inverse_layer_idx", False):
            scale /= layer + 1
        softcap = getattr(hf, "attn_logit_softcapping", None)
        sinks = getattr(module, "sinks", None)  # GPT-OSS: (n_heads,) sink logits
        sinks = tuple(float(x) for x in sinks.detach().float().cpu()) if isinstance(sinks, torch.Tensor) else None
        specs.append(AttentionSpec(q_hook, k_hook, "BTHD", scale, causal, window(hf, layer),
                                   float(softcap) if softcap else None, sinks))
    return specs


def window(hf: Any, layer: int) -> int | None:
    """The sliding window of ``layer`` (key k visible from q when ``q - k < window``), or None."""
    window = getattr(hf, "sliding_window", None)
    if not window or getattr(hf, "use_sliding_window", True) is False:
        return None
    types = getattr(hf, "layer_types", None)
    if types is not None and layer < len(types) and types[layer] != "sliding_attention":
        return None
    return int(window)
