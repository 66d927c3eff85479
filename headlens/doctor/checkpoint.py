"""``check_checkpoint``: which head count were these weights trained with, whatever the config says?

Why: a head layout is invisible in weight shapes (a 768 x 768 projection is the same tensor
for 12 heads or 16), so a config that lies loads without complaint and computes garbage.
The weights themselves know, though: split into the head count they were trained with, the
model predicts its own kind of text well; split any other way, each "head" mixes slices of
several trained heads and the loss is much worse. So the doctor loads the weights under every
divisor of ``d_model`` (its own loader: ``load_checkpoint`` rightly refuses a config that
disagrees with the header) and measures the loss of each on text the model can tokenize.

Where the weight shapes fix the layout (per-head q/k norms, per-head parameters), they decide before any model
is built (:mod:`headlens.doctor.shapes`): a GGUF file is then not even converted.

Hugging Face directories of other families (Llama, Mistral, Qwen2, Gemma, GPT-NeoX ...) go through
:mod:`headlens.doctor.family_check`: the same loss comparison over every (query heads, key/value heads,
head width) layout their weight shapes allow, built by ``transformers`` itself. A GGUF file (``smollm2``,
``gguf:PATH``, ``*.gguf``) is checked as the directory transformers dequantizes it into (cached).

Evaluation sources (:mod:`headlens.doctor.sources`; :mod:`headlens.doctor.verdict` weighs them): a text,
the user's or else the zoo recipe's own data when the checkpoint names one in its metadata, or Python
standard-library source for byte-level models; and periodic random segments of distinct symbols at several
periods (any model with an induction circuit predicts the copies). The layouts race on them
(:mod:`headlens.doctor.racing`): one clearly worse after 8 rows stops running.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from headlens.doctor.bugs import divisors
from headlens.doctor.racing import Tally, race_sources
from headlens.doctor.report import CheckpointReport
from headlens.doctor.sources import EvalSource, evaluation_size, periodic_sources, stdlib_text
from headlens.doctor.verdict import (
    choose,
    head_count_warnings,
    source_reports,
    source_warnings,
    weigh_source,
)
from headlens.errors import CheckpointError, ConfigError, HeadlensError
from headlens.models.checkpoint import FORMAT, check_finite, read_header
from headlens.models.config import ModelConfig
from headlens.models.gpt import GPT
from headlens.models.tokenizer import Tokenizer

_CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")


@dataclass
class Weights:
    """A checkpoint's tensors under headlens names, with the config and tokenizer it claims."""

    tensors: dict[str, torch.Tensor]
    config: ModelConfig
    tokenizer: Tokenizer | None
    format: str  # "headlens" | "huggingface"
    metadata: dict[str, Any] = field(default_factory=dict)


def _read_headlens(path: Path) -> Weights:
    from safetensors.torch import load_file

    header = read_header(path)
    if header.get("format") != FORMAT or "config" not in header:
        raise CheckpointError(f"{str(path)!r} is a safetensors file but not a headlens checkpoint")
    try:
        cfg = ModelConfig.from_json(header["config"])
        tensors = load_file(str(path))
    except ConfigError as err:
        raise CheckpointError(f"checkpoint {str(path)!r} has an invalid config: {err}") from None
    except Exception as err:
        raise CheckpointError(f"checkpoint {str(path)!r} is corrupt or truncated ({err})") from None
    try:
        tok = Tokenizer.from_spec(json.loads(header.get("tokenizer", '{"kind": "byte"}')))
        meta = json.loads(header.get("metadata", "{}"))
    except (ValueError, KeyError, TypeError, HeadlensError) as err:  # JSONDecodeError and ProbeError included
        raise CheckpointError(f"checkpoint {str(path)!r} has an invalid tokenizer or metadata ({err})") from None
    check_finite(path, tensors.items())
    return Weights({k: v.float() for k, v in tensors.items()}, cfg, tok, "headlens", meta)


def _hf_tensors(d: Path) -> dict[str, torch.Tensor]:
    if (d / "model.safetensors").is_file():
        from safetensors.torch import load_file

        return load_file(str(d / "model.safetensors"))
    if (d / "pytorch_model.bin").is_file():
        return torch.load(d / "pytorch_model.bin", map_location="cpu", weights_only=True)
    raise CheckpointError(f"{str(d)!r} has a config.json but no model.safetensors or pytorch_model.bin")


def _read_hf(d: Path) -> Weights:
    try:
        hf = json.loads((d / "config.json").read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise CheckpointError(f"cannot read {str(d / 'config.json')!r}: {err}") from None
    if hf.get("model_type", "gpt2") != "gpt2":
        raise CheckpointError(f"{str(d)!r} has model_type={hf['model_type']!r}; read it with headlens.doctor.families")
    raw = _hf_tensors(d)
    tensors = {}
    for key, t in raw.items():
        if key.endswith((".attn.bias", ".attn.masked_bias")):
            continue  # causal-mask buffers of older GPT-2 checkpoints
        name = key if key.startswith(("transformer.", "lm_head.")) else f"transformer.{key}"
        tensors[name] = (t.T if name.endswith(_CONV1D) else t).float().contiguous()  # Conv1D (in, out) -> (out, in)
    tied = "lm_head.weight" not in tensors
    try:
        cfg = ModelConfig(
            n_layers=hf["n_layer"], n_heads=hf["n_head"], d_model=hf["n_embd"], n_ctx=hf["n_positions"],
            d_vocab=hf["vocab_size"], d_mlp=hf.get("n_inner") or 0,
            layer_norm_eps=hf.get("layer_norm_epsilon", 1e-5), tie_embeddings=tied,
        )
    except (KeyError, ConfigError) as err:
        raise CheckpointError(f"{str(d / 'config.json')!r} is not a usable GPT-2 config: {err}") from None
    exported = hf.get("headlens") or {}  # set by `headlens export-hf`: the native model's tokenizer and name
    spec = exported.get("tokenizer")
    # an exported zoo model is judged on its own recipe's data, as its .safetensors original is
    meta = {"recipe": exported["name"]} if isinstance(exported.get("name"), str) else {}
    return Weights(tensors, cfg, Tokenizer.from_spec(spec) if spec else None, "huggingface", meta)


def read_weights(path: str | Path) -> Weights:
    """Read a headlens ``.safetensors`` checkpoint or a Hugging Face GPT-2 directory, trusting nothing."""
    path = Path(path).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise CheckpointError(f"{str(path)!r} is a directory without config.json")
        return _read_hf(path)
    return _read_headlens(path)


def model_with_heads(w: Weights, n_heads: int) -> GPT:
    """The checkpoint's weights in a GPT whose attention is split into ``n_heads`` heads."""
    cfg = replace(w.config, n_heads=n_heads, d_head=0, extra={})
    tok = w.tokenizer
    if tok is None or tok.d_vocab > cfg.d_vocab:  # ids are fed directly; the tokenizer only labels them
        tok = Tokenizer.char_level("".join(chr(0x4E00 + i) for i in range(cfg.d_vocab - 1)))
    model = GPT(cfg, tokenizer=tok)
    missing, unexpected = model.load_state_dict(w.tensors, strict=False)
    missing = [k for k in missing if not (cfg.tie_embeddings and k == "lm_head.weight")]
    if missing or unexpected:
        raise CheckpointError(f"weights do not fit a GPT of this config: missing {missing[:4]}, "
                              f"unexpected {unexpected[:4]}")
    return model.eval()



def default_text(w: Weights, n_rows: int = 48, T: int = 512, seed: int = 0) -> EvalSource | None:
    """``(n_rows, T)`` token ids (BOS first) of text the model should predict well; None when the checkpoint
    names no such text (a char-level model outside the zoo recipes).

    Rows are as long as the context allows (up to ``T``): the longer the context, the more the loss depends
    on attention, so the clearer the head-count evidence.
    """
    T = min(T, w.config.n_ctx)
    tok = w.tokenizer
    recipe = w.metadata.get("recipe")
    if recipe in ("induction-2l", "dyck") and tok is not None:
        from headlens.training.recipes import get_recipe

        r = get_recipe(recipe)
        if r.tokenizer == tok:
            gen = torch.Generator().manual_seed(seed)
            return EvalSource("text", [r.sampler()(gen, n_rows)[:, :T]],
                              f"zoo recipe {recipe!r} data ({n_rows} x {T} tokens)")
    if tok is not None and tok.kind == "byte":
        ids = tok.encode(stdlib_text(n_rows * T, seed))
        rows = torch.tensor(ids[: n_rows * (T - 1)]).view(n_rows, T - 1)  # (N, T - 1)
        bos = torch.full((n_rows, 1), tok.bos_token_id)
        return EvalSource("text", [torch.cat([bos, rows], dim=1)], f"Python stdlib source ({n_rows} x {T} bytes)")
    return None


def random_sources(w: Weights, n_rows: int = 48, T: int = 512, seed: int = 0) -> list[EvalSource]:
    """The model-agnostic sources: periodic random segments of distinct symbols, at several periods
    (:func:`headlens.doctor.sources.periodic_sources`). Any model with a copying (induction) mechanism
    predicts the copies; a wrong head split breaks it."""
    tok = w.tokenizer
    ids = torch.arange(tok.n_symbols if tok is not None else w.config.d_vocab)
    return periodic_sources(ids, n_rows, min(T, w.config.n_ctx), tok.bos_token_id if tok is not None else None, seed)


def evaluation_sources(w: Weights, n_rows: int, T: int, seed: int, texts: list[str] | None) -> list[EvalSource]:
    """The text (the user's, else :func:`default_text`) and the random-token sources."""
    out = []
    if texts is not None:
        rows = text_tokens(w, texts)
        out.append(EvalSource("text", rows, f"the given text ({sum(r.shape[0] for r in rows)} rows, "
                                            f"{sum(r.numel() for r in rows)} tokens)"))
    elif (text := default_text(w, n_rows, T, seed)) is not None:
        out.append(text)
    return [*out, *random_sources(w, n_rows, T, seed)]


def text_tokens(w: Weights, texts: list[str]) -> list[torch.Tensor]:
    """The non-empty texts as token rows (BOS first, truncated to n_ctx), stacked by length: ``[(N_i, T_i)]``."""
    if w.tokenizer is None:
        raise CheckpointError("this checkpoint carries no tokenizer the doctor can read; cannot tokenize --text")
    by_length: dict[int, list[list[int]]] = {}
    for text in texts:
        if text.strip():
            ids = [w.tokenizer.bos_token_id, *w.tokenizer.encode(text)][: w.config.n_ctx]
            by_length.setdefault(len(ids), []).append(ids)
    rows = [torch.tensor(group) for length, group in sorted(by_length.items()) if length >= 2]
    if not rows:
        raise CheckpointError("the evaluation text is empty: give at least one line of text")
    return rows


@torch.inference_mode()
def model_losses(model: GPT, rows: list[torch.Tensor]) -> torch.Tensor:
    """Mean next-token cross-entropy (nats) of each evaluation row."""
    out = []
    for tokens in rows:  # (N, T) each
        logits = model(tokens[:, :-1])  # (N, T - 1, V)
        ce = F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten(), reduction="none")
        out.append(ce.view(tokens.shape[0], -1).double().mean(dim=1))  # (N,)
    return torch.cat(out)


def row_losses(w: Weights, n_heads: int, rows: list[torch.Tensor]) -> torch.Tensor:
    """Mean next-token cross-entropy (nats) of each evaluation row, weights split into ``n_heads`` heads."""
    return model_losses(model_with_heads(w, n_heads), rows)


def loss_with_heads(w: Weights, n_heads: int, rows: list[torch.Tensor]) -> float:
    """Mean next-token cross-entropy (nats, token-weighted) with the weights split into ``n_heads`` heads."""
    per_row = row_losses(w, n_heads, rows)
    lengths = torch.cat([torch.full((r.shape[0],), r.shape[1] - 1, dtype=torch.float64) for r in rows])
    return float((per_row * lengths).sum() / lengths.sum())


def _evaluator(w: Weights, keep: int, n_layouts: int, on_run: Callable[[int, int], None] | None
               ) -> Callable[[int, list[torch.Tensor]], torch.Tensor]:
    """``evaluate(n_heads, rows)`` for the race: the claimed split's GPT kept and one other at a time (every
    split kept for small models, as :class:`headlens.doctor.families.Builder` does)."""
    from headlens.doctor.families import CACHE_PARAMS

    models: dict[int, GPT] = {}
    keep_all = sum(t.numel() for t in w.tensors.values()) * n_layouts <= CACHE_PARAMS

    def evaluate(h: int, rows: list[torch.Tensor]) -> torch.Tensor:
        if h not in models:
            models[h] = model_with_heads(w, h)
            for k in [k for k in models if k not in (h, keep) and not keep_all]:
                del models[k]
        losses = model_losses(models[h], rows)
        if on_run is not None:
            on_run(h, sum(r.numel() for r in rows))
        return losses

    return evaluate


def gguf_file(path: str | Path) -> Path | None:
    """The GGUF file ``path`` names (``smollm2``, ``gguf:PATH``, ``*.gguf``), else None."""
    ref = str(path)
    if Path(ref).expanduser().exists() and not ref.lower().endswith(".gguf"):
        return None  # a checkpoint or directory on disk, whatever its name
    from headlens.models.hf.gguf import parse_reference

    return parse_reference(ref)


def check_checkpoint(
    path: str | Path,
    n_heads: int | None = None,
    candidates: list[int] | None = None,
    margin: float | None = None,
    z_min: float = 3.0,
    n_rows: int | None = None,
    seq_len: int | None = None,
    seed: int = 0,
    texts: list[str] | None = None,
    progress: Callable[[int, int, str], None] | None = None,
    all_sources: bool = False,
) -> CheckpointReport:
    """Infer the head count ``path``'s weights were trained with and compare it with the claim.

    Args:
        path: a headlens ``.safetensors`` checkpoint, a Hugging Face directory (GPT-2, or any causal-LM
            family ``transformers`` builds: Llama, Mistral, Qwen2, Gemma, GPT-NeoX ...; the layout checked is
            then query heads, key/value heads and head width), or a GGUF file (``x.gguf``, ``gguf:PATH``,
            ``smollm2``: the Hugging Face directory transformers dequantizes it into, cached, is checked).
        n_heads: the head count you intend to use; defaults to what the checkpoint's config says.
        candidates: head counts to try (default: every divisor of d_model).
        margin: loss gap in nats below which a head count other than the claimed one is not
            considered better (weights nearly indifferent to the split). Default 0.01 for GPT-2
            checkpoints and ``FAMILY_MARGIN`` (0.1) for other families, whose random-weight
            splits differ by up to ~0.03 nats (a trained model's wrong split costs ~1 nat).
        z_min: a better head count must also beat the claimed one by this many standard errors
            of the per-row loss gap (so a gap the evaluation text cannot resolve is not a finding).
        n_rows: evaluation rows per source (default: sized to the model, 48 for small ones, 16 for a
            135M-parameter LM; :func:`headlens.doctor.sources.evaluation_size`).
        seq_len: tokens per evaluation row (capped at n_ctx; default sized like ``n_rows``: 512 for small
            models, 64 for a 135M-parameter LM). Longer rows give clearer evidence and cost more.
        seed: seed of the evaluation text.
        texts: your own evaluation text, one row per string (best for char-level models that no
            zoo recipe describes: the default random segments only help models that copy).
        progress: called as ``progress(tokens_run, upper_bound, what)`` while layouts run (the bound: the tokens
            run plus those the layouts still running have left on the current source).
        all_sources: run every source, even after one that fits the model has decided (by default the
            sources after it are not run, and the report names them).

    Returns:
        A :class:`CheckpointReport` with every evaluation source's losses (the text, then random token ids
        repeated at several periods). Its ``verdict`` is ``"passed"`` when a source that fits the model
        finds the claimed head count the only one that works, ``"failed"`` when it finds another clearly
        better, and ``"inconclusive"`` when no source separates the head counts (``passed`` is then False).
        Layouts clearly worse after 8 rows stop running (:mod:`headlens.doctor.racing`).

    >>> report = check_checkpoint("model.safetensors")  # doctest: +SKIP
    >>> report.inferred_n_heads, report.passed  # doctest: +SKIP
    (4, True)
    """
    t0 = time.perf_counter()
    kw = dict(n_heads=n_heads, candidates=candidates, margin=margin, z_min=z_min, n_rows=n_rows, seq_len=seq_len,
              seed=seed, texts=texts, progress=progress, all_sources=all_sources)
    if (gguf := gguf_file(path)) is not None:
        from headlens.doctor.gguf_check import check_gguf

        return check_gguf(gguf, kw)
    if Path(path).expanduser().is_dir() and _model_type(Path(path).expanduser()) != "gpt2":
        from headlens.doctor.families import FAMILY_MARGIN
        from headlens.doctor.family_check import check_family

        return check_family(Path(path).expanduser(), n_heads, candidates, FAMILY_MARGIN if margin is None else margin,
                            z_min, n_rows, seq_len, seed, texts, t0, progress, all_sources)
    margin = 0.01 if margin is None else margin
    w = read_weights(path)
    d_model, config_heads = w.config.d_model, w.config.n_heads
    claimed = config_heads if n_heads is None else n_heads
    if claimed <= 0 or d_model % claimed:
        raise ConfigError(f"n_heads={claimed} does not divide d_model={d_model} "
                          f"(divisors: {divisors(d_model)})")
    heads = sorted(set(candidates or divisors(d_model)) | {claimed, config_heads})
    rows, T = evaluation_size(sum(t.numel() for t in w.tensors.values()), w.config.n_ctx, n_rows, seq_len)
    named = evaluation_sources(w, rows, T, seed, texts)
    tally = Tally(progress, lambda h: f"n_heads={h}")
    n_vocab = w.tokenizer.n_symbols if w.tokenizer is not None else w.config.d_vocab
    sources, skipped = race_sources(
        _evaluator(w, claimed, len(heads), tally), heads, named, claimed, margin, z_min,
        lambda src, per_row, note: weigh_source(src.name, src.description, per_row, src.rows, claimed, margin, z_min,
                                                n_vocab, note=note, chance=src.chance), all_sources, tally)
    chosen, verdict = choose(sources)
    v = chosen.verdict
    if verdict == "passed" and claimed != config_heads:
        verdict = "failed"  # the weights agree with --n-heads, so the config is wrong
    warnings = source_warnings(sources, verdict)
    if verdict != "inconclusive":
        warnings = head_count_warnings(v, config_heads, n_heads, said=f"n_heads={config_heads}",
                                       best=f"split into {v.inferred} heads", trained=f"with {v.inferred}") + warnings
    reports = source_reports(sources, chosen, lambda h: d_model // h)
    return CheckpointReport(
        path=str(path), format=w.format, passed=verdict == "passed",
        config_n_heads=config_heads, claimed_n_heads=claimed, inferred_n_heads=v.inferred,
        plausible_n_heads=v.plausible, d_model=d_model,
        evaluation=chosen.description, margin=margin, evidence=next(r for r in reports if r.used).evidence,
        warnings=warnings, seconds=time.perf_counter() - t0, verdict=verdict, sources=reports,
        skipped_sources=skipped,
    )


def _model_type(d: Path) -> str:
    try:
        return str(json.loads((d / "config.json").read_text()).get("model_type", "gpt2"))
    except (OSError, json.JSONDecodeError):
        return "gpt2"  # the GPT-2 reader reports the unreadable config
