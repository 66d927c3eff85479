"""Tiny GGUF files of several families, written in-process: the inverse of transformers' GGUF reader.

llama.cpp's ``convert_hf_to_gguf.py`` is not installed and nothing downloads, so a test writes its
own GGUF from a tiny random Hugging Face model (:mod:`tests.hf_families`) with the ``gguf``
package's ``GGUFWriter``, undoing exactly what ``transformers/modeling_gguf_pytorch_utils.py`` and
``integrations/ggml.py`` do when they read one:

* **metadata**: for each ``{arch}.KEY -> config attribute`` of transformers' ``GGUF_CONFIG_MAPPING``,
  the attribute's value (``rope.freq_base`` from ``rope_parameters``); ``general.*``; the tied
  embedding is said by leaving ``output.weight`` out, as llama.cpp does;
* **tensor names**: gguf's own ``get_tensor_name_map`` (the one transformers inverts);
* **tensor values**: Llama's Q/K rows permuted as llama.cpp permutes them (transformers un-permutes),
  Gemma-2/3's norm weights stored as ``1 + w``, GPT-2's Conv1D matrices transposed;
* **tokenizer**: a byte-level BPE as ``tokenizer.ggml.*`` (tokens, types with the specials as
  CONTROL, merges, special ids, ``add_bos_token``);
* **quantization**: 2-D weights whose rows fit the block size through ``gguf.quants.quantize``
  (Q8_0, Q4_0 ...); norms, biases and 1-D tensors stay F32, as llama.cpp keeps them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

# transformers model_type -> GGUF architecture (the names transformers maps back)
GGUF_ARCH = {"llama": "llama", "qwen2": "qwen2", "gemma2": "gemma2", "gemma3_text": "gemma3", "phi3": "phi3",
             "gpt2": "gpt2", "mistral": "llama"}
_GPT2_TRANSPOSED = ("attn_qkv.weight", "ffn_down.weight", "ffn_up.weight", "attn_output.weight")


def _permute(w: np.ndarray, n_head: int, n_head_kv: int) -> np.ndarray:
    """llama.cpp's Q/K row order (``convert_hf_to_gguf.LlamaModel.permute``): rotary halves interleaved."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _config_value(config: Any, attr: str) -> Any:
    if attr == "rope_theta":
        rope = getattr(config, "rope_parameters", None) or {}
        return rope.get("rope_theta") if isinstance(rope, dict) else None  # per-layer-type dicts: not one value
    return getattr(config, attr, None)


def _add_value(writer: Any, key: str, value: Any) -> None:
    if isinstance(value, bool):
        writer.add_bool(key, value)
    elif isinstance(value, int):
        writer.add_uint32(key, value)
    elif isinstance(value, float):
        writer.add_float32(key, value)
    elif isinstance(value, str):
        writer.add_string(key, value)


def _metadata(writer: Any, config: Any, arch: str) -> None:
    from transformers.integrations.ggml import GGUF_CONFIG_MAPPING

    for gguf_key, attr in GGUF_CONFIG_MAPPING[arch].items():
        if attr is None or (value := _config_value(config, attr)) is None:
            continue
        _add_value(writer, f"{arch}.{gguf_key}", value)


def _tokenizer(writer: Any, tokenizer: Any, add_bos: bool | None) -> None:
    """A byte-level BPE (``tokenizers`` model type BPE) as llama.cpp's ``gpt2`` tokenizer model."""
    import gguf

    state = json.loads(tokenizer.backend_tokenizer.to_str())
    vocab = state["model"]["vocab"]
    added = {t["content"]: t["id"] for t in state.get("added_tokens", [])}
    tokens = [""] * (max([*vocab.values(), *added.values()]) + 1)
    for token, i in {**vocab, **added}.items():
        tokens[i] = token
    special = set(added)
    merges = [m if isinstance(m, str) else " ".join(m) for m in state["model"]["merges"]]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([int(gguf.TokenType.CONTROL if t in special else gguf.TokenType.NORMAL) for t in tokens])
    writer.add_token_merges(merges)
    for role, add in (("bos", writer.add_bos_token_id), ("eos", writer.add_eos_token_id),
                      ("unk", writer.add_unk_token_id), ("pad", writer.add_pad_token_id)):
        tid = getattr(tokenizer, f"{role}_token_id", None)
        if tid is not None:
            add(int(tid))
    if add_bos is not None:
        writer.add_add_bos_token(add_bos)


def _tensor(name: str, t: torch.Tensor, arch: str, config: Any) -> np.ndarray:
    """The tensor as llama.cpp stores it (the inverse of transformers' ``TensorProcessor``s)."""
    w = t.detach().to(torch.float32).numpy().copy()
    if arch == "llama" and (".attn_q." in name or ".attn_k." in name):
        n_kv = config.num_attention_heads if ".attn_q." in name else config.num_key_value_heads
        w = _permute(w, config.num_attention_heads, n_kv)
    elif arch in ("gemma2", "gemma3") and "norm.weight" in name:
        w = w + 1.0  # Gemma's RMSNorm multiplies by (1 + w); llama.cpp stores 1 + w
    elif arch == "gpt2" and any(s in name for s in _GPT2_TRANSPOSED):
        w = w.T.copy()  # HF GPT-2 keeps Conv1D weights as (in, out)
    return w


def _quantized(w: np.ndarray, name: str, qtype: Any) -> tuple[np.ndarray, Any]:
    """``(data, raw_dtype)``: 2-D weights whose rows fit the block in ``qtype``; the rest F32."""
    import gguf

    block = gguf.GGML_QUANT_SIZES[qtype][0]
    if qtype == gguf.GGMLQuantizationType.F32 or w.ndim != 2 or w.shape[-1] % block or "norm" in name:
        return w.astype(np.float32), None
    return gguf.quants.quantize(w.astype(np.float32), qtype), qtype


def write_gguf(model: Any, tokenizer: Any, path: Path, qtype: str = "F32", add_bos: bool | None = None,
               name: str = "tiny") -> Path:
    """Write ``model`` (a tiny transformers causal LM) and its tokenizer to ``path`` as llama.cpp would.

    Args:
        model: a ``...ForCausalLM`` of a family in :data:`GGUF_ARCH`.
        tokenizer: its byte-level BPE tokenizer (``PreTrainedTokenizerFast``).
        path: the ``.gguf`` to write.
        qtype: ``"F32"``, ``"F16"``, ``"Q8_0"``, ``"Q4_0"``, ``"Q4_1"`` ...: the type of the 2-D weights.
        add_bos: ``tokenizer.ggml.add_bos_token`` (None: not said).
        name: ``general.name``.
    """
    import gguf

    config = model.config
    arch = GGUF_ARCH[config.model_type]
    quant = gguf.GGMLQuantizationType[qtype]
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_name(name)
    _metadata(writer, config, arch)
    ftype = gguf.LlamaFileType.ALL_F32 if qtype == "F32" else gguf.LlamaFileType[f"MOSTLY_{qtype}"]
    writer.add_file_type(int(ftype))
    _tokenizer(writer, tokenizer, add_bos)
    names = gguf.get_tensor_name_map(next(a for a, n in gguf.MODEL_ARCH_NAMES.items() if n == arch),
                                     config.num_hidden_layers)
    tied = bool(getattr(config, "tie_word_embeddings", False))
    for hf_name, t in model.state_dict().items():
        base, _, suffix = hf_name.rpartition(".")
        gguf_name = names.get_name(base)
        if gguf_name is None or (tied and gguf_name == "output"):
            continue  # buffers (rotary inv_freq, GPT-2's masks) and the tied head
        full = f"{gguf_name}.{suffix}"
        data, raw = _quantized(_tensor(full, t, arch, config), full, quant)
        writer.add_tensor(full, data, raw_dtype=raw)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _families() -> dict[str, Any]:
    """The families the round-trip tests write, at test size (tests/hf_families.py), as GGUF can hold them:
    Gemma ties its head to the embedding (llama.cpp writes no ``output.weight``); GPT-2's context stays
    the config default (the reader maps ``context_length`` to ``n_ctx``, not ``n_positions``); Gemma-2's
    soft-capping stays the default (not in GGUF's metadata)."""
    from tests.hf_families import _LLAMA_LIKE, EXTRAS, FAMILIES, Family

    gemma = dict(_LLAMA_LIKE, num_key_value_heads=2, head_dim=16, sliding_window=16, tie_word_embeddings=True)
    return {
        "llama": FAMILIES["llama"],  # grouped-query attention: 4 query heads on 2 key/value heads
        "qwen2": FAMILIES["qwen2"],  # q/k/v biases
        "gemma2": Family("gemma2", "Gemma2Config", "Gemma2ForCausalLM", gemma, n_kv_heads=2),
        "gemma3": Family("gemma3", "Gemma3TextConfig", "Gemma3ForCausalLM",  # q/k norms, post-attention norms
                         dict(gemma, num_key_value_heads=1), n_kv_heads=1),
        "phi3": FAMILIES["phi3"],  # fused qkv_proj and gate_up_proj
        "gpt2": Family("gpt2", "GPT2Config", "GPT2LMHeadModel", dict(EXTRAS.get("gpt2", FAMILIES["gpt2"]).kwargs,
                                                                     n_positions=1024),
                       out_proj="attn.c_proj", layers="transformer.h"),
    }


def tiny_model(family: str, seed: int = 0, **overrides: Any) -> tuple[Any, Any]:
    """A tiny random ``family`` model (eager attention) and the byte-level test tokenizer, in memory."""
    import transformers
    from tokenizers import Tokenizer

    from tests.hf_families import INIT, SPECIALS_CAUSAL, VOCAB, _special_ids, _tokenizer_json

    fam = _families()[family]
    torch.manual_seed(seed)
    kwargs = {"vocab_size": VOCAB, "initializer_range": INIT, "tie_word_embeddings": False,
              **_special_ids(True), **fam.kwargs, **overrides}
    config = getattr(transformers, fam.config)(**kwargs)
    config._attn_implementation = "eager"
    model = getattr(transformers, fam.model)(config).eval()
    tok = transformers.PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(_tokenizer_json(True)),
                                               **SPECIALS_CAUSAL)
    return model, tok


def endoftext_tokenizer() -> Any:
    """The test tokenizer with its ``<|unk|>`` spelled ``<|endoftext|>``, as SmolLM2's GGUF has it: a vocabulary
    whose document separator is not its declared ``bos_token``."""
    import transformers
    from tokenizers import Tokenizer

    from tests.hf_families import SPECIALS_CAUSAL, _tokenizer_json

    text = _tokenizer_json(True).replace('"<|unk|>"', '"<|endoftext|>"')
    return transformers.PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(text),
                                               **{**SPECIALS_CAUSAL, "unk_token": "<|endoftext|>"})


def write_unreadable_architecture(path: Path, arch: str = "madeup") -> Path:
    """A well-formed GGUF whose ``general.architecture`` transformers has no reader for (one F32 tensor)."""
    import gguf

    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_name("unreadable")
    writer.add_tensor("token_embd.weight", np.zeros((8, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def rounded(model: Any, qtype: str) -> Any:
    """A copy of ``model`` whose weights are what :func:`write_gguf` stores at ``qtype``, read back: the
    reference a quantized file must reproduce. Row-wise blocks commute with Llama's Q/K row permutation,
    so the rounding is applied in Hugging Face layout (not for GPT-2's transposed matrices)."""
    import copy

    import gguf

    quant = gguf.GGMLQuantizationType[qtype]
    out = copy.deepcopy(model)
    with torch.no_grad():
        for name, p in out.named_parameters():
            data, raw = _quantized(p.detach().numpy(), name, quant)
            if raw is not None:
                back = gguf.quants.dequantize(data, raw).reshape(p.shape)
                p.copy_(torch.from_numpy(np.ascontiguousarray(back)))
    return out
