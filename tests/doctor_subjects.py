"""A small trained model whose heads each do a different job, for the checkpoint doctor's tests.

Task: after 4 random letters, each next letter is one of the 4 previous letters shifted by a
per-offset amount (offset 1 +0, offset 2 +5, offset 3 +9, offset 4 +13, mod 16). The best
1-layer attention-only model dedicates one head per offset (attend there, apply the shift), so
the weights are only right when split into the 4 heads they were trained with: merging two
heads mixes their shifts, splitting one breaks its query-key match.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

import torch
import torch.nn.functional as F

from headlens.checkpoint import save_checkpoint
from headlens.config import ModelConfig
from headlens.model import GPT
from headlens.tokenizer import Tokenizer

ALPHABET = "abcdefghijklmnop"
SHIFTS = (0, 5, 9, 13)
TRUE_N_HEADS = 4


def shifted_copy_batch(gen: torch.Generator, n: int, T: int = 32) -> torch.Tensor:
    V = len(ALPHABET)
    x = torch.randint(0, V, (n, T), generator=gen)  # (N, T)
    j = torch.randint(0, len(SHIFTS), (n, T), generator=gen)  # which offset each position copies
    for t in range(len(SHIFTS), T):
        src = x[torch.arange(n), t - 1 - j[:, t]]
        x[:, t] = (src + torch.tensor(SHIFTS)[j[:, t]]) % V
    return torch.cat([torch.full((n, 1), V), x], dim=1)  # (N, T + 1), BOS first


@lru_cache(maxsize=1)
def _trained_state(steps: int = 300) -> dict[str, torch.Tensor]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        tok = Tokenizer.char_level(ALPHABET)
        cfg = ModelConfig(n_layers=1, n_heads=TRUE_N_HEADS, d_model=32, n_ctx=40, d_vocab=tok.d_vocab,
                          attn_only=True)
        torch.manual_seed(0)
        model = GPT(cfg, tok)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        gen = torch.Generator().manual_seed(0)
        for _ in range(steps):
            x = shifted_copy_batch(gen, 32)
            loss = F.cross_entropy(model(x[:, :-1]).flatten(0, 1), x[:, 1:].flatten())
            opt.zero_grad()
            loss.backward()
            opt.step()
        return {k: v.detach().clone() for k, v in model.state_dict().items()}
    finally:
        torch.set_num_threads(threads)


def trained_model() -> GPT:
    tok = Tokenizer.char_level(ALPHABET)
    cfg = ModelConfig(n_layers=1, n_heads=TRUE_N_HEADS, d_model=32, n_ctx=40, d_vocab=tok.d_vocab, attn_only=True)
    model = GPT(cfg, tok, name="shifted-copy")
    model.load_state_dict(_trained_state())
    return model.eval()


def evaluation_texts(n: int = 16, seed: int = 123) -> list[str]:
    """Held-out rows of the training task, as text (one string per row)."""
    gen = torch.Generator().manual_seed(seed)
    return ["".join(ALPHABET[i] for i in row[1:]) for row in shifted_copy_batch(gen, n).tolist()]


def write_lying_checkpoint(model: GPT, path: Path, claimed_n_heads: int) -> Path:
    """Save ``model`` with ``claimed_n_heads`` written into its header (the weights are unchanged)."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    save_checkpoint(model, path)
    with safe_open(str(path), framework="pt") as f:
        header = dict(f.metadata())
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    cfg = json.loads(header["config"])
    cfg["n_heads"], cfg["d_head"] = claimed_n_heads, cfg["d_model"] // claimed_n_heads
    header["config"] = json.dumps(cfg)
    save_file(tensors, str(path), metadata=header)
    return path


def write_hf_dir(model: GPT, out: Path, claimed_n_heads: int | None = None) -> Path:
    """A Hugging Face GPT-2 directory (config.json + model.safetensors), optionally with a lying n_head."""
    from safetensors.torch import save_file

    from headlens.export import hf_config, hf_state_dict

    out.mkdir(parents=True, exist_ok=True)
    cfg = hf_config(model)
    if claimed_n_heads is not None:
        cfg["n_head"] = claimed_n_heads
    (out / "config.json").write_text(json.dumps(cfg))
    save_file(hf_state_dict(model), str(out / "model.safetensors"), metadata={"format": "pt"})
    return out
