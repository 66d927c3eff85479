"""Hand-weighted tiny models with planted heads, for tests and examples.

``planted_model()`` builds a 2-layer, 4-head, attention-only GPT (no LayerNorm) over a
char-level alphabet whose weights are set by hand so that

* **L0H0 is a previous-token head**: its query is the one-hot position p, its key the
  one-hot position j+1, so it attends from p to p-1; its OV circuit copies the token it
  reads into a "previous token" subspace of the residual stream;
* **L1H0 is an induction head**: its query is the current token, its key the "previous
  token" subspace, so it attends from q to every k with x_{k-1} = x_q;
* every other head has zero weights, hence uniform attention (exactly the baseline).

The residual stream is ``[token one-hot | position one-hot | previous-token one-hot | 0...]``.
Nothing is trained, so the planted heads are exact and the model builds in milliseconds.

>>> model = planted_model()
>>> PLANTED_HEADS["induction"]
[(1, 0)]
"""

from __future__ import annotations

import math

import torch

from headlens.config import ModelConfig
from headlens.model import GPT
from headlens.tokenizer import Tokenizer

PLANTED_ALPHABET = "abcdefghijklmnop()[]"
PLANTED_HEADS: dict[str, list[tuple[int, int]]] = {"previous_token": [(0, 0)], "induction": [(1, 0)]}


def planted_model(sharpness: float = 30.0, n_ctx: int = 32, alphabet: str = PLANTED_ALPHABET) -> GPT:
    """A GPT whose L0H0 is a previous-token head and L1H0 an induction head (see module doc).

    Args:
        sharpness: attention logit of a target over a non-target (30 gives mass ~1 - 1e-12).
        n_ctx: context length; positions are one-hot, so ``d_head >= n_ctx``.
        alphabet: the char-level vocabulary (BOS is added after it).
    """
    tok = Tokenizer.char_level(alphabet)
    V = tok.d_vocab
    d_head = max(32, n_ctx, V)
    n_heads = 4
    cfg = ModelConfig(n_layers=2, n_heads=n_heads, d_model=n_heads * d_head, n_ctx=n_ctx, d_vocab=V,
                      attn_only=True, normalization="none")
    if 2 * V + n_ctx > cfg.d_model:
        raise ValueError("alphabet and context do not fit the residual stream")
    TOK, POS, PREV, D = 0, V, V + n_ctx, cfg.d_model
    model = GPT(cfg, tokenizer=tok, name="planted")
    c = sharpness * math.sqrt(d_head)  # logits are divided by sqrt(d_head)
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        model.transformer.wte.weight[:, TOK:TOK + V] = torch.eye(V)
        model.transformer.wpe.weight[:, POS:POS + n_ctx] = torch.eye(n_ctx)
        # L0H0 (head 0 occupies rows 0..d_head-1 of each of q, k, v): previous-token head
        qkv0 = model.transformer.h[0].attn.c_attn.weight  # (3D, D): q = x W[:D]^T ...
        for i in range(n_ctx):
            qkv0[i, POS + i] = c  # q: position p -> e_p
            if i + 1 < n_ctx:
                qkv0[D + i + 1, POS + i] = 1.0  # k: position j -> e_{j+1}
        for i in range(V):
            qkv0[2 * D + i, TOK + i] = 1.0  # v: the token at the attended position
            model.transformer.h[0].attn.c_proj.weight[PREV + i, i] = 1.0  # o: into PREV
        # L1H0: induction head, query = current token, key = previous token
        qkv1 = model.transformer.h[1].attn.c_attn.weight
        for i in range(V):
            qkv1[i, TOK + i] = c
            qkv1[D + i, PREV + i] = 1.0
    return model.eval()
