"""Composition scores (Elhage et al. 2021) with a calibrated null, for every head-to-head edge.

For sender head ``S`` with OV circuit ``A = W_V^S W_O^S`` (``d_model x d_model``, row-vector convention
``x @ A``) and a receiver input ``c`` of head ``R``, the score is ``|A B|_F / (|A|_F |B|_F)`` with

* ``q``: ``B = W_Q^R W_K^R^T`` (the sender writes what the receiver's *query* reads),
* ``k``: ``B = W_K^R W_Q^R^T`` (what its *key* reads),
* ``v``: ``B = W_V^R W_O^R`` (what its *value* reads).

Under grouped-query attention ``W_K``/``W_V`` are the receiver's key/value group's. Everything is
computed in factored form (``d_head x d_head`` Gram matrices), never as a ``d_model^2`` product.

**LayerNorm.** The receiver reads ``LN(resid)``, not ``resid``. LayerNorm subtracts each position's mean
over ``d_model`` and divides by its norm, then scales by ``gamma``. On native models the score folds
both linear parts: the sender's ``W_O`` is centred (``W_O (I - 11^T / d_model)``, what LayerNorm's
mean subtraction leaves of its write) and ``gamma`` multiplies the rows of the receiver's ``W_Q``,
``W_K`` and ``W_V``. The division by the norm is one positive number per position: it scales ``A B``
and cancels in no ratio, so the score ignores it (the exact edge effect does not). On Hugging Face
models the same is done from the bridge's weights: the attention norm's scale (read off the norm itself, so
Gemma's ``1 + weight`` counts as Gemma computes it) multiplies the receiver's rows, and under LayerNorm
(GPT-2, GPT-NeoX, Phi) the sender's write is centred; RMSNorm (Llama, Mistral, Qwen2, Gemma) has no centring.

**The null.** A raw score has no scale of its own: random matrices of these shapes already score
``~sqrt(d_head / d_model)``. The null keeps each matrix's spectrum and randomly rotates the residual
basis of the sender (``A -> Q A Q^T``, ``Q`` Haar-random): only ``W_O^S Q^T`` changes the score, and
``Q W_O^S^T`` is a random ``d_model x d_head`` frame times ``(W_O W_O^T)^{1/2}``. ``composition_z`` is the
score's distance from the null's mean in null standard deviations; :func:`random_baseline` gives the
mean score of Gaussian weights of the model's shape.

**Where it is only an approximation** (:func:`approximate`): a post-sublayer norm (Gemma 2/3, OLMo-2)
rescales the sender's write by the layer's whole output, and a q/k norm (Gemma 3, Qwen3, OLMo-2, Cohere,
StableLM) rescales the receiver's query and key: neither is bilinear in the weights, so the score ignores
them. The edge table says so (``attrs["composition_note"]``); the edge's ``effect`` is exact either way.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from headlens.circuits.nodes import Edge, Node, kv_head
from headlens.readout.norms import norm_scale

_N_NULL = 200


def head_weights(model: Any, layer: int) -> dict[str, torch.Tensor]:
    """``W_Q (H, D, d)``, ``W_K``/``W_V`` ``(H_kv, D, d)``, ``W_O (H, d, D)`` of ``layer``, float64, LN folded on native models."""
    if hasattr(model, "bridge"):
        from headlens.models.hf.external import require_readable_weights

        require_readable_weights(model, "composition scores")
        block = model.bridge.blocks[layer]
        w = {n: getattr(block.attn, n).detach().double().cpu() for n in ("W_Q", "W_K", "W_V", "W_O")}
        gamma = _norm_scale(block)
        if gamma is not None:  # the norm's scale multiplies what the receiver reads
            w.update({n: w[n] * gamma[None, :, None] for n in ("W_Q", "W_K", "W_V")})
        if getattr(model.bridge.cfg, "normalization_type", None) == "LN":  # LN removes the mean of every write
            w["W_O"] = w["W_O"] - w["W_O"].mean(-1, keepdim=True)
        return w
    block = model.transformer.h[layer]
    H, d, D = model.cfg.n_heads, model.cfg.d_head, model.cfg.d_model
    w = block.attn.c_attn.weight.detach().double().cpu().view(3, H, d, D).transpose(-1, -2)  # (qkv, H, D, d)
    gamma = getattr(block.ln_1, "weight", None)
    if gamma is not None:  # LN's scale multiplies what the receiver reads
        w = w * gamma.detach().double().cpu()[None, None, :, None]
    out = block.attn.c_proj.weight.detach().double().cpu().T.reshape(H, d, D)  # (H, d_head, D)
    if model.cfg.normalization == "LN":  # LN removes the mean of every write
        out = out - out.mean(-1, keepdim=True)
    return {"W_Q": w[0], "W_K": w[1], "W_V": w[2], "W_O": out}


def approximate(model: Any) -> str | None:
    """Why composition scores are only an approximation on ``model`` (one line), or None where they are exact
    up to the norm's scale (no post-sublayer norm, no q/k norm)."""
    from headlens.readout.write import write_path

    why = [] if write_path(model).linear else ["a norm after the sublayer rescales each write"]
    if hasattr(model, "bridge") and any(hasattr(b.attn, "q_norm") or hasattr(b.attn, "k_norm")
                                        for b in model.bridge.blocks):
        why.append("q/k norms rescale the query and key")
    if not why:
        return None
    return f"composition is an approximation here ({'; '.join(why)}): read the edges' effects, which are exact"


def _norm_scale(block: Any) -> torch.Tensor | None:
    """``(D,)`` the per-channel scale the block's attention norm applies after normalizing, or None
    (:func:`headlens.readout.norms.norm_scale`: every family's own convention, Gemma's ``1 + weight``)."""
    return norm_scale(getattr(block, "ln1", None))


def _receiver_factors(W: dict[str, torch.Tensor], model: Any, head: int, c: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``(P, R)`` with ``B = P R^T`` for input ``c`` of ``head``; both ``(D, d)``."""
    g = kv_head(model, head)
    if c == "q":
        return W["W_Q"][head], W["W_K"][g]
    if c == "k":
        return W["W_K"][g], W["W_Q"][head]
    return W["W_V"][g], W["W_O"][head].T


@functools.lru_cache(maxsize=1)
def _frames(D: int, d: int, n: int, seed: int) -> torch.Tensor:
    """``n`` Haar-random orthonormal ``D x d`` frames ``(n, D, d)``; the last ones kept (discovery's rounds and
    faithfulness each score edges: the QR of 200 frames is redrawn otherwise, identically)."""
    gen = torch.Generator().manual_seed(seed)
    g = torch.randn(n, D, d, generator=gen, dtype=torch.float64)
    q, r = torch.linalg.qr(g)
    return q * torch.sign(torch.diagonal(r, dim1=-2, dim2=-1))[:, None, :]  # sign fix: exactly Haar


def _sqrtm(m: torch.Tensor) -> torch.Tensor:
    e, v = torch.linalg.eigh(m)
    return (v * e.clamp_min(0).sqrt()) @ v.T


def scores(model: Any, edges: Sequence[Edge], n_null: int = _N_NULL, seed: int = 0) -> dict[Edge, tuple[float, float]]:
    """``edge -> (composition, composition_z)`` for head-to-head edges (others are left out); ``n_null=0``
    skips the null (z is NaN): the raw score alone is cheap."""
    weights: dict[int, dict[str, torch.Tensor]] = {}

    def W(layer: int) -> dict[str, torch.Tensor]:
        if layer not in weights:
            weights[layer] = head_weights(model, layer)
        return weights[layer]

    out: dict[Edge, tuple[float, float]] = {}
    frames: torch.Tensor | None = None
    done: dict[tuple, tuple[float, float]] = {}  # the score ignores positions: IOI's k/v edges at 5 of them share it
    roots: dict[Node, torch.Tensor] = {}  # per sender head: sqrt(W_O W_O^T) (d, d)
    framed: dict[tuple, torch.Tensor] = {}  # per receiver input: the frames seen through it, Q^T P (n, d, d)
    for e in edges:
        s, r = e.sender, e.receiver
        if s.kind != "head" or r.kind != "head":
            continue
        key = (s, r, e.input)
        if key in done:
            out[e] = done[key]
            continue
        Ws = W(s.layer)
        W_V, W_O = Ws["W_V"][kv_head(model, s.head)], Ws["W_O"][s.head]  # (D, d), (d, D)
        P, R = _receiver_factors(W(r.layer), model, r.head, e.input)  # (D, d) each
        G_V, G_R = W_V.T @ W_V, R.T @ R  # (d, d)
        norm_a = torch.trace(G_V @ (W_O @ W_O.T)).sqrt()
        norm_b = torch.trace((P.T @ P) @ G_R).sqrt()
        M = W_O @ P  # (d, d)
        score = float(torch.trace(M.T @ G_V @ M @ G_R).sqrt() / (norm_a * norm_b))
        if n_null <= 0:
            out[e] = done[key] = (score, float("nan"))
            continue
        if frames is None:
            frames = _frames(W_O.shape[1], W_O.shape[0], n_null, seed)  # (n, D, d)
        if s not in roots:
            roots[s] = _sqrtm(W_O @ W_O.T)  # (d, d), symmetric
        if (r, e.input) not in framed:
            framed[r, e.input] = frames.transpose(1, 2) @ P  # (n, d, d)
        # (Q S)^T P = S (Q^T P): the sender's rotated write directions Q S read through the receiver's P, with the
        # frames' large product made once per receiver input, not per sender (nor held per sender: 59 MB each)
        Mn = roots[s] @ framed[r, e.input]  # (n, d, d)
        null = torch.einsum("nij,ik,nkl,lj->n", Mn.transpose(1, 2), G_V, Mn, G_R).clamp_min(0).sqrt() / (norm_a * norm_b)
        z = (score - float(null.mean())) / max(float(null.std()), 1e-12)
        out[e] = done[key] = (score, z)
    return out


def reference_scores(model: Any, c: str, n_pairs: int = 256, seed: int = 0) -> np.ndarray:
    """Raw composition scores of ``n_pairs`` head pairs of this model (all pairs when there are fewer) for
    receiver input ``c``: what "strong" and "weak" composition mean for these weights, which a trained
    model pushes far above the rotation null almost everywhere."""
    L, H = model.cfg.n_layers, model.cfg.n_heads
    pairs = [(ls, hs, lr, hr) for lr in range(1, L) for hr in range(H) for ls in range(lr) for hs in range(H)]
    if len(pairs) > n_pairs:
        pairs = [pairs[i] for i in np.random.default_rng(seed).choice(len(pairs), n_pairs, replace=False)]
    edges = [Edge(Node("head", ls, hs), Node("head", lr, hr), c) for ls, hs, lr, hr in pairs]
    return np.array([v[0] for v in scores(model, edges, n_null=0).values()])


def random_baseline(model: Any, n: int = 20, seed: int = 0) -> float:
    """Mean composition score of Gaussian ``W_V, W_O, W_Q, W_K`` of this model's shape (no training)."""
    return _baseline(model.cfg.d_model, model.cfg.d_head, n, seed)


@functools.lru_cache(maxsize=8)
def _baseline(D: int, d: int, n: int, seed: int) -> float:
    """:func:`random_baseline` of a shape, drawn once per process (discovery's tables each ask for it)."""
    gen = torch.Generator().manual_seed(seed)
    vals = []
    for _ in range(n):
        W_V, W_O, P, R = (torch.randn(*s, generator=gen, dtype=torch.float64) for s in ((D, d), (d, D), (D, d), (D, d)))
        A, B = W_V @ W_O, P @ R.T  # (D, D) each: small enough for a baseline
        vals.append(float(torch.linalg.norm(A @ B) / (torch.linalg.norm(A) * torch.linalg.norm(B))))
    return float(np.mean(vals))
