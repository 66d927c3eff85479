"""Head-count inference for Hugging Face causal LMs of every family (Llama, Mistral, Qwen2, Gemma, GPT-NeoX ...).

Why it works like the GPT-2 check (:mod:`headlens.doctor.checkpoint`): the weights fix only the
widths of the attention projections, ``Q = n_heads * head_dim`` (query rows, output columns) and
``KV = n_kv_heads * head_dim`` (key and value rows). Any layout ``(n_heads, n_kv_heads, head_dim)``
with the same two products loads in ``transformers`` without a shape error: a Llama trained as
(4, 2, 16) at d_model 64 loads as (2, 1, 32) and computes garbage. The weights still know their
layout, though: rebuilt with the layout they were trained with, the model predicts text it has
learnt; split any other way, each "head" mixes slices of several trained heads and RoPE rotates
the wrong pairs of dimensions, and the loss is much worse. So the doctor asks ``transformers``
itself to build the model under every layout the weight shapes allow (:func:`candidate_layouts`),
loads the weights into each, and compares their losses on the same evaluation text.

Layouts: ``head_dim`` runs over the common divisors of ``Q`` and ``KV`` (even ones only when the
family rotates with RoPE), ``n_heads = Q / head_dim``, ``n_kv_heads = KV / head_dim``; families
whose config has no ``head_dim`` (GPT-NeoX, Qwen2 ...) tie it to ``d_model / n_heads``, so only
those layouts are tried. A layout ``transformers`` refuses to build, load or run (GPT-J's fixed
``rotary_dim`` wider than the head) is not a candidate.

Evaluation sources (:mod:`headlens.doctor.verdict` weighs them): a text, the user's (``texts``, tokenized
with the directory's tokenizer) or else Python standard-library source, checked against the model before
it counts (a word-level tokenizer makes Python source the unknown token almost everywhere); and always
repeated random token segments ``BOS r r`` over the non-special vocabulary (any model with an induction
circuit predicts the second copy).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from headlens.errors import CheckpointError

ROPE_TYPES = ("llama", "mistral", "qwen2", "gemma", "gemma2", "gpt_neox", "phi3", "gptj", "mixtral", "qwen2_moe",
              "olmo", "stablelm", "cohere", "starcoder2", "granite")  # rotary families: head_dim must be even
FAMILY_MARGIN = 0.1  # nats; random-weight Llamas' splits differ by up to ~0.03, a trained model's wrong split by ~1
ENCODER_TYPES = ("bert", "roberta", "distilbert", "albert", "electra", "deberta", "deberta-v2", "xlm-roberta")


@dataclass(frozen=True)
class HeadLayout:
    """How the attention widths are split: query heads, key/value heads, width of each."""

    n_heads: int
    n_kv_heads: int
    d_head: int

    def __str__(self) -> str:
        return f"n_heads={self.n_heads}, n_kv_heads={self.n_kv_heads}, head_dim={self.d_head}"


def read_config(model_dir: Path) -> Any:
    """The directory's ``transformers`` config, never running repository code."""
    from transformers import AutoConfig

    try:
        raw = json.loads((model_dir / "config.json").read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise CheckpointError(f"cannot read {str(model_dir / 'config.json')!r}: {err}") from None
    if raw.get("model_type") in ENCODER_TYPES:
        raise CheckpointError(f"the doctor checks causal language models; {str(model_dir)!r} is a "
                              f"{raw['model_type']!r} encoder (masked LM), which it cannot score")
    try:
        return AutoConfig.from_pretrained(str(model_dir), trust_remote_code=False, local_files_only=True)
    except Exception as err:  # unknown model_type, remote code, malformed fields
        raise CheckpointError(f"transformers cannot read {str(model_dir / 'config.json')!r}: "
                              f"{str(err).splitlines()[0]}") from None


def _has_head_dim(cfg: Any) -> bool:
    return getattr(cfg, "head_dim", None) is not None


def claimed_layout(cfg: Any, n_heads: int | None = None) -> HeadLayout:
    """The layout the config states (or ``n_heads`` query heads at the config's widths)."""
    H = int(cfg.num_attention_heads)
    H_kv = int(getattr(cfg, "num_key_value_heads", None) or getattr(cfg, "num_kv_heads", None)
               or (1 if getattr(cfg, "multi_query", False) else H))
    dh = int(cfg.head_dim) if _has_head_dim(cfg) else int(cfg.hidden_size) // H
    if n_heads is None or n_heads == H:
        return HeadLayout(H, H_kv, dh)
    q, kv = H * dh, H_kv * dh
    if n_heads <= 0 or q % n_heads or kv % (q // n_heads):
        from headlens.errors import ConfigError

        raise ConfigError(f"n_heads={n_heads} does not split the query width {q} and key/value width {kv} "
                          f"into equal heads")
    return HeadLayout(n_heads, kv // (q // n_heads), q // n_heads)


def candidate_layouts(cfg: Any, claimed: HeadLayout) -> list[HeadLayout]:
    """Every layout with the claimed projection widths, fewest query heads first."""
    q, kv = claimed.n_heads * claimed.d_head, claimed.n_kv_heads * claimed.d_head
    rope = cfg.model_type in ROPE_TYPES
    out = []
    for dh in range(math.gcd(q, kv), 0, -1):
        if q % dh or kv % dh or (rope and dh % 2) or (q // dh) % (kv // dh):
            continue
        if not _has_head_dim(cfg) and dh * (q // dh) != cfg.hidden_size:
            continue  # head_dim is hidden_size / n_heads in this family
        out.append(HeadLayout(q // dh, kv // dh, dh))
    if claimed not in out:
        out.append(claimed)
    return sorted(out, key=lambda layout: layout.n_heads)


def build(model_dir: Path, cfg: Any, layout: HeadLayout) -> Any | None:
    """The directory's weights loaded by ``transformers`` into the model rebuilt with ``layout``
    (float32, eval, its own key renames and tying), or None when this layout cannot hold them."""
    import transformers
    from transformers import AutoModelForCausalLM

    transformers.utils.logging.disable_progress_bar()
    c = cfg.__class__.from_dict(cfg.to_dict())
    c.num_attention_heads = layout.n_heads
    if hasattr(c, "num_key_value_heads"):
        c.num_key_value_heads = layout.n_kv_heads
    if _has_head_dim(c):
        c.head_dim = layout.d_head
    try:
        model, info = AutoModelForCausalLM.from_pretrained(
            str(model_dir), config=c, attn_implementation="eager", dtype=torch.float32, local_files_only=True,
            trust_remote_code=False, output_loading_info=True)
    except (RuntimeError, ValueError, OSError):  # size mismatch, or a layout the family refuses
        return None
    if info.get("missing_keys") or info.get("unexpected_keys") or info.get("mismatched_keys"):
        return None
    return model.eval()


def _n_ctx(cfg: Any) -> int:
    return int(getattr(cfg, "max_position_embeddings", None) or getattr(cfg, "n_positions", None) or 2048)


def text_rows(model_dir: Path, cfg: Any, n_rows: int, seq_len: int, seed: int, texts: list[str] | None
              ) -> tuple[list[torch.Tensor], str, Any] | None:
    """The text source: rows ``[(N_i, T_i)]``, what they are, and the tokenizer; the user's ``texts``, else
    Python standard-library source; None when the directory has no tokenizer (see the module docstring)."""
    n_ctx = _n_ctx(cfg)
    bos = getattr(cfg, "bos_token_id", None)
    if texts is not None:
        tok = _tokenizer(model_dir)
        rows = [tok(t)["input_ids"] for t in texts if t.strip()]
        if bos is not None:  # every source starts at BOS, as the model was trained (when the tokenizer adds none)
            rows = [r if r[:1] == [bos] else [bos, *r] for r in rows]
        rows = [r[:n_ctx] for r in rows]
        rows = [r for r in rows if len(r) >= 2]
        if not rows:
            raise CheckpointError("the evaluation text is empty: give at least one line of text")
        by_len: dict[int, list[list[int]]] = {}
        for r in rows:
            by_len.setdefault(len(r), []).append(r)
        stacked = [torch.tensor(group) for _, group in sorted(by_len.items())]
        return stacked, f"the given text ({len(rows)} rows, {sum(map(len, rows))} tokens)", tok
    T = min(seq_len, n_ctx)
    tok = _tokenizer(model_dir, required=False)
    if tok is None:
        return None
    from headlens.doctor.verdict import stdlib_text

    tok.model_max_length = 1 << 30  # one long text, cut into rows below (no length warning)
    ids = tok(stdlib_text(n_rows * T * 2, seed), add_special_tokens=False)["input_ids"]
    n = min(n_rows, len(ids) // (T - 1))
    body = torch.tensor(ids[: n * (T - 1)]).view(n, T - 1)  # (N, T - 1)
    first = torch.full((n, 1), int(bos) if bos is not None else int(ids[0]))
    return [torch.cat([first, body], 1)], f"Python stdlib source ({n} x {T} tokens)", tok


def random_rows(cfg: Any, n_rows: int, seq_len: int, seed: int, tok: Any = None) -> tuple[list[torch.Tensor], str]:
    """The model-agnostic source: rows ``[BOS] r r`` of random non-special token ids, each sequence repeated."""
    T = min(seq_len, _n_ctx(cfg))
    bos = getattr(cfg, "bos_token_id", None)
    special = {i for i in (bos, getattr(cfg, "eos_token_id", None), getattr(cfg, "pad_token_id", None),
                           getattr(tok, "unk_token_id", None)) if isinstance(i, int)}
    if tok is not None:
        special |= {i for i in getattr(tok, "all_special_ids", []) if isinstance(i, int)}
    ids = torch.tensor([i for i in range(int(cfg.vocab_size)) if i not in special])
    gen = torch.Generator().manual_seed(seed)
    seg = (T - 1) // 2 if bos is not None else T // 2
    seg_ids = ids[torch.randint(0, len(ids), (n_rows, seg), generator=gen)]  # (N, seg)
    head = [torch.full((n_rows, 1), int(bos))] if bos is not None else []
    tokens = torch.cat([*head, seg_ids, seg_ids], dim=1)  # (N, [1 +] 2 seg)
    return [tokens], f"repeated random segments over {len(ids)} token ids ({n_rows} x {tokens.shape[1]} tokens)"


def _tokenizer(model_dir: Path, required: bool = True) -> Any:
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(model_dir), trust_remote_code=False, local_files_only=True)
    except Exception:
        if not required:
            return None
        raise CheckpointError(f"{str(model_dir)!r} has no tokenizer the doctor can read; cannot tokenize "
                              f"--text (drop --text to use generated token ids)") from None


@torch.inference_mode()
def row_losses(model: Any, rows: list[torch.Tensor]) -> torch.Tensor:
    """Mean next-token cross-entropy (nats) of each evaluation row."""
    out = []
    for tokens in rows:  # (N, T) each
        logits = model(tokens[:, :-1]).logits.float()  # (N, T - 1, V)
        ce = F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten(), reduction="none")
        out.append(ce.view(tokens.shape[0], -1).double().mean(dim=1))  # (N,)
    return torch.cat(out)


def score_layouts(model_dir: Path, cfg: Any, layouts: list[HeadLayout], sources: list[list[torch.Tensor]]
                  ) -> tuple[list[dict[int, torch.Tensor]], dict[int, HeadLayout]]:
    """Per-row losses on every source of every layout ``transformers`` can load and run, keyed by n_heads
    (unique per layout: the widths are fixed), and the layouts by the same key."""
    per_row: list[dict[int, torch.Tensor]] = [{} for _ in sources]
    by_heads = {}
    for layout in layouts:
        model = build(model_dir, cfg, layout)
        if model is None:
            continue
        try:
            losses = [row_losses(model, rows) for rows in sources]
        except (RuntimeError, ValueError, IndexError):  # e.g. GPT-J's rotary_dim wider than this head
            continue
        finally:
            del model
        for out, loss in zip(per_row, losses, strict=True):
            out[layout.n_heads] = loss
        by_heads[layout.n_heads] = layout
    return per_row, by_heads


def check_family(model_dir: Path, n_heads: int | None, candidates: list[int] | None, margin: float, z_min: float,
                 n_rows: int, seq_len: int, seed: int, texts: list[str] | None, t0: float) -> Any:
    """:func:`headlens.doctor.check_checkpoint` for a non-GPT-2 Hugging Face directory."""
    import time

    from headlens.doctor.report import CheckpointReport
    from headlens.doctor.verdict import (
        choose,
        head_count_warnings,
        source_reports,
        source_warnings,
        weigh_source,
    )

    cfg = read_config(model_dir)
    config = claimed_layout(cfg)
    claimed = claimed_layout(cfg, n_heads)
    layouts = [lay for lay in candidate_layouts(cfg, config)
               if candidates is None or lay.n_heads in candidates or lay in (config, claimed)]
    if claimed not in layouts:
        layouts.append(claimed)
    text = text_rows(model_dir, cfg, n_rows, seq_len, seed, texts)
    tok = text[2] if text is not None else None
    named = ([("text", text[0], text[1])] if text is not None else []) + [
        ("random tokens", *random_rows(cfg, n_rows, seq_len, seed, tok))]
    per_row, by_heads = score_layouts(model_dir, cfg, layouts, [rows for _, rows, _ in named])
    if config.n_heads not in by_heads:
        raise CheckpointError(f"the weights in {str(model_dir)!r} do not load with their own config ({config})")
    if claimed.n_heads not in by_heads:
        raise CheckpointError(f"the weights in {str(model_dir)!r} do not load as {claimed}")
    sources = [weigh_source(name, description, losses, rows, claimed.n_heads, margin, z_min,
                            int(cfg.vocab_size), getattr(tok, "unk_token_id", None))
               for (name, rows, description), losses in zip(named, per_row, strict=True)]
    chosen, verdict = choose(sources)
    v = chosen.verdict
    if verdict == "passed" and claimed != config:
        verdict = "failed"  # the weights agree with --n-heads, so the config is wrong
    best = by_heads[v.inferred]
    warnings = source_warnings(sources, verdict)
    if verdict != "inconclusive":
        warnings = head_count_warnings(v, config.n_heads, n_heads, said=str(config), best=f"as {best}",
                                       trained=f"as {best}") + warnings
    reports = source_reports(sources, chosen, lambda h: by_heads[h].d_head, lambda h: by_heads[h].n_kv_heads)
    return CheckpointReport(
        path=str(model_dir), format="huggingface", passed=verdict == "passed",
        config_n_heads=config.n_heads, claimed_n_heads=claimed.n_heads, inferred_n_heads=v.inferred,
        plausible_n_heads=v.plausible, d_model=int(cfg.hidden_size), evaluation=chosen.description, margin=margin,
        evidence=next(r for r in reports if r.used).evidence, warnings=warnings, seconds=time.perf_counter() - t0,
        family=str(cfg.model_type), config_n_kv_heads=config.n_kv_heads, inferred_n_kv_heads=best.n_kv_heads,
        verdict=verdict, sources=reports,
    )
