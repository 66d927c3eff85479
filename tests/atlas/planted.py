"""A tiny attention-only GPT whose four heads' roles are known by construction (weights set by hand).

Residual stream: token one-hots ``[0, V)``, position one-hots ``[V, V + T)``, and a "previous token"
subspace ``[V + T, 2V + T)`` that L0H0 writes. Scores are ``q . k / sqrt(d_head)``; ``S`` makes a match
win by a wide margin.

* L0H0 previous token: position i's query matches position i - 1's key; it copies that token into the
  previous-token subspace.
* L0H1 no role: zero W_Q and W_K, so it attends uniformly to every earlier key (and writes nothing).
* L1H0 induction: the query is the current token, the key the previous-token subspace (a key whose
  predecessor is the current token); a weaker score on the first token is where it rests when nothing
  matches. It writes the token it attends to into the token subspace, which the unembedding reads.
* L1H1 resting: every query matches position 0's key only.
* L1H2 (``planted_gpt(mixture=True)`` only) a mixture: the previous token and the first token score alike, so
  it puts half its attention on each; it writes the token it attends to, like L1H0, louder.
* ``planted_gpt(splits=(p, ...))`` adds one head per share after those: induction that keeps part of each
  row on the first token, ``p`` on the induction target and ``1 - p`` on the first token where a repeat gives
  one target (the first token's score set ``log((1 - p) / p)`` above a match's), the first token alone
  elsewhere; it writes the token it attends to, like L1H0. On :func:`rare_repeat_windows` it is SmolLM2's
  L17H4 on prose in small: induction on the few rows with a repeat, resting on all the others.
* ``planted_gpt(banded=True)`` adds one more head last: previous token beside the first token, whose share of
  the row is set by the query's position: :data:`BANDED` (position, share) steps, the first token's score
  set ``log(share / (1 - share))`` above the previous token's. It writes the token it attends to, like L1H2.
* ``planted_gpt(keyed=True)`` adds one more head last: every key so far weighed by its token alone
  (:data:`KEYED`: a key holding "a" scores 2 above the others, so weighs e^2), what a description's key
  weights (:mod:`headlens.atlas.keypref`) state. It writes the token it attends to, like L1H2.
* ``planted_gpt(queried=True)`` adds one more head last: previous token beside the first token, whose share of
  the row is set by the query's token: :data:`QUERIED` (letter -> share; every other query token
  :data:`QUERIED_ELSE`), the first token's score set ``log(share / (1 - share))`` above the previous token's,
  what a description's query factors (:mod:`headlens.atlas.querysink`) state. It writes the token it attends
  to, like L1H2.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from headlens.models.config import ModelConfig
from headlens.models.gpt import GPT
from headlens.models.tokenizer import Tokenizer

ALPHABET = "abcdefghijkl"
N_CTX = 32
D_HEAD = 32
S = 12.0  # query and key scale: a match scores S * S / sqrt(d_head), about 25
MIXTURE_WRITE = 4.0  # L1H2's write scale: enough that removing it moves the loss
REST = 7.0  # the induction head's score scale on the first token: about 9, well under a match
BANDED = ((0, 0.9), (8, 0.2))  # the banded head's share on the first token from each position on
KEYED = {"a": 2.0, "b": 1.0, "c": -2.0}  # the keyed head's score for a key holding each letter (others 0)
QUERIED = {"a": 0.9, "b": 0.7, "c": 0.1}  # the queried head's share on the first token after each query letter
QUERIED_ELSE = 0.4  # ... and after every other query token


def planted_gpt(mixture: bool = False, splits: tuple[float, ...] = (), banded: bool = False,
                keyed: bool = False, queried: bool = False) -> GPT:
    tok = Tokenizer.char_level(ALPHABET)
    V, T = tok.d_vocab, N_CTX  # V includes BOS (the last id)
    D = 2 * V + T
    cfg = ModelConfig(n_layers=2, n_heads=2 + mixture + len(splits) + banded + keyed + queried, d_model=D, n_ctx=T, d_vocab=V, d_head=D_HEAD, attn_only=True,
                      normalization="none", positional_embedding="learned")
    model = GPT(cfg, tokenizer=tok)
    prev = V + T  # start of the previous-token subspace
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        model.transformer.wte.weight[:, :V] = torch.eye(V)
        model.transformer.wpe.weight[:, V:V + T] = torch.eye(T)
        model.lm_head.weight[:, :V] = torch.eye(V)  # logits read the token subspace
        q0, k0, v0 = (_block(model, 0, part) for part in range(3))
        q1, k1, v1 = (_block(model, 1, part) for part in range(3))
        o0, o1 = _out(model, 0), _out(model, 1)
        for i in range(T):  # L0H0: query at position i, key at position i - 1
            q0[0][V + i, i] = S
            if i + 1 < T:
                k0[0][V + i, i + 1] = S
        for t in range(V):  # L0H0 copies the attended token into the previous-token subspace
            v0[0][t, t] = 1.0
            o0[0][t, prev + t] = 1.0
        for t in range(V - 1):  # L1H0: current token vs the previous token of the key; rest on position 0
            q1[0][t, t] = S
            k1[0][prev + t, t] = S
            q1[0][t, D_HEAD - 1] = REST
            v1[0][t, t] = 1.0
            o1[0][t, t] = 1.0
        k1[0][V + 0, D_HEAD - 1] = REST
        for i in range(T):  # L1H1: every query to position 0
            q1[1][V + i, 0] = S
        k1[1][V + 0, 0] = S
        if mixture:  # L1H2: query i matches key i - 1 (dimension i - 1) and the first token (dimension T - 1)
            q2, k2 = _block(model, 1, 0)[2], _block(model, 1, 1)[2]
            v2, o2 = _block(model, 1, 2)[2], _out(model, 1)[2]
            for i in range(1, T):
                q2[V + i, i - 1] = S
                q2[V + i, T - 1] = S
                k2[V + i - 1, i - 1] = S
            k2[V + 0, T - 1] = S
            for t in range(V):
                v2[t, t] = 1.0
                o2[t, t] = MIXTURE_WRITE
        for h, p in enumerate(splits, 2 + mixture):  # induction with a share p, the first token the rest
            q, k, v, o = _block(model, 1, 0)[h], _block(model, 1, 1)[h], _block(model, 1, 2)[h], _out(model, 1)[h]
            rest = (S * S / D_HEAD ** 0.5 + math.log((1 - p) / p)) * D_HEAD ** 0.5  # q . k of the first token
            for t in range(V - 1):
                q[t, t] = S
                k[prev + t, t] = S
                q[t, D_HEAD - 1] = rest ** 0.5
                v[t, t] = 1.0
                o[t, t] = 1.0
            k[V + 0, D_HEAD - 1] = rest ** 0.5
        if banded:  # previous token, and the first token with a share set by the query's position
            h = 2 + mixture + len(splits)
            q, k, v, o = _block(model, 1, 0)[h], _block(model, 1, 1)[h], _block(model, 1, 2)[h], _out(model, 1)[h]
            for i in range(1, T):
                share = [p for start, p in BANDED if i >= start][-1]
                q[V + i, i - 1] = S
                k[V + i - 1, i - 1] = S
                q[V + i, T - 1] = S + math.log(share / (1 - share)) * D_HEAD ** 0.5 / S  # first token vs previous
            k[V + 0, T - 1] = S
            for t in range(V):
                v[t, t] = 1.0
                o[t, t] = MIXTURE_WRITE
        if keyed:  # every key so far, weighed by its token: e^KEYED[t] for a key holding letter t, 1 for the others
            h = 2 + mixture + len(splits) + banded
            q, k, v, o = _block(model, 1, 0)[h], _block(model, 1, 1)[h], _block(model, 1, 2)[h], _out(model, 1)[h]
            for i in range(T):
                q[V + i, 0] = S
            for t, score in KEYED.items():
                k[ALPHABET.index(t), 0] = score * D_HEAD ** 0.5 / S
            for t in range(V):
                v[t, t] = 1.0
                o[t, t] = MIXTURE_WRITE
        if queried:  # previous token, and the first token with a share set by the query's token
            h = 2 + mixture + len(splits) + banded + keyed
            q, k, v, o = _block(model, 1, 0)[h], _block(model, 1, 1)[h], _block(model, 1, 2)[h], _out(model, 1)[h]
            logit = lambda p: math.log(p / (1 - p)) * D_HEAD ** 0.5 / S  # noqa: E731  (a score gap, as a q entry)
            for i in range(1, T):
                q[V + i, i - 1] = S
                k[V + i - 1, i - 1] = S
                q[V + i, T - 1] = S + logit(QUERIED_ELSE)  # first token vs previous, for any query token
            for t, share in QUERIED.items():  # ... moved by the query's own letter
                q[ALPHABET.index(t), T - 1] = logit(share) - logit(QUERIED_ELSE)
            k[V + 0, T - 1] = S
            for t in range(V):
                v[t, t] = 1.0
                o[t, t] = MIXTURE_WRITE
    return model.eval()


def _block(model: GPT, layer: int, part: int) -> list[torch.Tensor]:
    """Per head, ``(D, d_head)`` views of W_Q (part 0), W_K (1) or W_V (2) inside ``c_attn`` ((out, in) layout)."""
    w = model.transformer.h[layer].attn.c_attn.weight  # (3 * H * d_head, D)
    H = model.cfg.n_heads
    base = part * H * D_HEAD
    return [w[base + h * D_HEAD: base + (h + 1) * D_HEAD].T for h in range(H)]  # each (D, d_head), a view


def _out(model: GPT, layer: int) -> list[torch.Tensor]:
    """Per head, the ``(d_head, D)`` view of W_O inside ``c_proj`` ((out, in) layout)."""
    w = model.transformer.h[layer].attn.c_proj.weight  # (D, H * d_head)
    return [w[:, h * D_HEAD:(h + 1) * D_HEAD].T for h in range(model.cfg.n_heads)]


def repeat_windows(model: GPT, n: int, seed: int = 0) -> list[torch.Tensor]:
    """``n`` windows of BOS + a few random letters + a random segment repeated to fill the context."""
    gen = torch.Generator().manual_seed(seed)
    letters = torch.arange(len(ALPHABET))
    bos = model.tokenizer.bos_token_id
    out = []
    for _ in range(n):
        period = int(torch.randint(4, 9, (1,), generator=gen))
        seg = letters[torch.randperm(len(letters), generator=gen)[:period]]
        body = torch.cat([letters[torch.randint(0, len(letters), (4,), generator=gen)], seg.repeat(8)])
        out.append(torch.cat([torch.tensor([bos]), body[: N_CTX - 1]]))
    return out


def rare_repeat_windows(model: GPT, n: int, every: int = 3, seed: int = 0) -> list[torch.Tensor]:
    """``n`` windows of BOS + the letters in a random order, each once; every ``every``-th (the last of each ``every``) then repeats its
    first 4 letters, so that a repeat (one earlier copy, induction's one target) is rare, as on prose."""
    gen = torch.Generator().manual_seed(seed)
    bos = model.tokenizer.bos_token_id
    out = []
    for i in range(n):
        seg = torch.randperm(len(ALPHABET), generator=gen)
        out.append(torch.cat([torch.tensor([bos]), seg, seg[:4] if i % every == every - 1 else seg[:0]]))
    return out


def planted_atlas(n_windows: int = 32, **planted: Any) -> tuple[GPT, list[torch.Tensor], Any]:
    """``(model, windows, atlas)``: :func:`planted_gpt` with ``planted``, its repeated windows and the atlas of them."""
    from headlens.atlas.build import build_atlas
    from headlens.atlas.exemplars import AtlasConfig

    model = planted_gpt(**planted)
    windows = repeat_windows(model, n_windows)
    return model, windows, build_atlas(model, AtlasConfig(k=3, batch_size=8), windows=windows)
