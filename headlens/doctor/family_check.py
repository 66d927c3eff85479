"""The doctor's check of a Hugging Face directory of any causal-LM family (Llama, Mistral, Qwen2, Gemma,
GPT-NeoX ...): every layout the weight shapes allow (:mod:`headlens.doctor.families`), raced on the
evaluation sources (:mod:`headlens.doctor.sources`, :mod:`headlens.doctor.racing`), weighed into one verdict
(:mod:`headlens.doctor.verdict`). GPT-2 directories and headlens checkpoints go through
:mod:`headlens.doctor.checkpoint`, which calls this for the other families.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from headlens.doctor.families import (
    Builder,
    HeadLayout,
    candidate_layouts,
    claimed_layout,
    first_token,
    n_ctx,
    random_sources,
    read_config,
    text_source,
    tokenizer,
)
from headlens.doctor.racing import Tally, race_sources
from headlens.doctor.report import CheckpointReport
from headlens.doctor.shapes import ShapeEvidence, implied_layout, safetensors_shapes, width_mismatch
from headlens.doctor.sources import evaluation_size
from headlens.doctor.verdict import choose, head_count_warnings, source_reports, source_warnings, weigh_source
from headlens.errors import CheckpointError

# (tokens run so far, an upper bound on all of them, what runs now)
Progress = Callable[[int, int, str], None]


def _layouts(cfg: Any, config: HeadLayout, claimed: HeadLayout, candidates: list[int] | None) -> dict[int, HeadLayout]:
    layouts = [lay for lay in candidate_layouts(cfg, config)
               if candidates is None or lay.n_heads in candidates or lay in (config, claimed)]
    if claimed not in layouts:
        layouts.append(claimed)
    return {lay.n_heads: lay for lay in layouts}  # n_heads is unique per layout: the widths are fixed


def check_family(model_dir: Path, n_heads: int | None, candidates: list[int] | None, margin: float, z_min: float,
                 n_rows: int | None, seq_len: int | None, seed: int, texts: list[str] | None, t0: float,
                 progress: Progress | None = None, all_sources: bool = False, gguf_llama: bool = False,
                 name: str | None = None) -> CheckpointReport:
    """:func:`headlens.doctor.check_checkpoint` for a non-GPT-2 Hugging Face directory.

    ``gguf_llama``: the directory is transformers' reading of a llama GGUF file, whose header's head counts
    also decided how the query/key rows were un-permuted; each layout is then tried with the rows a header
    saying it would have given (:func:`headlens.doctor.families.gguf_rows`), so a header that lies is found.
    ``name``: what the notes call the model (default: the directory's name).
    """
    cfg = read_config(model_dir)
    config = claimed_layout(cfg)
    if (shaped := implied_layout(safetensors_shapes(model_dir))) is not None:  # before any model is built
        return shape_report(str(model_dir), "huggingface", str(cfg.model_type), int(cfg.hidden_size), config,
                            n_heads, shaped, t0)
    claimed = claimed_layout(cfg, n_heads)
    layouts = _layouts(cfg, config, claimed, candidates)
    builder = Builder(model_dir, cfg, layouts, keep=claimed.n_heads, gguf_header=config if gguf_llama else None)
    first = builder.model(config.n_heads)
    if first is None:
        why = width_mismatch(safetensors_shapes(model_dir), config)
        raise CheckpointError(f"the weights in {str(model_dir)!r} do not load with their own config ({config})"
                              + (f": {why}" if why else ""))
    n_params = sum(p.numel() for p in first.parameters())
    rows, T = evaluation_size(n_params, n_ctx(cfg), n_rows, seq_len)
    tok = tokenizer(model_dir, required=texts is not None)
    first, prefix = first_token(model_dir, cfg, tok)
    text = text_source(cfg, tok, first, rows, T, seed, texts)
    named = ([text] if text is not None else []) + random_sources(cfg, rows, T, seed, tok, first)
    tally = Tally(progress, lambda h: str(layouts[h]))
    builder.on_run = tally

    def weigh(src: Any, per_row: Any, note: str) -> Any:
        if claimed.n_heads not in per_row:
            raise CheckpointError(f"the weights in {str(model_dir)!r} do not load as {claimed}")
        return weigh_source(src.name, src.description, per_row, src.rows, claimed.n_heads, margin, z_min,
                            int(cfg.vocab_size), getattr(tok, "unk_token_id", None), note, src.chance)

    sources, skipped = race_sources(builder, list(layouts), named, claimed.n_heads, margin, z_min, weigh, all_sources,
                                    tally)
    chosen, verdict = choose(sources)
    v = chosen.verdict
    if verdict == "passed" and claimed != config:
        verdict = "failed"  # the weights agree with --n-heads, so the config is wrong
    best = layouts[v.inferred]
    warnings = source_warnings(sources, verdict)
    if verdict != "inconclusive":
        warnings = head_count_warnings(v, config.n_heads, n_heads, said=str(config), best=f"as {best}",
                                       trained=f"as {best}") + warnings
    reports = source_reports(sources, chosen, lambda h: layouts[h].d_head, lambda h: layouts[h].n_kv_heads)
    return CheckpointReport(
        path=str(model_dir), format="huggingface", passed=verdict == "passed",
        config_n_heads=config.n_heads, claimed_n_heads=claimed.n_heads, inferred_n_heads=v.inferred,
        plausible_n_heads=v.plausible, d_model=int(cfg.hidden_size), evaluation=chosen.description, margin=margin,
        evidence=next(r for r in reports if r.used).evidence, warnings=warnings, seconds=time.perf_counter() - t0,
        family=str(cfg.model_type), config_n_kv_heads=config.n_kv_heads, inferred_n_kv_heads=best.n_kv_heads,
        verdict=verdict, sources=reports, skipped_sources=skipped,
        notes=[n for n in [prefix.note(name or model_dir.name) if prefix is not None else None] if n],
    )


def shape_report(path: str, fmt: str, family: str, d_model: int, config: HeadLayout, n_heads: int | None,
                 ev: ShapeEvidence, t0: float, said_by: str = "the config") -> CheckpointReport:
    """The verdict of the weight shapes alone (:mod:`headlens.doctor.shapes`): passed when they fix the layout
    the config (and ``n_heads``) says, failed, naming the tensor and the layout it implies, when they fix
    another. No model is built and no source runs."""
    claimed = config.n_heads if n_heads is None else n_heads
    whose = f"{said_by}'s"
    warnings = [] if ev.layout == config else [f"{said_by} is wrong: {ev.finding(config, whose)}"]
    if claimed != ev.layout.n_heads and n_heads is not None:
        warnings.append(f"you asked for n_heads={n_heads} but {ev.statement}")
    verdict = "passed" if not warnings else "failed"
    return CheckpointReport(
        path=path, format=fmt, passed=verdict == "passed", config_n_heads=config.n_heads, claimed_n_heads=claimed,
        inferred_n_heads=ev.layout.n_heads, plausible_n_heads=[ev.layout.n_heads], d_model=d_model,
        evaluation="the weight shapes", margin=0.0, warnings=warnings, seconds=time.perf_counter() - t0,
        family=family, config_n_kv_heads=config.n_kv_heads, inferred_n_kv_heads=ev.layout.n_kv_heads,
        verdict=verdict, weights=f"{ev.statement} ({ev.layout}; no text needed, no model built)")
