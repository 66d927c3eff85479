"""A gallery of attention modules written the way people write them: correct ones and broken ones.

Each broken class differs from a correct one by the one line people get wrong (marked ``# BUG``).
``GALLERY`` maps a name to ``(factory, expected bug name or None)``; every module takes
``(B, T, D)`` and is built for ``D_MODEL`` / ``N_HEADS``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import nn

D_MODEL, N_HEADS, N_CTX = 32, 4, 64


def _random_biases(m: nn.Module) -> nn.Module:
    torch.manual_seed(1)
    with torch.no_grad():
        for name, p in m.named_parameters():
            if "bias" in name:
                p.normal_(0, 0.1)
    return m


class NanoGPTAttention(nn.Module):
    """nanoGPT's CausalSelfAttention: fused c_attn, SDPA."""

    def __init__(self, n_embd: int = D_MODEL, n_head: int = N_HEADS) -> None:
        super().__init__()
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)
        self.n_head, self.n_embd = n_head, n_embd

    def heads(self, t: torch.Tensor) -> torch.Tensor:
        B, T, C = t.size()
        return t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, nh, T, hs)

    def merge(self, y: torch.Tensor, B: int, T: int, C: int) -> torch.Tensor:
        return y.transpose(1, 2).contiguous().view(B, T, C)  # (B, T, C)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        y = self.attend(self.heads(q), self.heads(k), self.heads(v))
        return self.c_proj(self.merge(y, B, T, C))


class ExplicitAttention(nn.Module):
    """The textbook version: separate q/k/v Linears, a registered tril mask, explicit softmax."""

    def __init__(self, d_model: int = D_MODEL, n_heads: int = N_HEADS) -> None:
        super().__init__()
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, d_model)
        self.v_proj = nn.Linear(d_model, d_model)
        self.out_proj = nn.Linear(d_model, d_model)
        self.n_heads, self.d_head = n_heads, d_model // n_heads
        self.register_buffer("bias", torch.tril(torch.ones(N_CTX, N_CTX)).view(1, 1, N_CTX, N_CTX))

    def split(self, t: torch.Tensor) -> torch.Tensor:
        B, T, _ = t.shape
        return t.view(B, T, self.n_heads, self.d_head).transpose(1, 2)  # (B, H, T, d_head)

    def scores(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(self.d_head))
        T = q.size(-2)
        return att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))

    def normalise(self, att: torch.Tensor) -> torch.Tensor:
        return F.softmax(att, dim=-1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.split(self.q_proj(x)), self.split(self.k_proj(x)), self.split(self.v_proj(x))
        y = self.normalise(self.scores(q, k)) @ v  # (B, H, T, d_head)
        return self.out_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class MHAWrapper(nn.Module):
    """A block that owns an ``nn.MultiheadAttention`` and builds its own causal mask."""

    def __init__(self, num_heads: int = N_HEADS) -> None:
        super().__init__()
        self.attn = nn.MultiheadAttention(D_MODEL, num_heads, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        T = x.shape[1]
        mask = nn.Transformer.generate_square_subsequent_mask(T, dtype=x.dtype)
        return self.attn(x, x, x, attn_mask=mask, need_weights=False)[0]


# --- the broken ones: one line each ---------------------------------------------------------------

class MissingTransposeSplit(NanoGPTAttention):
    def heads(self, t: torch.Tensor) -> torch.Tensor:
        B, T, C = t.size()
        return t.view(B, T, self.n_head, C // self.n_head)  # BUG: no .transpose(1, 2)


class HeadFirstView(ExplicitAttention):
    def split(self, t: torch.Tensor) -> torch.Tensor:
        B, T, _ = t.shape
        return t.view(B, self.n_heads, T, self.d_head)  # BUG: reshapes straight to (B, H, T, d_head)


class EinopsInterleaved(NanoGPTAttention):
    def heads(self, t: torch.Tensor) -> torch.Tensor:
        return rearrange(t, "b t (d h) -> b h t d", h=self.n_head)  # BUG: should be (h d)

    def merge(self, y: torch.Tensor, B: int, T: int, C: int) -> torch.Tensor:
        return rearrange(y, "b h t d -> b t (d h)")  # BUG, consistently


class MissingTransposeMerge(NanoGPTAttention):
    def merge(self, y: torch.Tensor, B: int, T: int, C: int) -> torch.Tensor:
        return y.contiguous().view(B, T, C)  # BUG: no .transpose(1, 2) first


class HardCodedHeadDim(ExplicitAttention):
    def __init__(self) -> None:
        super().__init__()
        self.d_head = 16  # BUG: "head_dim = 16" copied from another config
        self.n_heads = D_MODEL // self.d_head


class MaskWrongAxis(ExplicitAttention):
    def scores(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(self.d_head))
        T = q.size(-2)
        keep = torch.triu(torch.ones(T, T, dtype=torch.bool))  # BUG: triu keeps the future
        return att.masked_fill(~keep, float("-inf"))


class ScaleByDModel(ExplicitAttention):
    def scores(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        att = (q @ k.transpose(-2, -1)) / math.sqrt(D_MODEL)  # BUG: d_model, not d_head
        T = q.size(-2)
        return att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))


class SoftmaxWrongAxis(ExplicitAttention):
    def normalise(self, att: torch.Tensor) -> torch.Tensor:
        return F.softmax(att, dim=2)  # BUG: dim 2 of (B, H, Q, K) is the query axis


class ForgotMask(NanoGPTAttention):
    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v)  # BUG: is_causal=True forgotten


class TransposeAndScaleBugs(NanoGPTAttention):
    """Two bugs at once: the doctor should name both."""

    def merge(self, y: torch.Tensor, B: int, T: int, C: int) -> torch.Tensor:
        return y.contiguous().view(B, T, C)  # BUG 1

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=1 / math.sqrt(D_MODEL))  # BUG 2


CORRECT = {
    "nanogpt_fused": NanoGPTAttention,
    "explicit_separate": ExplicitAttention,
    "mha_batch_first": lambda: nn.MultiheadAttention(D_MODEL, N_HEADS, batch_first=True),
    "mha_seq_first": lambda: nn.MultiheadAttention(D_MODEL, N_HEADS, batch_first=False),
    "mha_wrapper": MHAWrapper,
}

BROKEN = {
    "missing_transpose_split": (MissingTransposeSplit, "missing_transpose_split"),
    "head_first_view": (HeadFirstView, "wrong_view_order"),
    "einops_interleaved": (EinopsInterleaved, "wrong_view_order"),
    "missing_transpose_merge": (MissingTransposeMerge, "missing_transpose_merge"),
    "hard_coded_head_dim": (HardCodedHeadDim, "wrong_head_count"),
    "mha_wrong_num_heads": (lambda: MHAWrapper(num_heads=2), "wrong_head_count"),
    "mask_wrong_axis": (MaskWrongAxis, "mask_wrong_axis"),
    "scale_by_d_model": (ScaleByDModel, "scale_by_d_model"),
    "softmax_wrong_axis": (SoftmaxWrongAxis, "softmax_wrong_axis"),
    "forgot_mask": (ForgotMask, "no_mask"),
    "two_bugs": (TransposeAndScaleBugs, "missing_transpose_merge+scale_by_d_model"),
}


def build(factory) -> nn.Module:
    torch.manual_seed(0)
    return _random_biases(factory()).eval()
