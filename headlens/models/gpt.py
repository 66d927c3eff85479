"""The instrumented GPT: nanoGPT's model with TransformerLens hook points.

Parameter names follow Hugging Face GPT-2 (``transformer.h.0.attn.c_attn.weight`` ...)
so weights map 1:1 (HF stores Conv1D weights as ``(in, out)``; ours are ``nn.Linear``
``(out, in)``, transposed on export). Hook names follow TransformerLens
(``blocks.0.attn.hook_pattern``).

Attention has two paths with the same output: the fused
``scaled_dot_product_attention`` kernel when no hook needs the scores or pattern, and
the explicit ``softmax(q k^T / sqrt(d_head))`` path when one does. No ``(n_ctx, n_ctx)``
buffer is kept (the causal mask is built per call), so a long context costs memory only when
a pattern is asked for; the LSE scan (``headlens.scoring.lse``) reads ``hook_q``/``hook_k`` instead.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import nn

from headlens.errors import ProbeError
from headlens.models.attention import AttentionSpec
from headlens.models.config import ModelConfig
from headlens.models.hooks import HookedRootModule, HookPoint
from headlens.models.tokenizer import Tokenizer


def gelu_new(x: torch.Tensor) -> torch.Tensor:
    """GPT-2's tanh approximation of GELU."""
    return F.gelu(x, approximate="tanh")


class MultiHeadAttention(nn.Module):
    """Multi-head self-attention (causal unless ``cfg.causal`` is False) with a hook at every per-head quantity.

    The heads side by side are ``d_attn = n_heads * d_head`` wide: ``d_model`` by default, free when
    ``d_head`` is set (compiled tracr models).
    """

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.n_heads, self.d_head, self.d_model, self.n_ctx = cfg.n_heads, cfg.d_head, cfg.d_model, cfg.n_ctx
        self.d_attn, self.causal = cfg.d_attn, cfg.causal
        self.key_mask: torch.Tensor | None = None  # (B, T) bool, bidirectional only: False keys (padding) are hidden
        self.c_attn = nn.Linear(cfg.d_model, 3 * cfg.d_attn)  # fused q, k, v projections
        self.c_proj = nn.Linear(cfg.d_attn, cfg.d_model)  # merge heads back into the residual
        self.hook_q = HookPoint()  # (B, T, H, d_head)
        self.hook_k = HookPoint()  # (B, T, H, d_head)
        self.hook_v = HookPoint()  # (B, T, H, d_head)
        self.hook_attn_scores = HookPoint()  # (B, H, Q, K), masked entries -inf
        self.hook_pattern = HookPoint()  # (B, H, Q, K), rows sum to 1
        self.hook_z = HookPoint()  # (B, T, H, d_head), per-head output before c_proj

    @property
    def mask(self) -> torch.Tensor:
        """``(n_ctx, n_ctx)`` bool mask of the keys each query sees, built on demand (no stored buffer: it is O(n_ctx^2))."""
        i = torch.arange(self.n_ctx, device=self.c_attn.weight.device)
        return i[None, :] <= i[:, None] if self.causal else torch.ones(self.n_ctx, self.n_ctx, dtype=torch.bool, device=i.device)

    @property
    def needs_pattern(self) -> bool:
        return self.hook_attn_scores.has_hooks or self.hook_pattern.has_hooks

    def split_heads(self, x: torch.Tensor, hook: HookPoint) -> torch.Tensor:
        B, T, _ = x.shape
        x = x.view(B, T, self.n_heads, self.d_head)  # (B, T, H, d_head): axis 2 is the head
        x = hook(x)
        return x.transpose(1, 2)  # (B, H, T, d_head): each head attends on its own

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape  # batch, positions (d_model last)
        q, k, v = self.c_attn(x).split(self.d_attn, dim=2)  # 3 x (B, T, H*d_head)
        q = self.split_heads(q, self.hook_q)  # (B, H, T, d_head)
        k = self.split_heads(k, self.hook_k)  # (B, H, T, d_head)
        v = self.split_heads(v, self.hook_v)  # (B, H, T, d_head)
        if self.needs_pattern:
            scores = (q @ k.transpose(-2, -1)) / math.sqrt(self.d_head)  # (B, H, Q, K)
            if self.causal:
                future = torch.arange(T, device=x.device)[None, :] > torch.arange(T, device=x.device)[:, None]  # (Q, K)
                scores = scores.masked_fill(future, float("-inf"))
            if self.key_mask is not None:
                scores = scores.masked_fill(~self.key_mask[:, None, None, :], float("-inf"))  # (B, 1, 1, K)
            scores = self.hook_attn_scores(scores)
            pattern = self.hook_pattern(F.softmax(scores, dim=-1))  # (B, H, Q, K)
            z = pattern @ v  # (B, H, T, d_head)
        else:
            keys = None if self.key_mask is None else self.key_mask[:, None, None, :]  # (B, 1, 1, K)
            z = F.scaled_dot_product_attention(q, k, v, attn_mask=keys, is_causal=self.causal)  # (B, H, T, d_head)
        z = self.hook_z(z.transpose(1, 2))  # (B, T, H, d_head)
        return self.c_proj(z.reshape(B, T, self.d_attn))  # heads merged: (B, T, H*d_head) -> (B, T, D)


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.c_fc = nn.Linear(cfg.d_model, cfg.d_mlp)
        self.c_proj = nn.Linear(cfg.d_mlp, cfg.d_model)
        self.hook_post = HookPoint()  # (B, T, d_mlp)
        self.act = gelu_new if cfg.act_fn == "gelu_new" else F.relu

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(self.hook_post(self.act(self.c_fc(x))))


def _norm(cfg: ModelConfig) -> nn.Module:
    return nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps) if cfg.normalization == "LN" else nn.Identity()


class Block(nn.Module):
    """Pre-norm transformer block: resid += attn(ln_1(resid)); resid += mlp(ln_2(resid))."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.ln_1 = _norm(cfg)
        self.attn = MultiHeadAttention(cfg)
        self.hook_resid_pre = HookPoint()  # (B, T, D)
        self.hook_attn_out = HookPoint()  # (B, T, D)
        self.hook_resid_mid = HookPoint()  # (B, T, D)
        self.hook_resid_post = HookPoint()  # (B, T, D)
        self.attn_only = cfg.attn_only
        if not cfg.attn_only:
            self.ln_2 = _norm(cfg)
            self.mlp = MLP(cfg)
            self.hook_mlp_out = HookPoint()  # (B, T, D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.hook_resid_pre(x)
        x = self.hook_resid_mid(x + self.hook_attn_out(self.attn(self.ln_1(x))))
        if not self.attn_only:
            x = x + self.hook_mlp_out(self.mlp(self.ln_2(x)))
        return self.hook_resid_post(x)


class GPT(HookedRootModule):
    """A GPT-2-compatible transformer with TransformerLens hook points (causal unless ``cfg.causal`` is False).

    >>> cfg = ModelConfig(n_layers=1, n_heads=2, d_model=8, n_ctx=16, d_vocab=257)
    >>> model = GPT(cfg)
    >>> logits, cache = model.run_with_cache("hi", names_filter="blocks.0.attn.hook_pattern")
    >>> tuple(cache["blocks.0.attn.hook_pattern"].shape)  # (batch, head, query_pos, key_pos)
    (1, 2, 3, 3)
    """

    def __init__(self, cfg: ModelConfig, tokenizer: Tokenizer | None = None, name: str = "gpt") -> None:
        super().__init__()
        self.cfg = cfg
        self.name = name
        self.tokenizer = tokenizer or Tokenizer.byte_level()
        if self.tokenizer.d_vocab > cfg.d_vocab:
            raise ProbeError(
                f"tokenizer needs d_vocab >= {self.tokenizer.d_vocab}, config has d_vocab={cfg.d_vocab}"
            )
        self.transformer = nn.ModuleDict(
            {
                "wte": nn.Embedding(cfg.d_vocab, cfg.d_model),
                "wpe": nn.Embedding(cfg.n_ctx, cfg.d_model),
                "h": nn.ModuleList([Block(cfg) for _ in range(cfg.n_layers)]),
                "ln_f": _norm(cfg),
            }
        )
        self.transformer.hook_embed = HookPoint()  # (B, T, D)
        self.transformer.hook_pos_embed = HookPoint()  # (B, T, D)
        self.lm_head = nn.Linear(cfg.d_model, cfg.d_vocab, bias=False)
        self.apply(self._init_weights)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.transformer.wte.weight
        self.setup_hooks()

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, nn.Linear | nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=self.cfg.init_range)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    # -- the surface every backend shares -----------------------------------------------------
    @property
    def n_layers(self) -> int:
        return self.cfg.n_layers

    @property
    def n_heads(self) -> int:
        return self.cfg.n_heads

    @property
    def is_causal(self) -> bool:
        return self.cfg.causal

    @property
    def bos_token_id(self) -> int:
        return self.tokenizer.bos_token_id

    @property
    def special_token_ids(self) -> set[int]:
        return {self.tokenizer.bos_token_id}

    @property
    def device(self) -> torch.device:
        return self.transformer.wte.weight.device

    def attention_specs(self) -> list[AttentionSpec]:
        """Per layer: q and k hooks (``(B, T, H, d_head)``), scale ``1/sqrt(d_head)``, causal unless configured not."""
        return [AttentionSpec(f"blocks.{layer}.attn.hook_q", f"blocks.{layer}.attn.hook_k", "BTHD",
                              1.0 / math.sqrt(self.cfg.d_head), causal=self.cfg.causal)
                for layer in range(self.cfg.n_layers)]

    def to_tokens(self, text: str | list[str], prepend_bos: bool = True) -> torch.Tensor:
        """Tokenize one string (or several of equal token length) to ``(batch, pos)`` ids."""
        texts = [text] if isinstance(text, str) else list(text)
        rows = [([self.bos_token_id] if prepend_bos else []) + self.tokenizer.encode(t) for t in texts]
        if len({len(r) for r in rows}) > 1:
            raise ProbeError("to_tokens got texts of different token lengths; tokenize them one by one")
        if rows and len(rows[0]) > self.cfg.n_ctx:
            raise ProbeError(f"text is {len(rows[0])} tokens long; this model's context is n_ctx={self.cfg.n_ctx}")
        return torch.tensor(rows, dtype=torch.long, device=self.device)

    def to_str_tokens(self, tokens: str | torch.Tensor) -> list[str]:
        if isinstance(tokens, str):
            tokens = self.to_tokens(tokens)
        ids = tokens[0] if tokens.ndim == 2 else tokens
        return [self.tokenizer.str_token(int(i)) for i in ids]

    def forward(
        self, tokens: torch.Tensor | str | list[str], attention_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Logits ``(B, T, d_vocab)`` for token ids ``(B, T)`` (or text, tokenized with BOS).

        ``attention_mask`` ``(B, T)`` (1 real, 0 padding): a causal model ignores it (pad on the right, and
        causal attention keeps real positions from seeing pads); a bidirectional one (``cfg.causal=False``)
        hides the padded keys from every query.
        """
        if not isinstance(tokens, torch.Tensor):
            tokens = self.to_tokens(tokens)
        B, T = tokens.shape
        if T > self.cfg.n_ctx:
            raise ProbeError(f"input has {T} positions; this model's context is n_ctx={self.cfg.n_ctx}")
        pos = torch.arange(T, device=tokens.device)
        x = self.transformer.hook_embed(self.transformer.wte(tokens))  # (B, T, D)
        x = x + self.transformer.hook_pos_embed(self.transformer.wpe(pos).expand(B, T, -1))  # (B, T, D)
        with self.key_padding(attention_mask):
            for block in self.transformer.h:
                x = block(x)
        return self.lm_head(self.transformer.ln_f(x))  # (B, T, d_vocab)

    def padded(self, attention_mask: torch.Tensor | None) -> bool:
        """True when ``attention_mask`` hides keys from this model: bidirectional, with padding in the batch."""
        return not self.cfg.causal and attention_mask is not None and not bool(attention_mask.bool().all())

    @contextlib.contextmanager
    def key_padding(self, attention_mask: torch.Tensor | None) -> Iterator[None]:
        """Inside the block: the attention layers hide the keys where ``attention_mask`` ``(B, T)`` is 0 (a
        bidirectional model with padding; otherwise nothing changes). Code that runs the blocks itself
        (the ablation and circuit fast paths) takes unpadded batches or the plain forward."""
        keep = attention_mask.bool() if self.padded(attention_mask) else None
        for block in self.transformer.h:
            block.attn.key_mask = keep
        try:
            yield
        finally:
            for block in self.transformer.h:
                block.attn.key_mask = None
