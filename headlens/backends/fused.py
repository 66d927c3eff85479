"""Sparse scans on bridged Hugging Face models without the ``(B, H, T, T)`` pattern (issue 13).

Why: TransformerBridge reimplements every rotary attention layer
(``PositionEmbeddingsAttentionBridge.forward``) so that it can fire ``hook_pattern``; it computes
and softmaxes the full pattern in every forward. The LSE scan needs only q and k, so during a
sparse scan :func:`fused_attention` puts the model's own Hugging Face attention modules back in
their decoder layers and runs them under the attention implementation ``"headlens_sdpa"``:
transformers' ``sdpa_attention_forward`` (the model's own scale, mask, sliding window; unrepeated
KV heads) after handing q and k (after RoPE) to the bridge's ``hook_rot_q``/``hook_rot_k``
hook points. The scan's hooks on those names fire as before; every other hook of the bridge
(residual stream, MLP ...) too. ``hook_attn_scores``, ``hook_pattern`` and the other hooks of the
bridge's own attention reimplementation do not fire inside; a sparse scan never uses them.

Masks come from transformers' ``sdpa_mask``: none at all for causal prompts without padding
(``is_causal``), else a ``(B, 1, T, T)`` bool mask (1 byte per entry, shared by all layers and
heads; a sliding window always needs one). SDPA on the CPU copies a mask to float, so with a mask
the queries go through in blocks of at most ``MASK_BLOCK_BYTES`` of mask each.

Layers this cannot take over (no rotary hooks, soft-capping, attention sinks: GPT-2, BERT,
Gemma-2 ...) keep the bridge forward; the scan is exact either way.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

IMPL = "headlens_sdpa"
MASK_BLOCK_BYTES = 16 * 2**20  # with an explicit mask, SDPA gets query blocks whose float mask fits this
_OWNERS: dict[int, Any] = {}  # id(HF attention module) -> its bridge component, while a swap is active
_registered = False


def _attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
               attention_mask: torch.Tensor | None, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers' SDPA attention, with q ``(B, H, T, d)`` and k ``(B, H_kv, T, d)`` shown to the bridge's hooks."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    owner = _OWNERS.get(id(module))
    if owner is not None:
        query, key = owner.hook_rot_q(query), owner.hook_rot_k(key)
    B, _, Q, _ = query.shape
    rows = max(1, MASK_BLOCK_BYTES // (4 * B * key.shape[2]))
    if attention_mask is None or attention_mask.ndim != 4 or attention_mask.shape[2] != Q or rows >= Q:
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    # an explicit mask (sliding window, padding): query blocks, so SDPA's float copy of it stays small
    blocks = [sdpa_attention_forward(module, query[:, :, i:i + rows], key, value, attention_mask[:, :, i:i + rows],
                                     **kwargs)[0] for i in range(0, Q, rows)]  # each (B, rows, H, d)
    return torch.cat(blocks, dim=1), None


def _register() -> None:
    global _registered
    if not _registered:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

        AttentionInterface.register(IMPL, _attention)
        AttentionMaskInterface.register(IMPL, sdpa_mask)
        _registered = True


def _takes_over(attn: Any) -> bool:
    """Whether the HF module behind bridge component ``attn`` can run under :data:`IMPL` exactly."""
    hf = getattr(attn, "original_component", None)
    return (type(attn).__name__ == "PositionEmbeddingsAttentionBridge" and hf is not None
            and hasattr(attn, "hook_rot_q") and hasattr(attn, "hook_rot_k")
            and getattr(hf, "attn_logit_softcapping", None) is None and getattr(hf, "sinks", None) is None)


def _is_bridge_component(module: torch.nn.Module) -> bool:
    return type(module).__module__.startswith("transformer_lens")


@contextlib.contextmanager
def fused_attention(bridge: Any) -> Iterator[bool]:
    """Run ``bridge``'s attention through :data:`IMPL` inside the block; yields whether it could.

    All layers or none: a model whose layers cannot all be taken over keeps the bridge forward.
    """
    model = getattr(bridge, "original_model", None)
    attns = [block.attn for block in getattr(bridge, "blocks", [])]
    if model is None or not attns or not all(_takes_over(a) for a in attns):
        yield False
        return
    _register()
    by_id = {id(a): a for a in attns}
    swaps = [(parent, name, child) for parent in model.modules() if not _is_bridge_component(parent)
             for name, child in parent.named_children() if id(child) in by_id]
    if len(swaps) != len(attns):  # the HF layers do not hold the bridge components where expected
        yield False
        return
    configs = {id(m.config): m.config for m in model.modules() if hasattr(getattr(m, "config", None), "_attn_implementation")}
    before = {key: cfg._attn_implementation for key, cfg in configs.items()}
    try:
        for parent, name, child in swaps:
            setattr(parent, name, child.original_component)
            _OWNERS[id(child.original_component)] = child
        for cfg in configs.values():
            cfg._attn_implementation = IMPL
        yield True
    finally:
        for key, cfg in configs.items():
            cfg._attn_implementation = before[key]
        for parent, name, child in swaps:
            _OWNERS.pop(id(child.original_component), None)
            setattr(parent, name, child)
