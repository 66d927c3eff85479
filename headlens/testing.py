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

import contextlib
import math
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

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


PatternFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (tokens (B,T), valid (B,T)) -> (B,Q,K)


class PatternModel:
    """A stand-in backend whose attention patterns are given functions of the tokens.

    It has the shared model surface a scan uses (``n_layers``, ``n_heads``, ``cfg``,
    ``is_causal``, ``tokenizer``, ``special_token_ids``, ``to_tokens``, ``hooks``,
    ``forward``) and emits ``patterns[layer][head](tokens, valid)`` at
    ``blocks.{layer}.attn.hook_pattern``: hand-built patterns with exactly known scores.

    >>> m = PatternModel([[offset_pattern(-1), uniform_pattern]], causal=True)
    >>> m.n_layers, m.n_heads
    (1, 2)
    """

    def __init__(self, patterns: list[list[PatternFn]], causal: bool = True, n_ctx: int = 64,
                 tokenizer: Tokenizer | None = None, name: str = "patterns") -> None:
        self.patterns, self.is_causal, self.name = patterns, causal, name
        self.tokenizer = tokenizer or Tokenizer.char_level(PLANTED_ALPHABET)
        self.cfg = ModelConfig(n_layers=len(patterns), n_heads=len(patterns[0]), d_model=len(patterns[0]) * 4,
                               n_ctx=n_ctx, d_vocab=self.tokenizer.d_vocab)
        self.n_layers, self.n_heads = self.cfg.n_layers, self.cfg.n_heads
        self.device = torch.device("cpu")
        self._hooks: list[tuple[str, Callable[..., Any]]] = []

    @property
    def bos_token_id(self) -> int:
        return self.tokenizer.bos_token_id

    @property
    def special_token_ids(self) -> set[int]:
        return {self.tokenizer.bos_token_id}

    def to_tokens(self, text: str | list[str], prepend_bos: bool = True) -> torch.Tensor:
        texts = [text] if isinstance(text, str) else text
        return torch.tensor([[self.bos_token_id] * prepend_bos + self.tokenizer.encode(t) for t in texts])

    def to_str_tokens(self, tokens: torch.Tensor) -> list[str]:
        return [self.tokenizer.str_token(int(i)) for i in tokens.reshape(-1)]

    @contextlib.contextmanager
    def hooks(self, fwd_hooks: list[tuple[str, Callable[..., Any]]]) -> Iterator[PatternModel]:
        self._hooks = list(fwd_hooks)
        try:
            yield self
        finally:
            self._hooks = []

    def active_hooks(self) -> list[str]:
        return [name for name, _ in self._hooks]

    def forward(self, tokens: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        valid = torch.ones_like(tokens, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
        for layer, heads in enumerate(self.patterns):
            pattern = torch.stack([fn(tokens, valid) for fn in heads], dim=1)  # (B, H, Q, K)
            pattern = _renormalize(pattern, valid, self.is_causal)  # (B, H, Q, K)
            for name, fn in self._hooks:
                if name == f"blocks.{layer}.attn.hook_pattern":
                    fn(pattern, SimpleNamespace(name=name))
        return torch.zeros(*tokens.shape, self.cfg.d_vocab)


def _renormalize(pattern: torch.Tensor, valid: torch.Tensor, causal: bool) -> torch.Tensor:
    """Zero what a head cannot see (pads; the future in causal models); rows sum to 1."""
    T = pattern.shape[-1]
    seen = valid[:, None, None, :].expand_as(pattern).clone()  # (B, H, Q, K)
    if causal:
        seen &= torch.ones(T, T, dtype=torch.bool).tril()
    p = pattern * seen
    s = p.sum(-1, keepdim=True)
    fallback = seen / seen.sum(-1, keepdim=True).clamp_min(1)  # uniform where the fn gave nothing
    return torch.where(s > 0, p / s.clamp_min(1e-30), fallback)


def uniform_pattern(tokens: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Uniform over every visible key (the model renormalizes)."""
    B, T = tokens.shape
    return torch.ones(B, T, T)


def offset_pattern(k: int) -> PatternFn:
    """All mass on key q+k where it exists (k=-1 previous, 0 current, +1 next), else uniform."""

    def fn(tokens: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        B, T = tokens.shape
        return torch.diag(torch.ones(T - abs(k)), diagonal=k).expand(B, T, T)  # (B, Q, K): [q, q+k] = 1

    return fn
