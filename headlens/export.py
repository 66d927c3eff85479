"""Export a native headlens GPT to a Hugging Face GPT-2 directory.

Why: the exported directory is a reference to diff against (``transformers``'
``GPT2LMHeadModel`` and TransformerLens' ``TransformerBridge`` load it offline) and lets users
take a headlens model anywhere GPT-2 goes.

Weights map 1:1 by name; HF GPT-2 stores ``Conv1D`` weights as ``(in, out)``, ours are
``nn.Linear`` ``(out, in)``, so every ``c_attn``/``c_proj``/``c_fc`` weight is transposed.

Three things HF GPT-2 cannot express directly, and what we do:

* **Attention-only** models: HF GPT-2 always has an MLP. We export one of width
  ``n_inner=ATTN_ONLY_D_MLP`` with every weight and bias zero, so it adds exactly 0.
* **No LayerNorm** (``normalization="none"``): HF GPT-2 always applies LayerNorm. We export
  ``layer_norm_epsilon=1e12`` and LN weight ``1e6`` (bias 0). In float32 ``var + 1e12 == 1e12``
  for any ``var < ~3e4`` and ``sqrt(1e12) == 1e6``, so ``LN(x) = x - mean(x)``. That equals the
  identity only when the residual stream has zero mean over d_model at every position, which holds
  when everything that writes into it (wte, wpe, the ``c_proj`` weight rows and biases of attention
  and MLP) is mean-centred over d_model. Export checks this and warns (``strict=True`` refuses).
* **Tokenizers**: byte-level models get a byte-level BPE tokenizer with no merges (id ``b`` is
  byte ``b`` in GPT-2's byte-to-unicode alphabet, BOS is ``<bos>`` = 256), so HF tokenizes
  exactly like headlens. Char-level models get a BPE tokenizer over their alphabet with no
  merges and no pre-tokenizer (id ``i`` is ``alphabet[i]``, BOS ``<bos>``; characters outside the
  alphabet map to BOS as ``unk``), decoded by plain concatenation.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import torch

from headlens.errors import HeadlensError, OutputError
from headlens.model import GPT
from headlens.tokenizer import Tokenizer

ATTN_ONLY_D_MLP = 4  # width of the all-zero MLP an attention-only model is exported with
NO_LN_EPS = 1e12  # with NO_LN_WEIGHT: LayerNorm(x) == x - mean(x) exactly in float32
NO_LN_WEIGHT = 1e6
BOS_TOKEN = "<bos>"
_CONV1D = (".attn.c_attn.weight", ".attn.c_proj.weight", ".mlp.c_fc.weight", ".mlp.c_proj.weight")


def residual_writes(model: GPT) -> dict[str, torch.Tensor]:
    """Every tensor that writes into the residual stream, as rows over d_model."""
    t = model.transformer
    writes = {"transformer.wte.weight": t.wte.weight, "transformer.wpe.weight": t.wpe.weight}
    for i, block in enumerate(t.h):
        subs = [("attn", block.attn)] + ([] if model.cfg.attn_only else [("mlp", block.mlp)])
        for kind, sub in subs:
            writes[f"transformer.h.{i}.{kind}.c_proj.weight"] = sub.c_proj.weight.T  # (in, d_model)
            writes[f"transformer.h.{i}.{kind}.c_proj.bias"] = sub.c_proj.bias[None]  # (1, d_model)
    return writes


def uncentred_writes(model: GPT, atol: float = 1e-6) -> dict[str, float]:
    """Residual writes whose rows do not average to 0 over d_model: name -> max |row mean|."""
    out = {}
    for name, w in residual_writes(model).items():
        worst = float(w.detach().float().mean(dim=-1).abs().max())
        if worst > atol:
            out[name] = worst
    return out


@torch.no_grad()
def centre_writes(model: GPT) -> GPT:
    """Mean-centre every residual write over d_model, in place (changes the function!).

    For building no-LayerNorm models whose HF export is exact; do not apply it to a trained model
    unless you mean to change it.
    """
    for w in residual_writes(model).values():
        w.sub_(w.mean(dim=-1, keepdim=True))
    return model


def hf_state_dict(model: GPT) -> dict[str, torch.Tensor]:
    """The model's weights under HF GPT-2 names and layouts (float32, contiguous, CPU)."""
    cfg = model.cfg
    out: dict[str, torch.Tensor] = {}
    for name, tensor in model.state_dict().items():
        if cfg.tie_embeddings and name == "lm_head.weight":
            continue  # HF ties lm_head to wte itself
        t = tensor.detach().to("cpu", torch.float32)
        out[name] = t.T if name.endswith(_CONV1D) else t  # Linear (out, in) -> Conv1D (in, out)
    for i in range(cfg.n_layers):
        prefix = f"transformer.h.{i}"
        if cfg.attn_only:
            d = cfg.d_model
            out[f"{prefix}.ln_2.weight"] = torch.ones(d)
            out[f"{prefix}.ln_2.bias"] = torch.zeros(d)
            out[f"{prefix}.mlp.c_fc.weight"] = torch.zeros(d, ATTN_ONLY_D_MLP)  # Conv1D (in, out)
            out[f"{prefix}.mlp.c_fc.bias"] = torch.zeros(ATTN_ONLY_D_MLP)
            out[f"{prefix}.mlp.c_proj.weight"] = torch.zeros(ATTN_ONLY_D_MLP, d)
            out[f"{prefix}.mlp.c_proj.bias"] = torch.zeros(d)
    if cfg.normalization == "none":
        lns = [f"transformer.h.{i}.ln_{j}" for i in range(cfg.n_layers) for j in (1, 2)] + ["transformer.ln_f"]
        for ln in lns:
            out[f"{ln}.weight"] = torch.full((cfg.d_model,), NO_LN_WEIGHT)
            out[f"{ln}.bias"] = torch.zeros(cfg.d_model)
    return {k: v.contiguous() for k, v in out.items()}


def hf_config(model: GPT) -> dict[str, Any]:
    """config.json for ``GPT2LMHeadModel`` with the model's shape."""
    cfg = model.cfg
    bos = model.tokenizer.bos_token_id
    return {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "vocab_size": cfg.d_vocab,
        "n_positions": cfg.n_ctx,
        "n_ctx": cfg.n_ctx,
        "n_embd": cfg.d_model,
        "n_layer": cfg.n_layers,
        "n_head": cfg.n_heads,
        "n_inner": ATTN_ONLY_D_MLP if cfg.attn_only else cfg.d_mlp,
        "activation_function": "gelu_new",
        "layer_norm_epsilon": NO_LN_EPS if cfg.normalization == "none" else cfg.layer_norm_eps,
        "resid_pdrop": 0.0,
        "embd_pdrop": 0.0,
        "attn_pdrop": 0.0,
        "summary_first_dropout": 0.0,
        "initializer_range": cfg.init_range,
        "scale_attn_weights": True,
        "tie_word_embeddings": cfg.tie_embeddings,
        "bos_token_id": bos,
        "eos_token_id": bos,
        "pad_token_id": bos,
        "torch_dtype": "float32",
        "headlens": {"config": cfg.to_dict(), "tokenizer": model.tokenizer.to_spec(), "name": model.name},
    }


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable unicode character map."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, [chr(c) for c in cs], strict=True))


def hf_tokenizer(tokenizer: Tokenizer, d_vocab: int) -> Any:
    """A ``tokenizers.Tokenizer`` that gives the same ids as the headlens one (BOS excluded)."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models, pre_tokenizers

    if tokenizer.kind == "byte":
        vocab = {ch: b for b, ch in _bytes_to_unicode().items()}
    else:
        vocab = {ch: i for i, ch in enumerate(tokenizer.alphabet)}
    vocab[BOS_TOKEN] = tokenizer.bos_token_id
    for extra in range(tokenizer.d_vocab, d_vocab):  # unused ids the config reserves
        vocab[f"<unused{extra}>"] = extra
    if tokenizer.kind == "byte":
        hf = HFTokenizer(models.BPE(vocab=vocab, merges=[]))
        hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
        hf.decoder = decoders.ByteLevel()
    else:
        hf = HFTokenizer(models.BPE(vocab=vocab, merges=[], unk_token=BOS_TOKEN))
        hf.decoder = decoders.Fuse()
    hf.add_special_tokens([BOS_TOKEN])
    return hf


def export_hf(model: GPT, out_dir: str | Path, strict: bool = False) -> Path:
    """Write ``model`` as a Hugging Face GPT-2 directory (config, safetensors weights, tokenizer).

    Args:
        model: a native headlens ``GPT``.
        out_dir: destination directory (created; existing files with the same names replaced).
        strict: refuse (instead of warn) a no-LayerNorm model whose residual writes are not
            mean-centred, i.e. whose export would not compute the same function.

    Returns:
        the directory, loadable with ``GPT2LMHeadModel.from_pretrained`` and
        ``TransformerBridge.boot_transformers``.

    >>> from headlens import GPT, ModelConfig
    >>> export_hf(GPT(ModelConfig(1, 2, 8, 16, 257)), "/tmp/hl-doctest-export").name  # doctest: +SKIP
    'hl-doctest-export'
    """
    if not isinstance(model, GPT):
        raise HeadlensError(f"export-hf needs a native headlens GPT, got {type(model).__name__}")
    if model.cfg.normalization == "none":
        bad = uncentred_writes(model)
        if bad:
            worst = max(bad, key=bad.get)
            msg = (
                f"model has no LayerNorm and {len(bad)} residual write(s) are not mean-centred over "
                f"d_model (worst {worst}: |row mean| {bad[worst]:.2e}); HF GPT-2 always applies "
                f"LayerNorm, exported as x - mean(x), so the export will not match exactly"
            )
            if strict:
                raise HeadlensError(msg)
            warnings.warn(msg, stacklevel=2)
    from safetensors.torch import save_file
    from transformers import PreTrainedTokenizerFast

    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise OutputError(f"cannot create export directory {str(out)!r}: {err}") from None
    (out / "config.json").write_text(json.dumps(hf_config(model), indent=2) + "\n")
    save_file(hf_state_dict(model), str(out / "model.safetensors"), metadata={"format": "pt"})
    fast = PreTrainedTokenizerFast(
        tokenizer_object=hf_tokenizer(model.tokenizer, model.cfg.d_vocab),
        bos_token=BOS_TOKEN, eos_token=BOS_TOKEN, pad_token=BOS_TOKEN, unk_token=BOS_TOKEN,
        model_max_length=model.cfg.n_ctx,
    )
    fast.save_pretrained(str(out))
    return out
