"""The write path: what a head, an MLP or the embedding adds to the residual stream for a given activation.

This is the one place that says how a component's activation becomes its write (ARCHITECTURE.md, "Write
path"); sender deltas, logits edges, discovery, faithfulness's edges and the gradient first pass all read
their deltas from here.

Why it looks like this:

* **Two rules, chosen per layer by the family's own modules.** Where nothing normalises a sublayer's output
  before it joins the residual stream (GPT-2, Llama, Mistral, Qwen2/3, Phi, Falcon, ...), a head's write is
  linear in its ``z``: ``z_h @ W_O[h]``, and a change of it is ``dz_h @ W_O[h]`` (the fast path, one matmul).
  Where a post-attention norm follows (Gemma 2/3 ``post_attention_layernorm``, OLMo-2's post-only norms) the
  layer adds ``PostNorm(O)``, ``O = sum_h z_h @ W_O[h] + b_O``, so head ``h``'s change is
  ``PostNorm(O + dz_h @ W_O[h]) - PostNorm(O)`` with the layer's other heads clean: the norm's scale moves
  with the head, and a linear write there is wrong by the norm's gain (a confident wrong circuit).
* **The family's own norm module is run**, not a restatement of it (Gemma's ``1 + weight``, OLMo-2's
  RMSNorm): whatever the family computes is what the write is. Autograd runs through it unchanged, so a
  gradient taken through a write sees the post-norm's Jacobian.
* **An MLP's activation is what it computes before its post-norm** (``blocks.{l}.ln2_post.hook_in``, Gemma's
  ``post_feedforward_layernorm`` input) and its write is ``PostNorm(m') - PostNorm(m)``; without a post-norm
  it is ``hook_mlp_out`` and the write is ``m' - m``. The embedding (``blocks.0.hook_resid_pre``) writes itself.
* DLA (:mod:`headlens.readout.dla`) keeps its frozen-scale linearisation of the same norm: a decomposition
  into per-head shares that sum to the logit needs linear parts, and says so there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


def _hf_norm(component: Any) -> torch.nn.Module | None:
    """The family's own module inside a bridge norm component (None: absent or an identity)."""
    hf = getattr(component, "original_component", None)
    return None if hf is None or isinstance(hf, torch.nn.Identity) else hf


@dataclass(frozen=True)
class WritePath:
    """How each component of one model writes into the residual stream (build it with :func:`write_path`).

    Attributes:
        model: the model (native GPT or bridge); ``W_O`` is read from it once per layer, lazily.
        post_attn: per layer, the norm after attention (Gemma 2/3, OLMo-2), or None: the linear write.
        post_mlp: per layer, the norm after the MLP, or None.
        has_mlp: the model has MLPs (not attention-only).
    """

    model: Any
    post_attn: tuple[torch.nn.Module | None, ...]
    post_mlp: tuple[torch.nn.Module | None, ...]
    has_mlp: bool = True

    @property
    def linear(self) -> bool:
        """True when every write is linear in its activation (no post-sublayer norm anywhere)."""
        return all(n is None for n in (*self.post_attn, *self.post_mlp))

    def activations(self) -> dict[str, str]:
        """What to cache from one run, by key -> hook name: each sender's activation (``z{l}``, ``mlp{l}``,
        ``embed``) and, under a post-attention norm, that norm's input ``attn{l}`` (``O``, all heads)."""
        names = {"embed": "blocks.0.hook_resid_pre"}
        for layer in range(len(self.post_attn)):
            names[f"z{layer}"] = f"blocks.{layer}.attn.hook_z"
            if self.post_attn[layer] is not None:
                names[f"attn{layer}"] = f"blocks.{layer}.ln1_post.hook_in"
            if self.has_mlp:
                post = self.post_mlp[layer] is not None
                names[f"mlp{layer}"] = f"blocks.{layer}.ln2_post.hook_in" if post else f"blocks.{layer}.hook_mlp_out"
        return names

    def w_o(self, layer: int) -> torch.Tensor:
        """``(H, d_head, D)``: the output projection of ``layer`` per query head (``z_h @ W_O[h]``)."""
        if hasattr(self.model, "bridge"):
            return self.model.bridge.blocks[layer].attn.W_O.detach()  # (H, d_head, D)
        cfg = self.model.cfg
        w = self.model.transformer.h[layer].attn.c_proj.weight  # (D, H*d_head): nn.Linear is (out, in)
        return w.detach().T.reshape(cfg.n_heads, cfg.d_head, -1)  # (H, d_head, D)

    def head(self, layer: int, head: int, dz: torch.Tensor, attn: torch.Tensor | None = None,
             w_o: torch.Tensor | None = None) -> torch.Tensor:
        """``(B, T, D)``: the change of what ``layer`` adds to the stream when head ``head``'s ``z`` moves by ``dz``.

        Args:
            dz: ``(B, T, d_head)`` the head's new ``z`` minus its clean one.
            attn: ``(B, T, D)`` the clean post-attention norm input ``O`` (every head, with ``b_O``); needed
                only where the layer has a post-attention norm (key ``attn{l}`` of :meth:`activations`).
            w_o: ``(H, d_head, D)`` this layer's :meth:`w_o`, when the caller keeps it.
        """
        w = (self.w_o(layer) if w_o is None else w_o)[head].to(dz)  # (d_head, D)
        o = dz @ w  # (B, T, D): the head's change before any norm
        norm = self.post_attn[layer]
        if norm is None:
            return o
        return _through(norm, attn.to(o), o)

    def mlp(self, layer: int, new: torch.Tensor, clean: torch.Tensor) -> torch.Tensor:
        """``(B, T, D)``: the change of the MLP's write when its activation (:meth:`activations`' ``mlp{l}``)
        goes from ``clean`` to ``new``."""
        norm = self.post_mlp[layer]
        return new - clean if norm is None else _through(norm, clean, new - clean)


def _through(norm: torch.nn.Module, x: torch.Tensor, dx: torch.Tensor) -> torch.Tensor:
    """``norm(x + dx) - norm(x)``, the family's own module run on both (``x``, ``dx`` ``(..., D)``)."""
    return norm(x + dx) - norm(x)


def write_path(model: Any) -> WritePath:
    """The :class:`WritePath` of a native GPT or a bridged model, its post-sublayer norms found by name.

    >>> import headlens
    >>> write_path(headlens.load("induction-2l")).linear
    True
    """
    n_layers = model.cfg.n_layers
    has_mlp = not getattr(model.cfg, "attn_only", False)
    if not hasattr(model, "bridge"):
        return WritePath(model, (None,) * n_layers, (None,) * n_layers, has_mlp)
    blocks = model.bridge.blocks
    post_attn = tuple(_hf_norm(getattr(blocks[layer], "ln1_post", None)) for layer in range(n_layers))
    post_mlp = tuple(_hf_norm(getattr(blocks[layer], "ln2_post", None)) for layer in range(n_layers))
    return WritePath(model, post_attn, post_mlp, has_mlp)
