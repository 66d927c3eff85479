"""The OV circuit read through the unembedding: what a head writes into the logits when it attends to a token.

One primitive, shared by the vocabulary detectors (``ov_copying``, ``ov_suppression``, ``successor``) and
the docs' examples. For source tokens ``t`` and a head ``(l, h)``::

    e_t     = embed(t) + MLP0(norm(embed(t)))      # the token as the heads see it, block 0's attention left out
    logits  = e_t @ W_V' @ W_O' @ W_U'             # (n, d_vocab) for the n sources

Why it looks like this:

* **The effective embedding.** Heads never read the raw embedding: the first block's MLP acts as an
  extended embedding (McDougall et al. 2023, "copy suppression", who call ``W_E + MLP0(W_E)`` the
  effective embedding and leave block 0's attention out; Wang et al. 2022 read the residual stream after
  block 0 at the name's position in their IOI prompts, attention included). We follow McDougall: run the
  model's own block 0 with its attention output set to zero and positional embeddings left out, so each
  family's embedding scale (Gemma's ``sqrt(d_model)``), parallel blocks (GPT-J, GPT-NeoX) and MLP norms
  come out as the family computes them. An attention-only model has no MLP0: ``e_t`` is its embedding.
* **Norms, folded.** The head reads ``norm(e_t)``: its input norm's per-channel scale (and LayerNorm's
  centring) is folded into ``W_V'``. A Gemma-2/3 post-attention norm scales what the head writes before
  it reaches the residual: folded into ``W_O'``. The final norm's scale (and centring) is folded into
  ``W_U'`` (:func:`folded_unembed`). Each norm also divides a row by one positive number (its RMS or
  standard deviation); that scales the whole logits row of a source and changes no rank in it, so a
  head's output is read as if it alone were the residual, as Wang et al. and McDougall et al. do.
* **Biases are left out** (``b_V``, ``b_O``, the norms' offsets, ``b_U``): each adds the same vector to
  every source's row, whatever the head attends to; the readout is what depends on the token.
* **Grouped-query attention.** Query head ``h`` reads value head ``h // (n_heads // n_kv_heads)``
  (Hugging Face's ``repeat_kv`` order): its value vector is its group's, its ``W_O`` its own.
* **Factored, never ``V x V``.** A head's logits are rank ``d_head``; :mod:`headlens.readout.ranks`
  ranks tokens in them without forming the vocabulary-square matrix.

Needs a pre-norm model with an unembedding: native GPTs and bridged Hugging Face decoders (GPT-2, GPT-J,
GPT-NeoX, OPT, Llama, Mistral, Qwen2, Gemma 1-3, Phi-3 ...). Masked-LM encoders (BERT) put a nonlinear
transform between the residual and the unembedding and norm after every sublayer: :func:`unsupported` says so.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

from headlens.errors import DetectorError
from headlens.readout.norms import centres, norm_scale


@dataclass(frozen=True)
class OVReadout:
    """Every head's OV circuit through the unembedding, factored and folded (float32, on the CPU).

    Attributes:
        w_v: ``(L, H_kv, D, d_head)`` per key/value head: ``W_V`` with the input norm's scale (and
            LayerNorm's centring) folded in.
        w_o: ``(L, H, d_head, D)`` per query head: ``W_O``, a post-attention norm's scale folded in.
        unembed: ``(D, V)``: ``W_U`` with the final norm's scale (and centring) folded in.
        kv: ``(H,)`` long: the key/value head each query head reads (``h // (H // H_kv)``).
    """

    w_v: torch.Tensor
    w_o: torch.Tensor
    unembed: torch.Tensor
    kv: torch.Tensor

    @property
    def shape(self) -> tuple[int, int]:
        """``(n_layers, n_heads)``."""
        return self.w_o.shape[0], self.w_o.shape[1]

    def values(self, e: torch.Tensor, layer: int) -> torch.Tensor:
        """``(H, n, d_head)``: each query head's value vector for the sources ``e`` ``(n, D)``."""
        return (e @ self.w_v[layer])[self.kv]  # (H_kv, n, dh) -> (H, n, dh): query head h reads group kv[h]

    def writes(self, e: torch.Tensor, layer: int) -> torch.Tensor:
        """``(H, n, D)``: what each head of ``layer`` writes when it attends to each source."""
        return self.values(e, layer) @ self.w_o[layer]

    def logits(self, e: torch.Tensor, layer: int, head: int) -> torch.Tensor:
        """``(n, V)``: what head ``(layer, head)`` writes into the logits for the sources ``e`` ``(n, D)``."""
        return (e @ self.w_v[layer, int(self.kv[head])]) @ self.w_o[layer, head] @ self.unembed  # (n, V)


def unsupported(model: Any) -> str | None:
    """Why the OV readout cannot be read off ``model`` (one line), or None when it can."""
    name = getattr(model, "name", "the model")
    if packed := getattr(model, "packed_weights", None):  # headlens.models.hf.external
        return (f"the OV readout reads weight matrices, and {name!r} stores them packed ({packed}); "
                f"load the unquantized model for it")
    if hasattr(model, "transformer") and hasattr(model, "lm_head"):
        return None
    bridge = getattr(model, "bridge", None)
    if bridge is None or getattr(model, "output_kind", "logits") != "logits":
        return (f"{name!r} exposes no embedding and unembedding to read a head's OV circuit through "
                f"(a checkpoint without an LM head)")
    if getattr(bridge, "mlm_head", None) is not None:
        return (f"{name!r} is a masked-LM encoder: a nonlinear transform sits between its residual and its "
                f"unembedding, and it norms after every sublayer, so a head's OV has no readout through W_U")
    try:
        bridge.blocks[0].attn.W_V, bridge.blocks[0].attn.W_O  # raises for layers the bridge cannot split
    except Exception as err:
        return f"the bridge cannot split {name!r} into per-head W_V/W_O ({type(err).__name__})"
    return None


def raw_weights(model: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(W_E (V, D), W_V (L, H_kv, D, dh), W_O (L, H, dh, D), W_U (D, V))`` as stored, norms not folded."""
    why = unsupported(model)
    if why is not None:
        raise DetectorError(why)
    if hasattr(model, "transformer"):  # native GPT
        L, H, D, dh = model.cfg.n_layers, model.cfg.n_heads, model.cfg.d_model, model.cfg.d_head
        A = H * dh  # the heads' width: d_model unless d_head was set freely (tracr)
        blocks = model.transformer.h
        w_v = torch.stack([b.attn.c_attn.weight[2 * A:] for b in blocks])  # (L, H*dh, D): v = x W^T
        w_v = w_v.view(L, H, dh, D).transpose(-1, -2)  # (L, H, D, dh): per-head V, x @ W_V
        w_o = torch.stack([b.attn.c_proj.weight for b in blocks])  # (L, D, H*dh): out = z W^T
        w_o = w_o.view(L, D, H, dh).permute(0, 2, 3, 1)  # (L, H, dh, D): per-head O, z_h @ W_O
        return model.transformer.wte.weight, w_v, w_o, model.lm_head.weight.T
    b = model.bridge
    return b.W_E, b.W_V, b.W_O, b.W_U  # TransformerLens layout: (V, D), (L, H_kv, D, dh), (L, H, dh, D), (D, V)


def _norms(model: Any) -> tuple[list[Any], list[Any], Any]:
    """Each layer's attention input norm, each layer's post-attention norm (None: none), the final norm."""
    if hasattr(model, "transformer"):
        blocks = model.transformer.h
        return [b.ln_1 for b in blocks], [None] * len(blocks), model.transformer.ln_f
    blocks = model.bridge.blocks
    return ([getattr(b, "ln1", None) for b in blocks], [getattr(b, "ln1_post", None) for b in blocks],
            getattr(model.bridge, "ln_final", None))


def _scales(norms: list[Any], D: int) -> torch.Tensor | None:
    """``(len(norms), D)`` float32: each norm's per-channel scale (ones for a norm without one), or None if none has."""
    gs = [norm_scale(n) for n in norms]
    if all(g is None for g in gs):
        return None
    return torch.stack([torch.ones(D, dtype=torch.float64) if g is None else g for g in gs]).float()


def _fold_rows(w: torch.Tensor, g: torch.Tensor | None, centre: bool) -> torch.Tensor:
    """``diag(g) w`` (and ``C diag(g) w`` under LayerNorm) for weights ``w`` ``(..., D, X)``; ``g`` ``(..., D)``."""
    if g is not None:
        w = w * g[..., :, None]
    return w - w.mean(-2, keepdim=True) if centre else w  # C w, C = I - 11^T / D


def folded_unembed(model: Any, columns: slice | None = None) -> torch.Tensor:
    """``(D, V)`` float32: ``W_U`` with the final norm's per-channel scale (and LayerNorm's centring) folded in.

    ``resid @ folded_unembed(model)`` is the logits up to each row's norm factor ``1 / s(resid)`` and the
    biases; direct logit attribution multiplies by that factor, frozen from the clean run. ``columns``: those
    tokens only, ``(D, len)`` (the same values as the whole matrix's columns: every step is per column).
    """
    why = unsupported(model)
    if why is not None:
        raise DetectorError(why)
    w_u = model.lm_head.weight.T if hasattr(model, "transformer") else model.bridge.W_U  # (D, V)
    w_u = w_u if columns is None else w_u[:, columns]  # (D, len)
    g = norm_scale(_norms(model)[2])
    return _fold_rows(w_u.detach().float().cpu(), None if g is None else g.float(), centres(model)).contiguous()


def readout(model: Any) -> OVReadout:
    """Every head's folded OV and the folded unembedding of ``model`` (module docstring), on the CPU, float32.

    Kept per model object while its weights are unchanged (:func:`memo`; :func:`forget` drops it): the
    vocabulary detectors of one run share it.
    """
    return memo(model, "readout", (), lambda: _readout(model))


def _readout(model: Any) -> OVReadout:
    _, w_v, w_o, _ = raw_weights(model)
    w_v, w_o = w_v.detach().float().cpu(), w_o.detach().float().cpu()
    H = w_o.shape[1]
    n_kv = w_v.shape[1]
    if n_kv < 1 or H % n_kv:
        raise DetectorError(f"{H} query heads cannot share {n_kv} value heads evenly")
    kv = torch.arange(H) // (H // n_kv)  # (H,): query head h reads kv head h // group (repeat_kv order)
    ln_in, ln_post, _ = _norms(model)
    centre, D = centres(model), w_o.shape[-1]
    g_in = _scales(ln_in, D)  # (L, D) or None
    w_v = _fold_rows(w_v, None if g_in is None else g_in[:, None], centre)  # (L, H_kv, D, dh)
    g_post = _scales(ln_post, D)  # (L, D): Gemma 2/3 norm each head's write again; None elsewhere
    if g_post is not None:
        w_o = w_o * g_post[:, None, None, :]  # (L, H, dh, D)
        if centre:
            w_o = w_o - w_o.mean(-1, keepdim=True)  # a post-attention LayerNorm centres the head's write
    return OVReadout(w_v.contiguous(), w_o.contiguous(), folded_unembed(model), kv)


T = TypeVar("T")
_MEMO: weakref.WeakKeyDictionary[Any, dict[str, tuple[tuple[Any, ...], Any]]] = weakref.WeakKeyDictionary()


def memo(model: Any, name: str, key: tuple[Any, ...], build: Callable[[], T]) -> T:
    """``build()``, or its last result for ``model`` and ``key`` while the model's weights are unchanged.

    "Unchanged" means the same parameter tensors with no in-place edit since (their version counters):
    ``ov_copying`` and ``ov_suppression`` read one ranking, every vocabulary detector one readout. An object
    that takes no weak reference is not cached.
    """
    full = (*key, tuple((p.data_ptr(), p._version) for p in model.parameters()))
    try:
        store = _MEMO.setdefault(model, {})
    except TypeError:
        return build()
    if name in store and store[name][0] == full:
        return store[name][1]
    out = build()
    store[name] = (full, out)
    return out


def forget(model: Any) -> None:
    """Drop what :func:`memo` keeps for ``model`` (``classify`` does once its weight detectors ran)."""
    with contextlib.suppress(TypeError):
        _MEMO.pop(model, None)


class _Stop(Exception):
    """Raised from a hook once block 0's output is known: the rest of the forward is not needed."""


def effective_embedding(model: Any, tokens: torch.Tensor) -> torch.Tensor:
    """``(n, D)`` float32 on the CPU: ``embed(t) + MLP0(norm(embed(t)))`` for the token ids ``tokens`` ``(n,)``.

    Runs the model's own block 0 with its attention output set to zero and the positional embedding left
    out (module docstring); the tokens are fed as rows of at most ``n_ctx`` and the forward stops there.
    """
    tokens = torch.as_tensor(tokens, dtype=torch.long).reshape(-1)
    device = next(iter(model.parameters())).device
    zero = lambda x, hook: torch.zeros_like(x)  # noqa: E731
    out: list[torch.Tensor] = []

    def grab(x: torch.Tensor, hook: Any) -> None:
        out.append(x.detach().float().cpu().reshape(-1, x.shape[-1]))  # (B*T, D)
        raise _Stop

    points = model.hook_dict  # a bridge rebuilds it on every access
    hooks = [(n, zero) for n in ("hook_pos_embed", "blocks.0.hook_attn_out") if n in points]
    hooks.append(("blocks.0.hook_resid_post", grab))
    step = max(1, int(model.cfg.n_ctx))
    with torch.inference_mode():
        for i in range(0, len(tokens), step):
            with contextlib.suppress(_Stop):
                model.run_with_hooks(tokens[i:i + step][None].to(device), fwd_hooks=hooks)
    if not out:
        return torch.zeros(0, int(model.cfg.d_model))
    return torch.cat(out)  # (n, D)


def head_logits(model: Any, layer: int, head: int, tokens: torch.Tensor) -> torch.Tensor:
    """``(n, V)``: what head ``(layer, head)`` writes into the logits when it attends to each of ``tokens``.

    >>> import headlens
    >>> model = headlens.load("smollm2")  # doctest: +SKIP
    >>> ids = model.to_tokens(" Monday", prepend_bos=False)[0]  # doctest: +SKIP
    >>> model.to_str_tokens(head_logits(model, 23, 2, ids)[0].topk(5).indices)  # doctest: +SKIP
    """
    return readout(model).logits(effective_embedding(model, tokens), layer, head)
