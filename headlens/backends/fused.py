"""Sparse scans on bridged Hugging Face models without the ``(B, H, T, T)`` pattern (issue 13).

Why: TransformerBridge builds and softmaxes the full pattern in every attention layer so that it
can fire ``hook_pattern``. Rotary and fused-qkv families (Llama, Mistral, Qwen2, Gemma, Phi-3,
GPT-NeoX, GPT-2: ``PositionEmbeddingsAttentionBridge``, ``JointQKV...AttentionBridge``)
reimplement attention in the bridge; the others (OPT, GPT-J, BERT, RoBERTa: ``AttentionBridge``)
delegate to the Hugging Face module, which the bridge runs with eager attention to get the weights.
The LSE scan needs only q and k, so during a sparse scan :func:`fused_attention`

* puts the model's own HF attention module back in its decoder layer where the bridge
  reimplements attention ("swap"), and leaves delegating components in place;
* runs every HF attention under the implementation ``"headlens_sdpa"`` (registered with
  ``transformers.AttentionInterface``), which first hands q and k to the hook points the scan
  reads (:func:`headlens.backends.bridge.BridgeModel.attention_specs`): ``hook_rot_q``/``hook_rot_k``
  after RoPE, ``(B, H, T, d)`` with unrepeated KV heads, or for GPT-2 ``q.hook_out``/``k.hook_out``
  (``hook_q``/``hook_k``) as the bridge's q/k projections give them, ``(B, T, H*d)``. Where the HF
  module's own q/k projections are bridge components (OPT, BERT ...) those hooks fire by themselves.
  Then it calls transformers' ``sdpa_attention_forward`` (the model's scale, GQA, mask), or, for
  layers SDPA cannot do exactly (logit soft-capping, Gemma-2; attention sinks, GPT-OSS), a blocked
  attention of our own (:func:`_blocked`): query blocks, scores ``(B, H, rows, T)`` with the
  module's scale, soft-cap, mask and sinks, softmax, ``@ v``.

The scan's hooks fire as before, and so do the bridge's residual and MLP hooks. ``hook_pattern``,
``hook_attn_scores``, ``hook_z`` of the bridge's attention do not fire inside; a sparse scan never
uses them. On exit everything is restored (also when the scan stops the forward early).

Masks come from transformers' ``sdpa_mask`` (registered with ``AttentionMaskInterface`` under the
same name, so padding is never ignored): none at all for causal prompts without padding
(``is_causal``), else a ``(B, 1, T, T)`` bool mask (1 byte per entry, shared by all layers and
heads; a sliding window or a padded encoder batch needs one). SDPA on the CPU copies a mask to
float, so with a mask the queries go through in blocks of at most ``MASK_BLOCK_BYTES`` of it each.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Any

import torch

IMPL = "headlens_sdpa"
MASK_BLOCK_BYTES = 16 * 2**20  # with an explicit mask, SDPA gets query blocks whose float mask fits this
BLOCK_BYTES = 16 * 2**20  # the blocked attention's (B, H, rows, T) float32 scores per block
SWAP = ("PositionEmbeddingsAttentionBridge", "JointQKVPositionEmbeddingsAttentionBridge", "JointQKVAttentionBridge")
IN_PLACE = ("AttentionBridge",)  # delegates to the HF module: only the attention implementation changes
_OWNERS: dict[int, tuple[Any, str]] = {}  # id(HF attention module) -> (bridge component, hooks to fire)
_registered = False


def _attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
               attention_mask: torch.Tensor | None, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """q ``(B, H, T, d)``, k ``(B, H_kv, T, d)`` to the bridge's hooks, then SDPA or :func:`_blocked`."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    owner, hooks = _OWNERS.get(id(module), (None, ""))
    if hooks == "rot":
        query, key = owner.hook_rot_q(query), owner.hook_rot_k(key)
    elif hooks == "linear":
        query, key = _through_linear_hook(owner.q.hook_out, query), _through_linear_hook(owner.k.hook_out, key)
    if kwargs.get("softcap") is not None or kwargs.get("s_aux") is not None:
        return _blocked(module, query, key, value, attention_mask, **kwargs)
    B, _, Q, _ = query.shape
    rows = max(1, MASK_BLOCK_BYTES // (4 * B * key.shape[2]))
    if attention_mask is None or attention_mask.ndim != 4 or attention_mask.shape[2] != Q or rows >= Q:
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    # an explicit mask (sliding window, padding): query blocks, so SDPA's float copy of it stays small
    blocks = [sdpa_attention_forward(module, query[:, :, i:i + rows], key, value, attention_mask[:, :, i:i + rows],
                                     **kwargs)[0] for i in range(0, Q, rows)]  # each (B, rows, H, d)
    return torch.cat(blocks, dim=1), None


def _through_linear_hook(point: Any, x: torch.Tensor) -> torch.Tensor:
    """``(B, H, T, d)`` through a projection's output hook point, which sees ``(B, T, H*d)``."""
    B, H, T, d = x.shape
    out = point(x.transpose(1, 2).reshape(B, T, H * d))  # the bridge's conversion shows (B, T, H, d)
    return out.view(B, T, H, d).transpose(1, 2)


def _blocked(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
             attention_mask: torch.Tensor | None, scaling: float | None = None, softcap: float | None = None,
             s_aux: torch.Tensor | None = None, dropout: float = 0.0, is_causal: bool | None = None,
             **kwargs: Any) -> tuple[torch.Tensor, None]:
    """Eager attention (the model's scale, soft-cap, mask, sinks) for query blocks of ``BLOCK_BYTES`` scores.

    Same as transformers' eager Gemma-2 / GPT-OSS attention: ``s = q·k * scaling``, soft-capped
    ``cap * tanh(s / cap)``, masked; with sinks, a per-head extra logit joins each row's softmax and
    its probability is dropped. Returns ``(B, T, H, d)`` like the other attention functions.
    """
    B, H, Q, d = query.shape
    K = key.shape[2]
    key = key.repeat_interleave(H // key.shape[1], dim=1)  # (B, H, K, d): grouped KV heads repeated
    value = value.repeat_interleave(H // value.shape[1], dim=1)
    scale = scaling if scaling is not None else d ** -0.5
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    causal = bool(causal) and attention_mask is None and Q > 1
    rows = max(1, BLOCK_BYTES // (4 * B * H * K))
    out = []
    for i in range(0, Q, rows):
        s = (query[:, :, i:i + rows] @ key.transpose(-2, -1)) * scale  # (B, H, C, K)
        if softcap is not None:
            s = softcap * torch.tanh(s / softcap)
        if attention_mask is not None:
            m = attention_mask[:, :, i:i + rows, :K]  # (B, 1, C, K)
            s = s.masked_fill(~m, float("-inf")) if m.dtype == torch.bool else s + m
        elif causal:
            qpos = torch.arange(i, min(Q, i + rows), device=s.device)[:, None] + (K - Q)  # (C, 1)
            s = s.masked_fill(torch.arange(K, device=s.device)[None, :] > qpos, float("-inf"))
        if s_aux is None:
            p = torch.softmax(s, dim=-1, dtype=torch.float32)
        else:
            sink = s_aux.reshape(1, -1, 1, 1).expand(B, -1, s.shape[2], 1).to(s.dtype)  # (B, H, C, 1)
            logits = torch.cat([s, sink], dim=-1)
            logits = logits - logits.max(dim=-1, keepdim=True).values
            p = torch.softmax(logits, dim=-1, dtype=torch.float32)[..., :-1]
        p = torch.nn.functional.dropout(p.to(value.dtype), p=dropout, training=module.training)
        out.append(p @ value)  # (B, H, C, d)
    return torch.cat(out, dim=2).transpose(1, 2).contiguous(), None


def _register() -> None:
    global _registered
    if not _registered:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

        AttentionInterface.register(IMPL, _attention)
        AttentionMaskInterface.register(IMPL, sdpa_mask)
        _registered = True


def _plan(attn: Any) -> tuple[str, str] | None:
    """How the bridge attention component ``attn`` runs under :data:`IMPL`: ``(placement, hooks)``, or None.

    placement: ``"swap"`` (its HF module goes back in) or ``"in_place"``; hooks: which hook points
    the attention function fires itself: ``"rot"``, ``"linear"`` or ``""`` (they fire inside the HF module).
    """
    hf = getattr(attn, "original_component", None)
    kind = type(attn).__name__
    if hf is None or "ALL_ATTENTION_FUNCTIONS" not in vars(sys.modules[type(hf).__module__]):
        return None  # the HF module does not dispatch through transformers' attention interface
    rot = hasattr(attn, "hook_rot_q") and hasattr(attn, "hook_rot_k")
    if kind in SWAP:
        if rot:
            return "swap", "rot"
        q, k = getattr(attn, "q", None), getattr(attn, "k", None)
        return ("swap", "linear") if hasattr(q, "hook_out") and hasattr(k, "hook_out") else None
    if kind in IN_PLACE and not getattr(attn, "maintain_native_attention", False):
        return "in_place", "rot" if rot else ""
    return None


def _is_bridge_component(module: torch.nn.Module) -> bool:
    return type(module).__module__.startswith("transformer_lens")


@contextlib.contextmanager
def fused_attention(bridge: Any) -> Iterator[bool]:
    """Run ``bridge``'s attention through :data:`IMPL` inside the block; yields whether it could.

    All layers or none: a model whose layers cannot all be taken over keeps the bridge forward.
    """
    model = getattr(bridge, "original_model", None)
    attns = [block.attn for block in getattr(bridge, "blocks", [])]
    plans = [_plan(a) for a in attns]
    if model is None or not attns or None in plans:
        yield False
        return
    _register()
    by_id = {id(a): a for a, plan in zip(attns, plans, strict=True) if plan[0] == "swap"}
    swaps = [(parent, name, child) for parent in model.modules() if not _is_bridge_component(parent)
             for name, child in parent.named_children() if id(child) in by_id]
    if len(swaps) != len(by_id):  # the HF layers do not hold the bridge components where expected
        yield False
        return
    configs = {id(m.config): m.config for m in model.modules() if hasattr(getattr(m, "config", None), "_attn_implementation")}
    before = {key: cfg._attn_implementation for key, cfg in configs.items()}
    owners = {id(a.original_component): (a, plan[1]) for a, plan in zip(attns, plans, strict=True) if plan[1]}
    try:
        for parent, name, child in swaps:
            setattr(parent, name, child.original_component)
        _OWNERS.update(owners)
        for cfg in configs.values():
            cfg._attn_implementation = IMPL
        yield True
    finally:
        for key, cfg in configs.items():
            cfg._attn_implementation = before[key]
        for key in owners:
            _OWNERS.pop(key, None)
        for parent, name, child in swaps:
            setattr(parent, name, child)
