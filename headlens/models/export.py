"""Export a native headlens GPT to a Hugging Face GPT-2 directory.

Why: the exported directory is a reference to diff against (``transformers``'
``GPT2LMHeadModel`` and TransformerLens' ``TransformerBridge`` load it offline) and lets users
take a headlens model anywhere GPT-2 goes.

Weights map 1:1 by name; HF GPT-2 stores ``Conv1D`` weights as ``(in, out)``, ours are
``nn.Linear`` ``(out, in)``, so every ``c_attn``/``c_proj``/``c_fc`` weight is transposed.

Three things HF GPT-2 cannot express directly, and what we do:

* **Attention-only** models: HF GPT-2 always has an MLP. We export one of width
  ``n_inner=ATTN_ONLY_D_MLP`` with every weight and bias zero, so it adds exactly 0.
* **No LayerNorm** (``normalization="none"``): HF GPT-2 always applies LayerNorm,
  ``LN(x) = (x - mean(x)) / sqrt(var(x) + eps) * w + b``. Two steps make it the identity:

  1. *No mean to subtract.* The residual stream is exported in ``D' = d_model + n_heads``
     dimensions through an isometry ``P`` ``(D', d_model)`` (``P^T P = I``) whose columns are
     orthogonal to the all-ones vector (:func:`residual_embedding`, a Householder reflection). Every
     write into the residual (``wte``, ``wpe``, ``c_proj`` weights and biases) becomes ``P @ W``, every
     read (``c_attn``, ``c_fc``, ``lm_head``) ``W @ P^T``: the exported stream is ``P x`` wherever
     headlens' is ``x``, its mean over ``D'`` is 0, and reads see ``P^T P x = x``. A tied
     ``lm_head`` stays tied (``wte P^T`` is both).
  2. *No scale to divide by.* ``layer_norm_epsilon=1e12`` and LN weight ``1e6`` (bias 0): for any
     ``var < ~3e4`` float32 rounds ``var + 1e12`` to ``1e12``, so ``LN(y) = y / 1e6 * 1e6 = y`` up to
     one rounding. The normaliser is the variance over all ``D'`` dims, padding included, which is
     why the constant has to swamp it rather than match it.

  HF GPT-2 ties the head width to ``n_embd / n_head``, so each head grows from ``d_head`` to
  ``d_head + 1``: one q/k/v dimension with zero weights and bias (it adds 0 to every score and
  writes a zero ``z``), and W_Q, b_Q are multiplied by ``sqrt((d_head + 1) / d_head)`` so that the
  exported ``q.k / sqrt(d_head + 1)`` equals headlens' ``q.k / sqrt(d_head)``. The exported model's
  residual and ``hook_q/k/v/z`` hooks are therefore wider; its patterns, logits and per-head
  outputs are the same.
* **Tokenizers**: byte-level models get a byte-level BPE tokenizer with no merges (id ``b`` is
  byte ``b`` in GPT-2's byte-to-unicode alphabet, BOS is ``<bos>`` = 256), so HF tokenizes
  exactly like headlens. Char-level models get a BPE tokenizer over their alphabet with no
  merges and no pre-tokenizer (id ``i`` is ``alphabet[i]``, BOS ``<bos>``; characters outside the
  alphabet map to BOS as ``unk``), decoded by plain concatenation.

Every export is checked before anything is written: the HF model built from the exported
weights must give headlens' logits on a probe sequence (:data:`EXPORT_ATOL`); if it does not, the
export is refused with ``ExportError``, never written with a warning.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from headlens.errors import HeadlensError, OutputError
from headlens.models.gpt import GPT
from headlens.models.tokenizer import Tokenizer

ATTN_ONLY_D_MLP = 4  # width of the all-zero MLP an attention-only model is exported with
NO_LN_EPS = 1e12  # with NO_LN_WEIGHT: LayerNorm(y) == y in float32 when mean(y) == 0 and var(y) < ~3e4
NO_LN_WEIGHT = 1e6
EXPORT_ATOL = 1e-4  # the export check: max |logit diff| <= EXPORT_ATOL * max(1, max |logit|)
BOS_TOKEN = "<bos>"
_CONV1D = (".attn.c_attn.weight", ".attn.c_proj.weight", ".mlp.c_fc.weight", ".mlp.c_proj.weight")


def residual_embedding(d_model: int, d_out: int) -> torch.Tensor:
    """An isometry ``P`` ``(d_out, d_model)`` whose columns are orthogonal to the all-ones vector.

    The first ``d_model`` columns of the Householder reflection that swaps ``e_last`` and
    ``1 / sqrt(d_out)``: orthonormal, and orthogonal to the last column, which is ``1 / sqrt(d_out)``.

    >>> P = residual_embedding(3, 5)
    >>> bool(torch.allclose(P.T @ P, torch.eye(3, dtype=P.dtype))), float(P.sum(0).abs().max()) < 1e-12
    (True, True)
    """
    if d_out <= d_model:
        raise HeadlensError(f"residual_embedding needs d_out > d_model, got {d_out} <= {d_model}")
    u = torch.full((d_out,), -(d_out ** -0.5), dtype=torch.float64)
    u[-1] += 1.0  # u = e_last - 1/sqrt(d_out)
    reflection = torch.eye(d_out, dtype=torch.float64) - 2.0 * torch.outer(u, u) / (u @ u)  # (d_out, d_out)
    return reflection[:, :d_model]


def exported_width(model: GPT) -> int:
    """``n_embd`` of the export: d_model, or d_model + n_heads for a model without LayerNorm."""
    return model.cfg.d_model + (model.cfg.n_heads if model.cfg.normalization == "none" else 0)


def _pad_heads(w: torch.Tensor, n_heads: int, axis: int) -> torch.Tensor:
    """Insert one zero dimension after each head's ``d_head`` slice of ``w`` along ``axis``."""
    w = w.movedim(axis, 0)
    heads = w.reshape(n_heads, w.shape[0] // n_heads, *w.shape[1:])  # (H, d_head, ...): axis 0 is the head
    zero = heads.new_zeros(n_heads, 1, *w.shape[1:])
    return torch.cat([heads, zero], 1).reshape(-1, *w.shape[1:]).movedim(0, axis)  # (H * (d_head + 1), ...)


def _no_ln_state_dict(model: GPT) -> dict[str, torch.Tensor]:
    """Native-layout (``nn.Linear``) weights of the widened model (module docstring), float64."""
    cfg = model.cfg
    H, dh = cfg.n_heads, cfg.d_head
    P = residual_embedding(cfg.d_model, exported_width(model))  # (D', D)
    q_scale = ((dh + 1) / dh) ** 0.5  # keeps q.k / sqrt(d_head) with one more head dimension
    out: dict[str, torch.Tensor] = {}
    for name, t in model.state_dict().items():
        t = t.detach().to("cpu", torch.float64)
        if name in ("transformer.wte.weight", "transformer.wpe.weight", "lm_head.weight"):
            out[name] = t @ P.T  # rows over d_model -> over D'
        elif name.endswith("attn.c_attn.weight") or name.endswith("attn.c_attn.bias"):
            qkv = list(t.chunk(3, dim=0))  # 3 x (D, ...): q, k, v rows
            qkv[0] = qkv[0] * q_scale
            if t.ndim == 2:
                qkv = [w @ P.T for w in qkv]  # reads the embedded residual
            out[name] = torch.cat([_pad_heads(w, H, 0) for w in qkv])  # (3 D', ...)
        elif name.endswith("attn.c_proj.weight"):
            out[name] = _pad_heads(P @ t, H, 1)  # (D', D'): zero weight on each head's padding
        elif name.endswith("mlp.c_fc.weight"):
            out[name] = t @ P.T
        elif name.endswith("c_proj.bias") or name.endswith("mlp.c_proj.weight"):
            out[name] = P @ t  # writes into the embedded residual
        else:
            out[name] = t
    return out


def hf_state_dict(model: GPT) -> dict[str, torch.Tensor]:
    """The model's weights under HF GPT-2 names and layouts (float32, contiguous, CPU)."""
    cfg = model.cfg
    d = exported_width(model)
    native = _no_ln_state_dict(model) if cfg.normalization == "none" else model.state_dict()
    out: dict[str, torch.Tensor] = {}
    for name, tensor in native.items():
        if cfg.tie_embeddings and name == "lm_head.weight":
            continue  # HF ties lm_head to wte itself (wte P^T is both in the no-LN export)
        t = tensor.detach().to("cpu", torch.float32)
        out[name] = t.T if name.endswith(_CONV1D) else t  # Linear (out, in) -> Conv1D (in, out)
    for i in range(cfg.n_layers):
        prefix = f"transformer.h.{i}"
        if cfg.attn_only:
            out[f"{prefix}.ln_2.weight"] = torch.ones(d)
            out[f"{prefix}.ln_2.bias"] = torch.zeros(d)
            out[f"{prefix}.mlp.c_fc.weight"] = torch.zeros(d, ATTN_ONLY_D_MLP)  # Conv1D (in, out)
            out[f"{prefix}.mlp.c_fc.bias"] = torch.zeros(ATTN_ONLY_D_MLP)
            out[f"{prefix}.mlp.c_proj.weight"] = torch.zeros(ATTN_ONLY_D_MLP, d)
            out[f"{prefix}.mlp.c_proj.bias"] = torch.zeros(d)
    if cfg.normalization == "none":
        lns = [f"transformer.h.{i}.ln_{j}" for i in range(cfg.n_layers) for j in (1, 2)] + ["transformer.ln_f"]
        for ln in lns:
            out[f"{ln}.weight"] = torch.full((d,), NO_LN_WEIGHT)
            out[f"{ln}.bias"] = torch.zeros(d)
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
        "n_embd": exported_width(model),
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
        "headlens": {"config": cfg.to_dict(), "tokenizer": model.tokenizer.to_spec(), "name": model.name,
                     "residual": "identity" if cfg.normalization == "LN" else "householder d_model+n_heads"},
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


def _probe_tokens(model: GPT, n_tokens: int = 32) -> torch.Tensor:
    """Two fixed random token sequences, BOS first, ``(2, min(n_ctx, n_tokens))``."""
    gen = torch.Generator().manual_seed(0)
    T = min(model.cfg.n_ctx, n_tokens)
    tokens = torch.randint(0, model.tokenizer.d_vocab, (2, T), generator=gen)  # (2, T)
    tokens[:, 0] = model.bos_token_id
    return tokens


@torch.no_grad()
def check_export(model: GPT, config: dict[str, Any], state: dict[str, torch.Tensor]) -> float:
    """Max |logit diff| of ``GPT2LMHeadModel(config, state)`` vs ``model`` on a fixed probe.

    Raises ``HeadlensError`` when it exceeds ``EXPORT_ATOL * max(1, max |logit|)``: an export that
    would not compute the same function is refused, never written.
    """
    from transformers import GPT2Config, GPT2LMHeadModel

    hf_cfg = GPT2Config(**{k: v for k, v in config.items() if k != "headlens"})
    hf = GPT2LMHeadModel._from_config(hf_cfg, attn_implementation="eager").eval()
    missing, unexpected = hf.load_state_dict(state, strict=False)
    if unexpected or set(missing) - ({"lm_head.weight"} if model.cfg.tie_embeddings else set()):
        raise HeadlensError(f"export of {model.name!r} does not fit GPT-2: missing {missing}, unexpected {unexpected}")
    tokens = _probe_tokens(model)
    ref = model(tokens.to(model.device)).float().cpu()  # (2, T, d_vocab)
    diff = float((hf(tokens, attention_mask=torch.ones_like(tokens)).logits - ref).abs().max())
    tol = EXPORT_ATOL * max(1.0, float(ref.abs().max()))
    if not diff <= tol:
        raise HeadlensError(f"export of {model.name!r} is not exact (max |logit diff| {diff:.2e} > {tol:.1e} on a "
                            f"probe); refusing to write it")
    return diff


def export_hf(model: GPT, out_dir: str | Path) -> Path:
    """Write ``model`` as a Hugging Face GPT-2 directory (config, safetensors weights, tokenizer).

    The export computes the same function as ``model`` (module docstring: no-LayerNorm models are
    exported in a wider residual stream); :func:`check_export` verifies it on a probe before
    anything is written and refuses an export that is not exact.

    Args:
        model: a native headlens ``GPT``.
        out_dir: destination directory (created; existing files with the same names replaced).

    Returns:
        the directory, loadable with ``GPT2LMHeadModel.from_pretrained`` and
        ``TransformerBridge.boot_transformers``.

    >>> from headlens import GPT, ModelConfig
    >>> export_hf(GPT(ModelConfig(1, 2, 8, 16, 257)), "/tmp/hl-doctest-export").name  # doctest: +SKIP
    'hl-doctest-export'
    """
    if not isinstance(model, GPT):
        raise HeadlensError(f"export-hf needs a native headlens GPT, got {type(model).__name__}")
    cfg = model.cfg
    unlike = [what for what, odd in (("d_head != d_model / n_heads", cfg.d_attn != cfg.d_model),
                                     ("ReLU MLPs", cfg.act_fn != "gelu_new"), ("bidirectional attention", not cfg.causal))
              if odd]
    if unlike:
        raise HeadlensError(f"export-hf writes GPT-2, which has no {', '.join(unlike)}; {model.name!r} has them "
                            f"(a compiled tracr model?): keep it as a headlens .safetensors instead")
    from safetensors.torch import save_file
    from transformers import PreTrainedTokenizerFast

    config, state = hf_config(model), hf_state_dict(model)
    was_training = model.training
    try:
        check_export(model.eval(), config, state)
    finally:
        model.train(was_training)
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise OutputError(f"cannot create export directory {str(out)!r}: {err}") from None
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    fast = PreTrainedTokenizerFast(
        tokenizer_object=hf_tokenizer(model.tokenizer, model.cfg.d_vocab),
        bos_token=BOS_TOKEN, eos_token=BOS_TOKEN, pad_token=BOS_TOKEN, unk_token=BOS_TOKEN,
        model_max_length=model.cfg.n_ctx,
    )
    fast.save_pretrained(str(out))
    return out
