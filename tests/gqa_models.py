"""Tiny grouped-query-attention Hugging Face models, built in-process (nothing downloads).

``save_llama`` writes a random-weight ``LlamaForCausalLM`` directory (config, safetensors, a
byte-level tokenizer whose id ``b`` is byte ``b``, BOS 256), loadable as ``hf:<dir>``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

BOS = 256


def llama_config(**overrides: Any) -> Any:
    """A 2-layer d_model-64 Llama with 4 query heads sharing 2 key/value heads (head_dim 16)."""
    from transformers import LlamaConfig

    fields = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, intermediate_size=128,
                  num_hidden_layers=2, vocab_size=257, max_position_embeddings=128, bos_token_id=BOS,
                  eos_token_id=BOS, pad_token_id=BOS, attn_implementation="eager")
    fields.update(overrides)
    return LlamaConfig(**fields)


def save_tokenizer(out: Path, n_ctx: int = 128) -> None:
    """A byte-level tokenizer (the one ``headlens export-hf`` writes) into ``out``."""
    from transformers import PreTrainedTokenizerFast

    from headlens.models.export import BOS_TOKEN, hf_tokenizer
    from headlens.models.tokenizer import Tokenizer

    fast = PreTrainedTokenizerFast(tokenizer_object=hf_tokenizer(Tokenizer.byte_level(), 257), bos_token=BOS_TOKEN,
                                   eos_token=BOS_TOKEN, pad_token=BOS_TOKEN, unk_token=BOS_TOKEN,
                                   model_max_length=n_ctx)
    fast.save_pretrained(str(out))


def save_model(model: Any, out: Path) -> Path:
    """``model`` (any ``*ForCausalLM``) with a byte-level tokenizer as a directory."""
    model.save_pretrained(str(out))
    save_tokenizer(out, int(model.config.max_position_embeddings))
    return out


def save_llama(out: Path, seed: int = 0, **overrides: Any) -> Path:
    """A random-weight GQA Llama directory at ``out``."""
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    return save_model(LlamaForCausalLM(llama_config(**overrides)).eval(), out)
