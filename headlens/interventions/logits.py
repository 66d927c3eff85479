"""Logits without the vocabulary blow-up: unembed only the positions a metric reads, reduce them in chunks.

Why it looks like this:

* **A modern vocabulary dwarfs everything else.** Gemma's 262,144 tokens make one position's float32 logits
  1 MiB: 32 prompts x 65 positions of logits are 2.2 GB, and ``log_softmax`` makes a second copy. A tiny
  Gemma 3 ablation sweep peaked at 8.8 GB against 0.7 GB for a classify (``benchmarks/vocab_logits.py``).
* **Unembed only the read positions.** :func:`logits_at` runs the model's own forward and narrows the final
  residual stream to the columns asked for at one hook (the native GPT's last ``hook_resid_post``, the
  bridge's ``unembed.hook_in``): the final norm is per position, so the logits there are the full forward's,
  and whatever the family does after the unembedding (a soft cap) still runs.
* **Reduce in chunks of positions.** :func:`position_chunks` cuts a ``(B, C, V)`` block so that each float32
  temporary stays under :data:`CHUNK_BYTES`; every row is reduced by the same kernel as unchunked, so the
  values are those of the plain expression (the tests write it out).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F

CHUNK_BYTES = 64 * 2**20  # float32 bytes of one (B, c, V) temporary in the chunked reductions
LOGITS_BUDGET = 128 * 2**20  # float32 bytes of the logits one forward may return (rows x read positions x V)


def position_chunks(n_rows: int, n_pos: int, d_vocab: int, parts: int = 1) -> Iterator[slice]:
    """Slices over positions whose ``(n_rows, c, d_vocab)`` float32 block fits ``CHUNK_BYTES / parts`` (at least
    one position)."""
    step = max(1, CHUNK_BYTES // parts // max(1, 4 * n_rows * d_vocab))
    for s in range(0, n_pos, step):
        yield slice(s, min(s + step, n_pos))


def target_log_probs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """``log softmax(logits)[..., target]`` ``(B, C)`` of logits ``(B, C, V)``, in chunks of positions.

    >>> target_log_probs(torch.zeros(1, 2, 4), torch.tensor([[0, 3]])).exp()
    tensor([[0.2500, 0.2500]])
    """
    B, C, V = logits.shape
    out = logits.new_empty(B, C, dtype=torch.float32)
    for s in position_chunks(B, C, V):
        logp = F.log_softmax(logits[:, s].float(), dim=-1)  # (B, c, V)
        out[:, s] = logp.gather(-1, targets[:, s, None]).squeeze(-1)  # (B, c)
    return out


def kl_divergence(logits: torch.Tensor, clean: torch.Tensor) -> torch.Tensor:
    """``KL(softmax(clean) || softmax(logits))`` ``(B, C)`` per position of two ``(B, C, V)`` blocks, chunked."""
    B, C, V = logits.shape
    out = logits.new_empty(B, C, dtype=torch.float32)
    for s in position_chunks(B, C, V, parts=3):  # three (B, c, V) temporaries live at once
        logp = F.log_softmax(logits[:, s].float(), dim=-1)  # (B, c, V)
        logq = F.log_softmax(clean[:, s].float(), dim=-1)  # (B, c, V)
        out[:, s] = (logq.exp() * (logq - logp)).sum(-1)  # (B, c)
    return out


def read_columns(read: torch.Tensor | None) -> torch.Tensor | None:
    """The positions any row of ``read`` ``(B, T)`` marks, ``(C,)``; None when that is every position (or no mask)."""
    if read is None:
        return None
    cols = read.any(0).nonzero().flatten()
    return None if len(cols) == read.shape[1] else cols


def logit_rows(model: Any, n_cols: int, parts: int = 1) -> int:
    """Prompts per forward whose logits at ``n_cols`` positions fit ``LOGITS_BUDGET / parts`` (at least one)."""
    return max(1, LOGITS_BUDGET // parts // max(1, 4 * n_cols * model.cfg.d_vocab))


def _narrowing_hook(model: Any) -> str | None:
    """The hook whose input, narrowed to some positions, gives the logits there (None: no such hook)."""
    from headlens.models.gpt import GPT

    if isinstance(model, GPT):
        return f"blocks.{model.cfg.n_layers - 1}.hook_resid_post"  # the last block's output feeds ln_f
    return "unembed.hook_in" if "unembed.hook_in" in getattr(model, "hook_dict", {}) else None


def logits_at(model: Any, tokens: torch.Tensor, cols: torch.Tensor | None,
              attention_mask: torch.Tensor | None = None) -> torch.Tensor:
    """The model's logits ``(B, C, V)`` at positions ``cols`` ``(C,)`` only (None: ``(B, T, V)``, every position).

    The forward runs as usual up to the final residual stream, which is then narrowed to ``cols``: the final
    norm and the unembedding see only those rows. Hooks the caller installed stay in force.
    """
    kwargs = {} if attention_mask is None else {"attention_mask": attention_mask}
    if cols is None:
        return model(tokens, **kwargs)
    name = _narrowing_hook(model)
    if name is None:  # a backend without the hook: the full forward, then the columns
        return model(tokens, **kwargs)[:, cols]

    def narrow(x: torch.Tensor, hook: Any) -> torch.Tensor:
        return x[:, cols]  # (B, T, D) -> (B, C, D)

    with model.hooks([(name, narrow)]):
        return model(tokens, **kwargs)  # (B, C, V)
