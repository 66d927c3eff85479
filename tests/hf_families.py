"""Tiny random-weight Hugging Face models of every family headlens claims, built in-process.

Each family is a ``transformers`` config at test size (2 layers, d_model 64, vocab ~300,
n_ctx 128), saved with ``save_pretrained`` next to a byte-level BPE tokenizer trained in a
second with ``tokenizers`` on a few standard-library files: the directory looks like a
download. Nothing downloads. ``build(family, root)`` writes one; ``FAMILIES`` lists them.

Weights use a larger init than the families' defaults (0.02) so that attention patterns are
far from uniform: a head mix-up or a wrong mask shows in a parity test.
"""

from __future__ import annotations

import functools
import inspect
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

N_LAYERS, D_MODEL, N_HEADS, N_CTX, VOCAB = 2, 64, 4, 128, 300
INIT = 0.1  # initializer_range: far from uniform attention, still no overflow in float32
SLIDING_WINDOW = 16  # Mistral: prompts longer than this exercise the window


@dataclass(frozen=True)
class Family:
    """One architecture family at test size.

    Attributes:
        name: short name used in test ids and the README table.
        config: ``transformers`` config class name.
        model: model class name (a ``...ForCausalLM`` / ``...ForMaskedLM``).
        kwargs: config fields beyond the shared sizes.
        out_proj: attribute path (inside one decoder layer) of the module whose *input* is the
            concatenation of every head's ``z``: the independent ablation reference hooks it.
        layers: attribute path from the model to its list of layers.
        causal: decoder (True) or encoder (False).
        n_kv_heads: key/value heads (``N_HEADS`` without grouped-query attention).
        refuses: claim (one of ``CLAIMS``) -> a fragment of the one-line ``HeadlensError`` headlens answers
            it with on this family, by design (the README's matrix says why).
        known: claim -> a known bug not fixed yet, on this family: the matrix tests that
            claim as a strict ``xfail`` (it fails today; fixing it makes the test pass, then drop the entry).
    """

    name: str
    config: str
    model: str
    kwargs: dict[str, Any] = field(default_factory=dict)
    out_proj: str = "self_attn.o_proj"
    layers: str = "model.layers"
    causal: bool = True
    n_kv_heads: int = N_HEADS
    refuses: dict[str, str] = field(default_factory=dict)
    known: dict[str, str] = field(default_factory=dict)

    @property
    def d_head(self) -> int:
        return int(self.kwargs.get("head_dim", D_MODEL // N_HEADS))


_LLAMA_LIKE = dict(hidden_size=D_MODEL, num_attention_heads=N_HEADS, num_hidden_layers=N_LAYERS,
                   intermediate_size=128, max_position_embeddings=N_CTX)

_FORKS = "no per-head q/k/v input forks"  # the bridge cannot patch a head's q/k/v input: edges into the logits work
_NO_FORKS = dict(refuses={"circuit": _FORKS, "circuit_receiver": _FORKS, "circuit_positions": _FORKS})
_ENCODER = dict(refuses={"circuit": "is an encoder",
                         "circuit_receiver": "is an encoder", "circuit_positions": "is an encoder",
                         "attribute": "is an encoder", "doctor": "checks causal language models"})

# The architecture matrix (README "## Architectures"): every command is tested on every family here
# (tests/models/test_families.py; attribute in tests/readout/test_dla_families.py). Post-norms (Gemma 2/3,
# OLMo-2), QK norms (Gemma 3, Qwen3, OLMo-2, Cohere, StableLM), head width != d_model / n_heads (Gemma, Gemma 3,
# Qwen3), sliding and global layers (Mistral, Gemma 2/3, Starcoder2), experts (Mixtral), parallel attention and
# MLP (Phi-1/2, Falcon, Cohere), soft-capping (Gemma 2).
FAMILIES: dict[str, Family] = {f.name: f for f in [
    Family("gpt2", "GPT2Config", "GPT2LMHeadModel",
           dict(n_layer=N_LAYERS, n_embd=D_MODEL, n_head=N_HEADS, n_positions=N_CTX),
           out_proj="attn.c_proj", layers="transformer.h"),
    Family("gpt_neox", "GPTNeoXConfig", "GPTNeoXForCausalLM",
           dict(_LLAMA_LIKE, rotary_pct=0.25), out_proj="attention.dense", layers="gpt_neox.layers"),
    Family("gptj", "GPTJConfig", "GPTJForCausalLM",
           dict(n_layer=N_LAYERS, n_embd=D_MODEL, n_head=N_HEADS, n_positions=N_CTX, rotary_dim=8),
           out_proj="attn.out_proj", layers="transformer.h", **_NO_FORKS),
    Family("opt", "OPTConfig", "OPTForCausalLM",
           dict(hidden_size=D_MODEL, num_attention_heads=N_HEADS, num_hidden_layers=N_LAYERS, ffn_dim=128,
                max_position_embeddings=N_CTX, word_embed_proj_dim=D_MODEL),
           out_proj="self_attn.out_proj", layers="model.decoder.layers", **_NO_FORKS),
    Family("llama", "LlamaConfig", "LlamaForCausalLM", dict(_LLAMA_LIKE, num_key_value_heads=2), n_kv_heads=2),
    Family("mistral", "MistralConfig", "MistralForCausalLM",
           dict(_LLAMA_LIKE, num_key_value_heads=2, sliding_window=SLIDING_WINDOW), n_kv_heads=2),
    Family("qwen2", "Qwen2Config", "Qwen2ForCausalLM", dict(_LLAMA_LIKE, num_key_value_heads=2), n_kv_heads=2),
    Family("gemma", "GemmaConfig", "GemmaForCausalLM", dict(_LLAMA_LIKE, num_key_value_heads=1, head_dim=32),
           n_kv_heads=1),
    Family("phi3", "Phi3Config", "Phi3ForCausalLM", dict(_LLAMA_LIKE, num_key_value_heads=2), n_kv_heads=2),
    Family("bert", "BertConfig", "BertForMaskedLM",
           dict(hidden_size=D_MODEL, num_attention_heads=N_HEADS, num_hidden_layers=N_LAYERS,
                intermediate_size=128, max_position_embeddings=N_CTX),
           out_proj="attention.output.dense", layers="bert.encoder.layer", causal=False, **_ENCODER),
    Family("roberta", "RobertaConfig", "RobertaForMaskedLM",
           dict(hidden_size=D_MODEL, num_attention_heads=N_HEADS, num_hidden_layers=N_LAYERS,
                intermediate_size=128, max_position_embeddings=N_CTX + 2),
           out_proj="attention.output.dense", layers="roberta.encoder.layer", causal=False, **_ENCODER),
    Family("gemma2", "Gemma2Config", "Gemma2ForCausalLM",  # post-norms, logit soft-capping, sliding every other layer
           dict(_LLAMA_LIKE, num_key_value_heads=2, head_dim=16, sliding_window=SLIDING_WINDOW,
                attn_logit_softcapping=5.0), n_kv_heads=2),
    Family("gemma3", "Gemma3TextConfig", "Gemma3ForCausalLM",  # post-norms, QK norm, sliding + global layers
           dict(_LLAMA_LIKE, num_key_value_heads=2, head_dim=32, sliding_window=SLIDING_WINDOW,
                layer_types=["sliding_attention", "full_attention"]), n_kv_heads=2),
    Family("qwen3", "Qwen3Config", "Qwen3ForCausalLM",  # QK norm, head_dim 32 != 64 / 4
           dict(_LLAMA_LIKE, num_key_value_heads=2, head_dim=32), n_kv_heads=2),
    Family("olmo2", "Olmo2Config", "Olmo2ForCausalLM",  # norms after each sublayer only; QK norm over all heads
           dict(_LLAMA_LIKE, num_key_value_heads=2), n_kv_heads=2),
    Family("mixtral", "MixtralConfig", "MixtralForCausalLM",  # mixture of experts
           dict(_LLAMA_LIKE, num_key_value_heads=2, num_local_experts=2, num_experts_per_tok=1), n_kv_heads=2),
    Family("phi", "PhiConfig", "PhiForCausalLM",  # Phi-1/2: parallel attention and MLP, partial rotary
           dict(_LLAMA_LIKE, partial_rotary_factor=0.5), out_proj="self_attn.dense"),
    Family("falcon", "FalconConfig", "FalconForCausalLM",  # parallel attention and MLP, multi-query
           dict(hidden_size=D_MODEL, num_attention_heads=N_HEADS, num_hidden_layers=N_LAYERS,
                new_decoder_architecture=False, multi_query=True, parallel_attn=True, alibi=False),
           out_proj="self_attention.dense", layers="transformer.h", n_kv_heads=1),
    Family("cohere", "CohereConfig", "CohereForCausalLM",  # parallel attention and MLP, QK norm (LayerNorm)
           dict(_LLAMA_LIKE, num_key_value_heads=2, use_qk_norm=True), n_kv_heads=2),
    Family("starcoder2", "Starcoder2Config", "Starcoder2ForCausalLM",  # GQA, sliding window, biases
           dict(_LLAMA_LIKE, num_key_value_heads=2, sliding_window=SLIDING_WINDOW), n_kv_heads=2),
    Family("stablelm", "StableLmConfig", "StableLmForCausalLM",  # partial rotary, qkv bias, per-head QK LayerNorm
           dict(_LLAMA_LIKE, num_key_value_heads=2, partial_rotary_factor=0.25, use_qkv_bias=True,
                qk_layernorm=True), n_kv_heads=2),
]}
# The claims a family of the matrix makes: one test each (``claims``); a family refuses or fails one by name.
CLAIMS = ("patterns", "ablate", "classify", "attribute", "circuit", "circuit_receiver", "circuit_positions",
          "doctor", "dashboard")
# The newer families (post-norms, QK-norm, MoE, ...), joined to the matrix above (the circuits and doctor work imports this name).
JOINING: dict[str, Family] = {n: FAMILIES[n] for n in ("gemma3", "qwen3", "olmo2", "mixtral", "phi", "falcon",
                                                       "cohere", "starcoder2", "stablelm")}
# Beyond the matrix, for the fused sparse scan (tests/scoring/test_sparse_bridge.py): layers SDPA cannot do exactly.
EXTRAS: dict[str, Family] = {f.name: f for f in [
    FAMILIES["gemma2"],  # logit soft-capping (also in the matrix)
    Family("gpt_oss", "GptOssConfig", "GptOssForCausalLM",  # attention sinks, mixture of experts
           dict(_LLAMA_LIKE, intermediate_size=64, num_key_value_heads=2, head_dim=16, sliding_window=SLIDING_WINDOW,
                num_local_experts=2, num_experts_per_tok=1), n_kv_heads=2),
]}
_ALL = {**FAMILIES, **EXTRAS}


def claims(claim: str, causal_only: bool = False) -> list[Any]:
    """The matrix's families as pytest parameters of ``claim``: a strict ``xfail`` where the family's ``known``
    names a bug for it. Families that refuse it are included (the test checks the refusal)."""
    import pytest

    assert claim in CLAIMS, claim
    return [pytest.param(name, marks=pytest.mark.xfail(strict=True, reason=fam.known[claim]))
            if claim in fam.known else name
            for name, fam in FAMILIES.items() if fam.causal or not causal_only]


SPECIALS_CAUSAL = {"bos_token": "<|bos|>", "eos_token": "<|eos|>", "pad_token": "<|pad|>", "unk_token": "<|unk|>"}
SPECIALS_ENCODER = {"cls_token": "[CLS]", "sep_token": "[SEP]", "pad_token": "[PAD]", "mask_token": "[MASK]",
                    "unk_token": "[UNK]", "bos_token": "[CLS]", "eos_token": "[SEP]"}


@functools.cache
def _tokenizer_json(causal: bool) -> str:
    """A byte-level BPE (``VOCAB`` entries) trained on a few stdlib files, as tokenizer.json text."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    specials = list(dict.fromkeys((SPECIALS_CAUSAL if causal else SPECIALS_ENCODER).values()))
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    texts = [inspect.getsource(m) for m in (functools, inspect, os)]
    tok.train_from_iterator(texts, trainer)
    if causal:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    else:
        cls, sep = SPECIALS_ENCODER["cls_token"], SPECIALS_ENCODER["sep_token"]
        tok.post_processor = processors.TemplateProcessing(
            single=f"{cls} $A {sep}", pair=f"{cls} $A {sep} $B {sep}",
            special_tokens=[(cls, tok.token_to_id(cls)), (sep, tok.token_to_id(sep))])
    return tok.to_str()


def save_tokenizer(path: Path, causal: bool = True) -> None:
    """Write the test tokenizer (tokenizer.json + tokenizer_config.json) into ``path``."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    specials = SPECIALS_CAUSAL if causal else SPECIALS_ENCODER
    fast = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(_tokenizer_json(causal)), **specials)
    fast.save_pretrained(path)


def hf_config(family: str | Family, vocab_size: int = VOCAB, **overrides: Any) -> Any:
    import transformers

    fam = _ALL[family] if isinstance(family, str) else family
    specials = _special_ids(fam.causal)
    kwargs = dict(fam.kwargs, vocab_size=vocab_size, initializer_range=INIT, tie_word_embeddings=False,
                  **specials, **overrides)
    return getattr(transformers, fam.config)(**kwargs)


def _special_ids(causal: bool) -> dict[str, int]:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_str(_tokenizer_json(causal))
    if causal:
        return {"bos_token_id": tok.token_to_id("<|bos|>"), "eos_token_id": tok.token_to_id("<|eos|>"),
                "pad_token_id": tok.token_to_id("<|pad|>")}
    return {"pad_token_id": tok.token_to_id("[PAD]")}


def build(family: str, path: Path, seed: int = 0, tokenizer: bool = True, **overrides: Any) -> Path:
    """Write a random-weight ``family`` model (float32, safetensors) and its tokenizer to ``path``."""
    import transformers

    fam = _ALL[family]
    torch.manual_seed(seed)
    model = getattr(transformers, fam.model)(hf_config(fam, **overrides)).eval()
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    if tokenizer:
        save_tokenizer(path, fam.causal)
    return path


def hub_snapshot(cache: Path, repo: str, commit: str, files: Path, refs: tuple[str, ...]) -> Path:
    """Copy ``files`` into a Hugging Face cache (``$HF_HOME/hub``) as ``huggingface_hub`` leaves a download of
    ``repo`` at ``commit``: ``models--ORG--NAME/snapshots/<commit>/`` and one ``refs/<ref>`` file per ref."""
    import shutil

    folder = cache / ("models--" + repo.replace("/", "--"))
    snap = folder / "snapshots" / commit
    shutil.copytree(files, snap)
    (folder / "refs").mkdir(parents=True, exist_ok=True)
    for ref in refs:
        (folder / "refs" / ref).write_text(commit)  # no newline, as huggingface_hub writes it
    return snap


def load_eager(path: Path, family: str) -> Any:
    """The same directory through ``transformers`` alone, eager attention (the reference)."""
    import transformers

    cls = getattr(transformers, _ALL[family].model)
    return cls.from_pretrained(path, attn_implementation="eager").eval()


def out_proj(hf_model: Any, family: str, layer: int) -> torch.nn.Module:
    """The output projection of ``layer``: its input is every head's ``z``, concatenated."""
    fam = _ALL[family]
    module = hf_model
    for part in f"{fam.layers}.{layer}.{fam.out_proj}".split("."):
        module = module[int(part)] if part.isdigit() else getattr(module, part)
    return module


def plant_offset_heads(hf_model: Any, heads: dict[tuple[int, int], int], strength: float = 60.0) -> Any:
    """Make each ``(layer, head)`` of a Qwen2-style model (RoPE, q/k biases) attend ``offset`` tokens back.

    The head's query and its key/value group's key become constants (weights zero, biases set), so
    after RoPE their dot product depends on the distance ``Δ = q_pos - k_pos`` alone: per rotary
    frequency θ the key bias is the query bias turned by ``θ·offset``, which makes the score
    ``strength · Σ_θ cos(θ (Δ - offset))``, highest at ``Δ = offset``. A previous-token head is
    ``offset=1``, a current-token head ``offset=0``. Other heads of the group keep their random
    queries; each group's key is shared, so at most one offset per key/value group.
    """
    cfg = hf_model.config
    d_head = cfg.hidden_size // cfg.num_attention_heads
    group = cfg.num_attention_heads // cfg.num_key_value_heads
    inv_freq = hf_model.model.rotary_emb.inv_freq.double()  # (d_head / 2,): θ per rotary plane
    half = d_head // 2
    with torch.no_grad():
        for (layer, head), offset in heads.items():
            attn = hf_model.model.layers[layer].self_attn
            kv = head // group
            q_rows, k_rows = slice(head * d_head, (head + 1) * d_head), slice(kv * d_head, (kv + 1) * d_head)
            b_q = torch.zeros(d_head, dtype=torch.float64)
            b_q[:half] = (strength * d_head**0.5 / half) ** 0.5  # plane i is dims (i, i + half): rotate_half
            b_k = torch.zeros(d_head, dtype=torch.float64)
            b_k[:half] = b_q[:half] * torch.cos(inv_freq * offset)
            b_k[half:] = b_q[:half] * torch.sin(inv_freq * offset)
            attn.q_proj.weight[q_rows] = 0
            attn.k_proj.weight[k_rows] = 0
            attn.q_proj.bias[q_rows] = b_q.float()
            attn.k_proj.bias[k_rows] = b_k.float()
    return hf_model
