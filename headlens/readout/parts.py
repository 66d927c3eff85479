"""Where each component of a model writes into the residual stream, and how the stream reaches the logits.

The final residual stream is a sum of parts, ``resid_final = embed + sum_l (attn_out_l + mlp_out_l)``, in
every pre-norm family (sequential or parallel blocks alike): ``embed`` is ``blocks.0.hook_resid_pre``
(token plus position embedding, scaled as the model scales it), ``mlp_out_l`` is ``blocks.{l}.hook_mlp_out``
(what the block adds, after any post-MLP norm). An attention layer's write splits over its heads:
``attn_out_l = Norm_post(sum_h z_h @ W_O[h] + b_O)``, ``z`` from ``blocks.{l}.attn.hook_z`` (per *query*
head, also under grouped-query attention), with ``Norm_post`` the identity except in Gemma 2 / 3 style
models; linearised at its frozen scale (:mod:`headlens.readout.norms`) it gives each head the share
``P(z_h W_O[h]) / scale * weight`` and leaves ``P(b_O) / scale * weight + bias`` to the bias term.
The logits read ``Norm_final(resid_final) @ W_U + b_U`` (then a soft-cap in Gemma 2).

:func:`model_parts` reads those hook names and weights once per model, for the native GPT and for
bridged Hugging Face models; encoders (BERT's post-norm blocks and non-linear MLM head) are refused.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from headlens.errors import HeadlensError
from headlens.readout.norms import Norm, bridge_norm, native_norm
from headlens.readout.write import write_path


class ReadoutError(HeadlensError):
    """A model or a request direct logit attribution cannot take (CLI exit 1)."""


@dataclass(frozen=True)
class Parts:
    """What direct logit attribution reads of one model.

    Attributes:
        n_layers, n_heads: the model's shape (query heads).
        embed: hook of the embedding's write (``blocks.0.hook_resid_pre``).
        z: per layer, the hook of the heads' outputs ``(B, T, H, d_head)``.
        mlp: per layer, the hook of the MLP's write ``(B, T, D)``; empty for attention-only models.
        resid: hook of the final residual stream (the final norm's input).
        logits: hook of the logits before any soft-cap (None: the forward's output).
        w_o: per layer ``(H, d_head, D)``: head h writes ``z_h @ w_o[h]``.
        b_o: per layer ``(D,)`` or None.
        post: per layer the norm after attention (Gemma 2 / 3), or None.
        final: the final norm.
        w_u: ``(D, V)`` unembedding; ``b_u``: ``(V,)`` or None.
        softcap: the final logit soft-cap (Gemma 2), or None.
    """

    n_layers: int
    n_heads: int
    embed: str
    z: list[str]
    mlp: list[str]
    resid: str
    logits: str | None
    w_o: list[torch.Tensor]
    b_o: list[torch.Tensor | None]
    post: list[Norm | None]
    final: Norm
    w_u: torch.Tensor
    b_u: torch.Tensor | None
    softcap: float | None = None

    @property
    def components(self) -> list[str]:
        """Component names in table order: ``embed``, then per layer its heads and ``mlp{l}``, then ``bias``."""
        names = ["embed"]
        for layer in range(self.n_layers):
            names += [f"L{layer}H{h}" for h in range(self.n_heads)]
            if self.mlp:
                names.append(f"mlp{layer}")
        return [*names, "bias"]


def unsupported(model: Any) -> str | None:
    """Why direct logit attribution cannot be read off ``model`` (one line), or None when it can: asked
    before a scan, so a classify whose gates need DLA refuses or skips them up front."""
    name = getattr(model, "name", type(model).__name__)
    if getattr(model, "output_kind", "logits") != "logits":
        return f"direct logit attribution reads logits; {name!r} has no output head (it returns hidden states)"
    if not model.is_causal:
        return (f"direct logit attribution needs a causal LM whose residual stream is a sum of parts; "
                f"{name!r} is an encoder (post-norm blocks, a non-linear MLM head)")
    if packed := getattr(model, "packed_weights", None):  # headlens.models.hf.external
        return (f"direct logit attribution reads W_O and W_U, and {name!r} stores its weights packed "
                f"({packed}); load the unquantized model for it")
    return None


def model_parts(model: Any) -> Parts:
    """The :class:`Parts` of a native GPT or a bridged causal LM; ``ReadoutError`` for what DLA cannot read."""
    if why := unsupported(model):
        raise ReadoutError(why)
    return _bridge_parts(model) if hasattr(model, "bridge") else _native_parts(model)


def _native_parts(model: Any) -> Parts:
    cfg, blocks = model.cfg, model.transformer.h
    H, D, L = cfg.n_heads, cfg.d_model, cfg.n_layers
    write = write_path(model)
    w_o = [write.w_o(layer) for layer in range(L)]  # (H, d_head, D): z_h @ W_O[h]
    b_o = [b.attn.c_proj.bias.detach() for b in blocks]
    mlp = [] if cfg.attn_only else [f"blocks.{layer}.hook_mlp_out" for layer in range(L)]
    return Parts(L, H, "blocks.0.hook_resid_pre", [f"blocks.{layer}.attn.hook_z" for layer in range(L)], mlp,
                 f"blocks.{L - 1}.hook_resid_post", None, w_o, b_o, [None] * L,
                 native_norm(model.transformer.ln_f, D), model.lm_head.weight.detach().T, None)


def _bridge_parts(model: Any) -> Parts:
    bridge, hooks = model.bridge, model.hook_dict
    L, H, D = model.cfg.n_layers, model.cfg.n_heads, model.cfg.d_model
    need = ["blocks.0.hook_resid_pre", "ln_final.hook_in", *(f"blocks.{layer}.attn.hook_z" for layer in range(L))]
    missing = [n for n in need if n not in hooks]
    if missing:
        raise ReadoutError(f"{model.name}: the bridge of this architecture has no {missing[0]} hook, which direct "
                           f"logit attribution reads")
    try:
        write = write_path(model)
        w_o = [write.w_o(layer) for layer in range(L)]  # (H, d_head, D) per query head
        w_u = bridge.W_U.detach()  # (D, V)
    except Exception as err:  # the bridge raises various errors for architectures it cannot split
        raise ReadoutError(f"{model.name}: cannot read the per-head output projection or the unembedding ({err})") from None
    b_o = [_maybe(bridge.blocks[layer].attn, "b_O") for layer in range(L)]
    post = [bridge_norm(bridge.blocks[layer].ln1_post, f"blocks.{layer}.ln1_post", D)
            if hasattr(bridge.blocks[layer], "ln1_post") else None for layer in range(L)]
    mlp = [f"blocks.{layer}.hook_mlp_out" for layer in range(L)]
    hf = getattr(getattr(bridge, "original_model", None), "config", None)
    softcap = getattr(getattr(hf, "text_config", None) or hf, "final_logit_softcapping", None)
    b_u = _maybe(bridge, "b_U")
    scale = getattr(hf, "logit_scale", None)  # Cohere: logits = lm_head(x) * logit_scale, a factor DLA folds into W_U
    scaled = bool(scale) and not getattr(getattr(bridge, "adapter", None), "_logit_scale_already_folded", False)
    if scaled:  # unembed.hook_out is then before the scale: the parts sum to the forward's own output
        w_u, b_u = w_u * float(scale), None if b_u is None else b_u * float(scale)
    return Parts(L, H, "blocks.0.hook_resid_pre", [f"blocks.{layer}.attn.hook_z" for layer in range(L)],
                 [m for m in mlp if m in hooks], "ln_final.hook_in",
                 "unembed.hook_out" if "unembed.hook_out" in hooks and not scaled else None, w_o, b_o, post,
                 bridge_norm(bridge.ln_final, "ln_final", D), w_u, b_u,
                 float(softcap) if softcap else None)


def _maybe(obj: Any, attr: str) -> torch.Tensor | None:
    try:
        value = getattr(obj, attr)
    except Exception:  # a bridge without that parameter raises rather than returning None
        return None
    return value.detach() if isinstance(value, torch.Tensor) else None
