"""Compiled tracr models as native headlens GPTs: weights whose every head's job is known.

tracr (``pip install 'headlens[tracr]'``, which pulls jax) compiles a RASP program to transformer
weights. Its models differ from GPT-2 in four ways, and :class:`~headlens.models.config.ModelConfig`
carries each: no LayerNorm (``normalization="none"``), ReLU MLPs (``act_fn="relu"``), a head width
independent of ``d_model`` (``d_head`` = tracr's ``key_size``; layers with fewer heads are padded
with all-zero heads, as tracr itself does) and, by default, bidirectional attention
(``causal=False``). Attention is ``softmax(q k^T / sqrt(key_size))`` in both.

The conversion is exact: the residual stream of the GPT equals tracr's, position by position. Only
the ends change names:

* **Tokens.** The GPT's char-level tokenizer has one character per value of tracr's vocabulary and
  output (``str(value)``, which must be one character); BOS is the tokenizer's own BOS and maps to
  tracr's ``compiler_bos``. Pass prompts as strings, e.g. ``"abcd"`` for ``["a", "b", "c", "d"]``.
* **Logits.** tracr reads a categorical output as the argmax over the output SOp's subspace of the
  residual. ``lm_head`` writes ``logit_scale`` times that subspace's coordinates to the output values'
  token ids (every other id gets 0), so the argmax is tracr's answer and the softmax is confident
  enough for ``kl`` to measure how far an intervention moves it.

Reading this module needs no jax: it takes the assembled model's arrays as numpy.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from headlens.errors import ConfigError
from headlens.models.config import ModelConfig
from headlens.models.gpt import GPT
from headlens.models.tokenizer import Tokenizer

LOGIT_SCALE = 10.0  # clean outputs sit at logit 10 vs 0: p(answer) ~ 1 - (V - 1) e^-10


def _np(x: Any) -> np.ndarray:
    return np.array(x, dtype=np.float32)  # a writable copy (jax arrays are read-only)


def tracr_alphabet(assembled: Any) -> str:
    """One character per input and output value of the compiled model (sorted), BOS and PAD left out."""
    enc = assembled.input_encoder
    values = [v for v in enc.encoding_map if v not in (enc.bos_token, enc.pad_token)]
    values += list(getattr(assembled.output_encoder, "encoding_map", None) or {})
    chars = sorted({str(v) for v in values})
    long = [c for c in chars if len(c) != 1]
    if long:
        raise ConfigError(f"tracr values must be one character each to become tokens; got {long[:5]}")
    return "".join(chars)


def from_tracr(assembled: Any, output_label: str, name: str = "tracr", logit_scale: float = LOGIT_SCALE) -> GPT:
    """A native :class:`GPT` computing exactly what tracr's ``assembled`` model computes.

    Args:
        assembled: ``tracr.compiler.compiling.compile_rasp_to_model``'s result (categorical output).
        output_label: the label of the program's output SOp (``program.label``).
        name: the model's name in tables.
        logit_scale: what one unit of the output subspace is worth in logits.
    """
    cfg_t = assembled.model_config
    if assembled.output_encoder is None or not hasattr(assembled.output_encoder, "encoding_map"):
        raise ConfigError("from_tracr converts programs with a categorical output; this one is numerical")
    p = {k: {kk: _np(vv) for kk, vv in v.items()} for k, v in assembled.params.items()}
    labels = list(assembled.residual_labels)
    tok = Tokenizer.char_level(tracr_alphabet(assembled))
    D = p["token_embed"]["embeddings"].shape[1]
    d_mlp = p["transformer/layer_0/mlp/linear_1"]["w"].shape[1]
    cfg = ModelConfig(n_layers=cfg_t.num_layers, n_heads=cfg_t.num_heads, d_model=D,
                      n_ctx=p["pos_embed"]["embeddings"].shape[0], d_vocab=tok.d_vocab, d_head=cfg_t.key_size,
                      d_mlp=d_mlp, normalization="none", act_fn="relu", causal=bool(cfg_t.causal),
                      extra={"source": "tracr", "output": output_label})
    model = GPT(cfg, tok, name=name)
    state = {k: torch.zeros_like(v) for k, v in model.state_dict().items()}

    enc = assembled.input_encoder.encoding_map
    wte = state["transformer.wte.weight"]  # (d_vocab, D): ours by our ids, tracr's rows by its ids
    for value, tracr_id in enc.items():
        ours = tok.bos_token_id if value == assembled.input_encoder.bos_token else None
        if ours is None and str(value) in tok.alphabet:
            ours = tok.alphabet.index(str(value))
        if ours is not None:
            wte[ours] = torch.from_numpy(p["token_embed"]["embeddings"][tracr_id])
    state["transformer.wpe.weight"] = torch.from_numpy(p["pos_embed"]["embeddings"])  # (n_ctx, D)
    for i in range(cfg.n_layers):
        a, m, pre = f"transformer/layer_{i}/attn", f"transformer/layer_{i}/mlp", f"transformer.h.{i}"
        qkv = [p[f"{a}/{x}"] for x in ("query", "key", "value")]  # each w (D, H*d_head): columns (head, d_head)
        state[f"{pre}.attn.c_attn.weight"] = torch.from_numpy(np.concatenate([x["w"].T for x in qkv]))  # (3A, D)
        state[f"{pre}.attn.c_attn.bias"] = torch.from_numpy(np.concatenate([x["b"] for x in qkv]))  # (3A,)
        state[f"{pre}.attn.c_proj.weight"] = torch.from_numpy(p[f"{a}/linear"]["w"].T.copy())  # (D, A)
        state[f"{pre}.attn.c_proj.bias"] = torch.from_numpy(p[f"{a}/linear"]["b"])
        state[f"{pre}.mlp.c_fc.weight"] = torch.from_numpy(p[f"{m}/linear_1"]["w"].T.copy())  # (d_mlp, D)
        state[f"{pre}.mlp.c_fc.bias"] = torch.from_numpy(p[f"{m}/linear_1"]["b"])
        state[f"{pre}.mlp.c_proj.weight"] = torch.from_numpy(p[f"{m}/linear_2"]["w"].T.copy())  # (D, d_mlp)
        state[f"{pre}.mlp.c_proj.bias"] = torch.from_numpy(p[f"{m}/linear_2"]["b"])
    head = state["lm_head.weight"]  # (d_vocab, D)
    for value in assembled.output_encoder.encoding_map:
        where = f"{output_label}:{value}"
        if where not in labels:
            raise ConfigError(f"output direction {where!r} is not in the compiled residual stream")
        head[tok.alphabet.index(str(value)), labels.index(where)] = logit_scale
    model.load_state_dict(state)
    return model.eval()

