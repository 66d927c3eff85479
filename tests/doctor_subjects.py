"""The doctor's test subject, trained once per test session (headlens.doctor.demo's shifted-copy model)."""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

import torch

from headlens.doctor.demo import TRUE_N_HEADS, save_with_claimed_heads, shifted_copy_texts, train_shifted_copy
from headlens.models.gpt import GPT

__all__ = ["TRUE_N_HEADS", "evaluation_texts", "trained_model", "write_hf_dir", "write_lying_checkpoint"]

evaluation_texts = shifted_copy_texts
write_lying_checkpoint = save_with_claimed_heads


@lru_cache(maxsize=1)
def _trained_state() -> dict[str, torch.Tensor]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return {k: v.clone() for k, v in train_shifted_copy(steps=300).state_dict().items()}
    finally:
        torch.set_num_threads(threads)


def trained_model() -> GPT:
    model = train_shifted_copy(steps=0)  # same architecture, weights replaced below
    model.load_state_dict(_trained_state())
    return model.eval()


def write_hf_dir(model: GPT, out: Path, claimed_n_heads: int | None = None) -> Path:
    """A Hugging Face GPT-2 directory (config.json + model.safetensors), optionally with a lying n_head."""
    from safetensors.torch import save_file

    from headlens.models.export import hf_config, hf_state_dict

    out.mkdir(parents=True, exist_ok=True)
    cfg = hf_config(model)
    if claimed_n_heads is not None:
        cfg["n_head"] = claimed_n_heads
    (out / "config.json").write_text(json.dumps(cfg))
    save_file(hf_state_dict(model), str(out / "model.safetensors"), metadata={"format": "pt"})
    return out
