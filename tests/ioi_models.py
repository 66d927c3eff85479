"""Tiny word-level models for the IOI probe, built in-process (nothing downloads).

The tokenizer is word-level (the words of :func:`headlens.probes.ioi.words`, split on whitespace and
punctuation), so the names the probe may use are exactly the ones given to :func:`save_ioi_tokenizer`:
what "found automatically" must find. ``save_ioi_llama`` writes a random-weight grouped-query Llama
(4 query heads on 2 key/value heads) with it, loadable as ``hf:<dir>``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

UNK, BOS, PAD = "[UNK]", "<bos>", "<pad>"


def ioi_vocab(names: tuple[str, ...] | None = None) -> dict[str, int]:
    """Specials, then every probe word except the names, then ``names`` (default: all of the probe's)."""
    from headlens.probes.ioi import NAMES, words

    names = NAMES if names is None else names
    plain = [w for w in words() if w not in NAMES]
    return {w: i for i, w in enumerate([UNK, BOS, PAD, *plain, *names])}


def load_quietly(path: Path) -> Any:
    """``headlens.load("hf:<path>")`` without its one-line notes (the substitutions a test model triggers)."""
    import warnings

    import headlens

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return headlens.load(f"hf:{path}")


def save_ioi_tokenizer(out: Path, names: tuple[str, ...] | None = None, n_ctx: int = 64) -> dict[str, int]:
    """A word-level fast tokenizer over :func:`ioi_vocab` into ``out``; returns the vocabulary."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = ioi_vocab(names)
    tok = Tokenizer(models.WordLevel(vocab, unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token=UNK, bos_token=BOS, eos_token=BOS, pad_token=PAD,
                            model_max_length=n_ctx).save_pretrained(str(out))
    return vocab


def llama_config(vocab_size: int, **overrides: Any) -> Any:
    from transformers import LlamaConfig

    fields = dict(vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=64,
                  bos_token_id=1, eos_token_id=1, pad_token_id=2, tie_word_embeddings=False, initializer_range=0.1)
    fields.update(overrides)
    return LlamaConfig(**fields)


def save_ioi_llama(out: Path, names: tuple[str, ...] | None = None, seed: int = 0, **overrides: Any) -> Path:
    """A random-weight GQA Llama with the IOI word-level tokenizer, as a Hugging Face directory."""
    from transformers import LlamaForCausalLM

    out.mkdir(parents=True, exist_ok=True)
    vocab = save_ioi_tokenizer(out, names)
    torch.manual_seed(seed)
    LlamaForCausalLM(llama_config(len(vocab), **overrides)).eval().save_pretrained(str(out))
    return out


# -- a planted name mover ----------------------------------------------------------------------------
NAME_DIMS = 16  # the residual dimensions names live in (one head's width): the planted heads copy them


def save_planted_llama(out: Path, heads: dict[tuple[int, int], tuple[int, float]], seed: int = 0) -> Path:
    """A Llama with attention biases (RoPE, 4 query heads on 2 key/value heads of width 16) with the IOI word-level
    tokenizer, whose listed heads ``(layer, head) -> (offset, gain)`` attend ``offset`` tokens back
    (``hf_families.plant_offset_heads``) and copy what they read into the logits with ``gain`` (negative:
    write against it). Names embed in the first :data:`NAME_DIMS` residual dimensions, every other word in
    the rest, and the unembedding is the embedding: a head whose value and output are the identity on the
    name dimensions writes the name it attends to. At most one planted head per key/value group.
    """
    from hf_families import plant_offset_heads
    from transformers import LlamaForCausalLM

    from headlens.probes.ioi import NAMES

    out.mkdir(parents=True, exist_ok=True)
    vocab = save_ioi_tokenizer(out)
    cfg = llama_config(len(vocab), attention_bias=True, initializer_range=0.05)  # q/k biases: the plant's lever
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg).eval()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        emb = torch.zeros(len(vocab), 64)
        emb[:, NAME_DIMS:] = torch.randn(len(vocab), 64 - NAME_DIMS, generator=gen)
        names = [vocab[n] for n in NAMES]
        emb[names] = 0
        emb[names, :NAME_DIMS] = 2 * torch.nn.functional.normalize(torch.randn(len(names), NAME_DIMS, generator=gen),
                                                                  dim=-1) * NAME_DIMS**0.5
        model.model.embed_tokens.weight.copy_(emb)
        model.lm_head.weight.copy_(emb)
        plant_offset_heads(model, {h: offset for h, (offset, _) in heads.items()})
        eye = torch.eye(NAME_DIMS)
        for (layer, head), (_, gain) in heads.items():
            attn, kv = model.model.layers[layer].self_attn, head // 2
            attn.v_proj.weight[kv * 16:(kv + 1) * 16] = 0
            attn.v_proj.weight[kv * 16:(kv + 1) * 16, :NAME_DIMS] = eye  # value: the name dimensions
            attn.v_proj.bias[kv * 16:(kv + 1) * 16] = 0
            attn.o_proj.weight[:, head * 16:(head + 1) * 16] = 0
            attn.o_proj.weight[:NAME_DIMS, head * 16:(head + 1) * 16] = gain * eye  # output: back onto them
    model.save_pretrained(str(out))
    return out
