"""Sparse scans on bridged Hugging Face models without the ``(B, H, T, T)`` pattern (long contexts).

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
  reads (:func:`headlens.models.hf.bridge.BridgeModel.attention_specs`): ``hook_rot_q``/``hook_rot_k``
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

from headlens.errors import HeadlensError

IMPL = "headlens_sdpa"
BAND = "headlens_band"  # attribute of a (B, 1, 1, K) padding mask from _mask: (causal, sliding window or None)
MASK_BLOCK_BYTES = 16 * 2**20  # with an explicit mask, SDPA gets query blocks whose float mask fits this
BLOCK_BYTES = 4 * 2**20  # our eager attention: (B, H, rows, keys) float32 scores per block (a few copies live at once)
SWAP = ("PositionEmbeddingsAttentionBridge", "JointQKVPositionEmbeddingsAttentionBridge", "JointQKVAttentionBridge")
IN_PLACE = ("AttentionBridge",)  # delegates to the HF module: only the attention implementation changes
_OWNERS: dict[int, tuple[Any, str]] = {}  # id(HF attention module) -> (bridge component, hooks to fire)
_registered = False


def _attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
               attention_mask: torch.Tensor | None, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """q ``(B, H, T, d)``, k ``(B, H_kv, T, d)`` to the bridge's hooks, then SDPA or :func:`_eager`, query block
    by query block whenever a mask is needed (each block's ``(B, 1, rows, K)`` mask built from :func:`_mask`'s band)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    owner, hooks = _OWNERS.get(id(module), (None, ""))
    if hooks == "rot":
        query, key = owner.hook_rot_q(query), owner.hook_rot_k(key)
    elif hooks == "linear":
        query, key = _through_linear_hook(owner.q.hook_out, query), _through_linear_hook(owner.k.hook_out, key)
    own = kwargs.get("softcap") is not None or kwargs.get("s_aux") is not None  # SDPA cannot do these exactly
    B, H, Q, _ = query.shape
    K = key.shape[2]
    band = getattr(attention_mask, BAND, None)
    if attention_mask is not None and band is None and attention_mask.shape[-2] != Q:
        raise HeadlensError(f"fused attention got a {tuple(attention_mask.shape)} mask for {Q} queries without its "
                            f"band; this model changes masks in a way headlens.models.hf.fused does not know")
    if not own and (attention_mask is None or band is None):  # causal without padding (is_causal), or a full mask
        rows = max(1, MASK_BLOCK_BYTES // (4 * B * K))
        if attention_mask is None or rows >= Q:
            return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    if band is None and attention_mask is None:  # our eager attention without a mask: causal unless told otherwise
        causal = kwargs.get("is_causal")
        band = (bool(getattr(module, "is_causal", True) if causal is None else causal) and Q > 1, None)
    rows = max(1, (BLOCK_BYTES // (4 * B * H * K)) if own else (MASK_BLOCK_BYTES // (4 * B * K)))
    fn = _eager if own else sdpa_attention_forward
    # one output up front: small per-block results kept alive between the big temporaries would pin
    # the allocator's heap, and the process would keep growing block by block
    out = value.new_empty(B, Q, H, value.shape[-1])  # (B, Q, H, d_v)
    causal, window = band if band is not None else (False, None)
    for q0 in range(0, Q, rows):
        q1 = min(Q, q0 + rows)
        # keys no row of the block can see are left out: before the window, after the last row (causal)
        k0 = max(0, q0 + K - Q - window + 1) if window is not None else 0
        k1 = q1 + K - Q if causal else K
        mask = _rows(attention_mask, band, q0, q1, k0, k1, K - Q, query.device)
        out[:, q0:q1] = fn(module, query[:, :, q0:q1], key[:, :, k0:k1], value[:, :, k0:k1], mask, **kwargs)[0]
    return out, None


def _rows(mask: torch.Tensor | None, band: tuple[bool, int | None] | None, q0: int, q1: int, k0: int, k1: int,
          offset: int, device: torch.device) -> torch.Tensor | None:
    """The bool mask of query rows ``q0 .. q1-1`` (at positions ``offset`` later) against keys ``k0 .. k1-1``:
    ``(B | 1, 1, rows, keys)``; None: all visible."""
    if band is None:
        return None if mask is None else mask[:, :, q0:q1, k0:k1]  # a full mask made elsewhere
    causal, window = band
    mask = None if mask is None else mask[..., k0:k1]  # (B, 1, 1, keys) padding
    if not causal and window is None:
        return mask
    idx = dict(dtype=torch.int32, device=device)
    gap = torch.arange(q0 + offset, q1 + offset, **idx)[:, None] - torch.arange(k0, k1, **idx)[None, :]  # q - k
    see = gap >= 0 if causal else torch.ones_like(gap, dtype=torch.bool)
    if window is not None:
        see &= gap < window
    see = see[None, None]  # (1, 1, rows, keys)
    return see if mask is None else see & mask


def _mask(batch_size: int, q_length: int, kv_length: int, q_offset: int = 0, kv_offset: int = 0,
          mask_function: Any = None, attention_mask: torch.Tensor | None = None, local_size: int | None = None,
          **kwargs: Any) -> torch.Tensor | None:
    """transformers' mask function for :data:`IMPL`: no ``(B, 1, T, T)`` mask where the pattern is a band.

    When ``mask_function`` is causal (with a sliding window of ``local_size``) or bidirectional,
    checked on every query row, the mask is the ``(B, 1, 1, K)`` padding (all True without padding)
    carrying ``(causal, window)`` as its :data:`BAND` attribute; :func:`_attention` builds each query
    block's rows from it. Causal prompts without padding get None (SDPA's ``is_causal``), as from
    ``sdpa_mask``. Anything else (chunked attention, a cache, vmap masks) goes to ``sdpa_mask``.
    """
    from transformers.masking_utils import prepare_padding_mask, sdpa_mask

    args = dict(batch_size=batch_size, q_length=q_length, kv_length=kv_length, q_offset=q_offset,
                kv_offset=kv_offset, mask_function=mask_function, attention_mask=attention_mask, local_size=local_size)
    device = kwargs.get("device", "cpu")
    if kwargs.get("use_vmap") or mask_function is None or q_offset or kv_offset or q_length != kv_length:
        return sdpa_mask(**args, **kwargs)
    band = _band(mask_function, batch_size, kv_length, local_size, device)
    if band is None:
        return sdpa_mask(**args, **kwargs)
    padding = prepare_padding_mask(attention_mask, kv_length, kv_offset)
    padding = None if padding is None or bool(padding.all()) else padding.bool()  # (B, K)
    if padding is None and band == (True, None) and kwargs.get("allow_is_causal_skip", True):
        return None
    if padding is None and band == (False, None) and kwargs.get("allow_is_bidirectional_skip", False):
        return None
    if padding is None:
        padding = torch.ones(batch_size, kv_length, dtype=torch.bool, device=device)
    mask = padding[:, None, None, :].clone()  # (B, 1, 1, K)
    setattr(mask, BAND, band)
    return mask


def _band(mask_function: Any, B: int, K: int, window: int | None, device: Any) -> tuple[bool, int | None] | None:
    """``(causal, window)`` when ``mask_function`` is exactly that band on all ``K`` rows (checked in blocks), else None."""
    window = window if window is not None and window < K else None
    try:
        causal = K > 1 and not bool(mask_function(torch.zeros((), dtype=torch.long), torch.zeros((), dtype=torch.long),
                                                  torch.zeros((), dtype=torch.long), torch.tensor(K - 1)))
        keys = torch.arange(K, device=device)[None, None, None, :]  # (1, 1, 1, K)
        batch = torch.arange(B, device=device)[:, None, None, None]  # (B, 1, 1, 1)
        rows = max(1, 2**22 // (B * K))
        for q0 in range(0, K, rows):
            q = torch.arange(q0, min(K, q0 + rows), device=device)[None, None, :, None]  # (1, 1, rows, 1)
            want = (keys <= q) if causal else torch.ones_like(keys <= q)
            if window is not None:
                want = want & (q - keys < window)
            got = mask_function(batch, torch.zeros_like(batch), q, keys)
            if not bool((torch.as_tensor(got, device=device).expand(B, 1, q.shape[2], K) == want).all()):
                return None
    except Exception:  # a mask function that does not take index tensors: let sdpa_mask build it
        return None
    return causal, window


def _through_linear_hook(point: Any, x: torch.Tensor) -> torch.Tensor:
    """``(B, H, T, d)`` through a projection's output hook point, which sees ``(B, T, H*d)``."""
    B, H, T, d = x.shape
    out = point(x.transpose(1, 2).reshape(B, T, H * d))  # the bridge's conversion shows (B, T, H, d)
    return out.view(B, T, H, d).transpose(1, 2)


def _eager(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
           attention_mask: torch.Tensor | None, scaling: float | None = None, softcap: float | None = None,
           s_aux: torch.Tensor | None = None, dropout: float = 0.0, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """Eager attention of a block of queries (the model's scale, soft-cap, bool mask, sinks): ``(B, rows, H, d)``.

    Same as transformers' eager Gemma-2 / GPT-OSS attention: ``s = q·k * scaling``, soft-capped
    ``cap * tanh(s / cap)``, masked; with sinks, a per-head extra logit joins each row's softmax and
    its probability is dropped. :func:`_attention` calls it per block of ``BLOCK_BYTES`` scores.
    """
    H, d = query.shape[1], query.shape[3]
    key = key.repeat_interleave(H // key.shape[1], dim=1)  # (B, H, K, d): grouped KV heads repeated
    value = value.repeat_interleave(H // value.shape[1], dim=1)
    s = (query @ key.transpose(-2, -1)) * (scaling if scaling is not None else d ** -0.5)  # (B, H, rows, K)
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)
    if attention_mask is not None:
        s = s.masked_fill(~attention_mask, float("-inf")) if attention_mask.dtype == torch.bool else s + attention_mask
    if s_aux is None:
        p = torch.softmax(s, dim=-1, dtype=torch.float32)
    else:
        sink = s_aux.reshape(1, -1, 1, 1).expand(s.shape[0], -1, s.shape[2], 1).to(s.dtype)  # (B, H, rows, 1)
        logits = torch.cat([s, sink], dim=-1)
        logits = logits - logits.max(dim=-1, keepdim=True).values
        p = torch.softmax(logits, dim=-1, dtype=torch.float32)[..., :-1]
    p = torch.nn.functional.dropout(p.to(value.dtype), p=dropout, training=module.training)
    return (p @ value).transpose(1, 2).contiguous(), None  # (B, rows, H, d)


def _register() -> None:
    global _registered
    if not _registered:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface

        AttentionInterface.register(IMPL, _attention)
        AttentionMaskInterface.register(IMPL, _mask)
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
    special = ("maintain_native_attention", "requires_relative_position_bias", "is_cross_attention")
    if kind in IN_PLACE and not any(getattr(attn, flag, False) for flag in special) \
            and not getattr(hf, "accepts_pattern_fn", False):
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
