"""A tiny model whose heads each do a different job, and a way to save it with a lying config.

Used by the doctor's tests and ``analyses/wrong_n_heads.py`` when no zoo model is installed.

Task ("shifted copy"): after 4 random letters, each next letter is one of the 4 previous letters
shifted by a per-offset amount (offset 1: +0, offset 2: +5, offset 3: +9, offset 4: +13, mod 16).
The best 1-layer attention-only model dedicates one head per offset (attend there, apply the
shift), so its weights are right only when split into the 4 heads they were trained with:
merging two heads mixes their shifts, splitting one breaks its query-key match.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F

from headlens.models.checkpoint import save_checkpoint
from headlens.models.config import ModelConfig
from headlens.models.gpt import GPT
from headlens.models.tokenizer import Tokenizer

ALPHABET = "abcdefghijklmnop"
SHIFTS = (0, 5, 9, 13)
TRUE_N_HEADS = 4


def shifted_copy_batch(gen: torch.Generator, n: int, T: int = 32) -> torch.Tensor:
    """``(n, T + 1)`` rows of the shifted-copy task, BOS first."""
    V = len(ALPHABET)
    x = torch.randint(0, V, (n, T), generator=gen)  # (N, T)
    j = torch.randint(0, len(SHIFTS), (n, T), generator=gen)  # which offset each position copies
    for t in range(len(SHIFTS), T):
        src = x[torch.arange(n), t - 1 - j[:, t]]
        x[:, t] = (src + torch.tensor(SHIFTS)[j[:, t]]) % V
    return torch.cat([torch.full((n, 1), V), x], dim=1)  # (N, T + 1)


def shifted_copy_texts(n: int = 16, seed: int = 123) -> list[str]:
    """Held-out rows of the task as text, one string per row (for ``check_checkpoint(texts=...)``)."""
    gen = torch.Generator().manual_seed(seed)
    return ["".join(ALPHABET[i] for i in row[1:]) for row in shifted_copy_batch(gen, n).tolist()]


def train_shifted_copy(steps: int = 300, seed: int = 0) -> GPT:
    """Train the 1-layer, 4-head, d_model=32 model (about 10 s on one CPU thread)."""
    tok = Tokenizer.char_level(ALPHABET)
    cfg = ModelConfig(n_layers=1, n_heads=TRUE_N_HEADS, d_model=32, n_ctx=40, d_vocab=tok.d_vocab,
                      attn_only=True)
    torch.manual_seed(seed)
    model = GPT(cfg, tok, name="shifted-copy")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x = shifted_copy_batch(gen, 32)
        loss = F.cross_entropy(model(x[:, :-1]).flatten(0, 1), x[:, 1:].flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval()


def save_with_claimed_heads(model: GPT, path: str | Path, n_heads: int, metadata: dict | None = None) -> Path:
    """Save ``model`` as a headlens checkpoint whose header *claims* ``n_heads`` (weights unchanged).

    This is the silent failure the doctor exists for: ``load_checkpoint`` trusts the header, so
    the checkpoint loads into a model split into the wrong number of heads and runs.
    """
    from safetensors import safe_open
    from safetensors.torch import save_file

    path = save_checkpoint(model, path, metadata=metadata)
    with safe_open(str(path), framework="pt") as f:
        header = dict(f.metadata())
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    cfg = json.loads(header["config"])
    cfg["n_heads"], cfg["d_head"] = n_heads, cfg["d_model"] // n_heads
    header["config"] = json.dumps(cfg)
    save_file(tensors, str(path), metadata=header)
    return path
