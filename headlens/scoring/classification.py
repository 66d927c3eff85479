"""``headlens.classify``: score every head of a model on every detector and label it.

Orchestration only: pick detectors, build their probes, :func:`headlens.scoring.scan.scan` each probe
once (every detector of a probe shares its forward passes), summarise with
:mod:`headlens.scoring.stats` and return the tidy table of :mod:`headlens.scoring.table`.

>>> import headlens
>>> from headlens.testing import planted_model
>>> df = headlens.classify(planted_model(), n_prompts=12, seq_len=32)
>>> sorted(df[df.label][["layer", "head", "detector"]].itertuples(index=False, name=None))
[(0, 0, 'previous_token'), (1, 0, 'induction')]
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import torch

from headlens.detectors import DETECTORS
from headlens.detectors.base import Detector
from headlens.detectors.retrieval import WU_THRESHOLD
from headlens.detectors.tl_compat import TL_NORM
from headlens.errors import DetectorError, ModelReferenceError, ProbeError
from headlens.models.reads import TokenLedger
from headlens.models.vocab import first_position
from headlens.probes.base import CORPORA, Probe, short_of
from headlens.probes.generated import brackets, random_tokens, repeated_segments
from headlens.probes.haystack import needle_haystack
from headlens.probes.ioi import scan_probe as ioi_scan_probe
from headlens.probes.prose import prose_windows
from headlens.probes.text import stdlib_windows, text_prompts
from headlens.progress import default_sink, phase, report, reporting
from headlens.readout.ov import forget
from headlens.scoring import defaults
from headlens.scoring.annotated import (
    PREFERENCE_COLUMNS,
    annotated_jobs,
    measure,
    prompt_rows,
    requested_types,
    with_preference,
)
from headlens.scoring.annotated import summaries as target_summaries
from headlens.scoring.derived import with_copy_suppression
from headlens.scoring.distributed import current, scan_blocks
from headlens.scoring.engine import DetectorStats, choose_path
from headlens.scoring.gates import MIN_SHARE, gate_columns, gate_passes, gate_summary, with_gate
from headlens.scoring.resting import REST, rest_of, with_rest
from headlens.scoring.selection import select_detectors
from headlens.scoring.stats import (
    MIN_LIFT,
    N_BOOT,
    PREFERENCE_MARGIN,
    Summary,
    above_null,
    preference_label,
    strength_label,
    summarize,
)
from headlens.scoring.table import head_rows
from headlens.scoring.thresholds import against_null, thresholds
from headlens.scoring.weights import summarize_weights

ProgressFn = Callable[[int, int, str], None]  # (prompts done so far, prompts in total, what is running)


def resolve_model(model_or_ref: Any, device: str = "cpu", **load_options: Any) -> Any:
    """A loaded model, a reference for ``headlens.load`` (``load_options`` go to it), or None for the default."""
    from headlens.models.loading import load

    if model_or_ref is not None:
        return load(model_or_ref, device=device, **load_options)
    from headlens.zoo import DEFAULT_MODEL, ZOO, available

    if DEFAULT_MODEL in ZOO and ZOO[DEFAULT_MODEL].available:
        return load(DEFAULT_MODEL, device=device, **load_options)
    others = sorted(available())
    if not others:
        raise ModelReferenceError(
            f"the default model {DEFAULT_MODEL!r} has no weights in this install and no other zoo model "
            f"is available; pass a model reference (--model REF, e.g. 'minilm' or a .safetensors path)"
        )
    warnings.warn(f"default model {DEFAULT_MODEL!r} has no weights here; using zoo model {others[0]!r}",
                  stacklevel=2)
    return load(others[0], device=device, **load_options)


@contextmanager
def _post_scan(progress: Any, name: str, counted: AbstractContextManager[Any]) -> Iterator[None]:
    """A phase after the scan (a weight detector, a gate): named on the bar, heard from inside the readout, its
    tokens counted by ``counted``; it reports its start and its end, done or refused, so a bar never sits at 0."""
    with reporting(progress), phase(name), counted:
        report(0, 1)
        try:
            yield
        finally:
            report(1, 1)

def _probes(model: Any, dets: list[Detector], prompts: Any, n_prompts: int, seq_len: int, seed: int,
            truncate: bool, corpus: str | None = None) -> list[tuple[Probe, list[Detector]]]:
    """Group pattern detectors by the probe they read (the user's texts, or a corpus, serve every detector)."""
    pattern = [d for d in dets if d.kind in ("index", "mask", "top1")]
    if not pattern:
        return []
    if corpus is not None:
        if corpus not in CORPORA:
            raise ProbeError(f"unknown corpus {corpus!r}; expected one of {', '.join(CORPORA)}")
        needles = [d for d in pattern if d.probe == "needle"]  # needles hidden in the corpus as haystack
        windows = [d for d in pattern if d.probe != "needle"]
        reader = prose_windows if corpus == "prose" else stdlib_windows
        groups = [(reader(model, n_prompts, seq_len, torch.Generator().manual_seed(seed * 1009 + 7)),
                   windows)] if windows else []
        if needles:
            gen = torch.Generator().manual_seed(seed * 1009 + 8)
            groups.append((needle_haystack(model, n_prompts, seq_len, gen, haystack=corpus), needles))
        return groups
    if prompts is not None:
        return [(text_prompts(model, prompts, truncate=truncate), pattern)]
    builders = {"random_tokens": random_tokens, "repeated_segments": repeated_segments,
                "brackets": brackets, "needle": needle_haystack, "ioi": ioi_scan_probe}
    groups = []
    for k, name in enumerate(builders):
        served = [d for d in pattern if d.probe == name]
        if served:
            gen = torch.Generator().manual_seed(seed * 1009 + k)  # one stream per probe kind
            groups.append((builders[name](model, n_prompts, seq_len, gen), served))
    return groups


def _summaries(stats: dict[str, DetectorStats], tl_compatible: bool, seed: int,
               n_boot: int) -> dict[str, Summary]:
    out = {}
    norm = stats.pop(TL_NORM.name, None)
    for name, st in stats.items():
        P_, L, H = st.sums.shape
        if tl_compatible:  # TL: per-prompt Σ(A∘D)/ΣA, then the mean over prompts
            per_prompt = st.sums.reshape(P_, L * H) / norm.sums.reshape(P_, L * H)
            s = summarize(per_prompt, torch.ones(P_, dtype=torch.float64), st.baseline / norm.counts,
                          seed=seed, n_boot=n_boot)
            s = Summary(s.score, s.ci_low, s.ci_high, s.baseline, int(norm.counts.sum()), s.n_prompts)
        else:
            s = summarize(st.sums.reshape(P_, L * H), st.counts, st.baseline, seed=seed, n_boot=n_boot)
        out[name] = s
    return out


def classify(
    model_or_ref: Any = None,
    detectors: Sequence[str | Detector] | str | None = None,
    prompts: Sequence[str] | str | os.PathLike | None = None,
    n_prompts: int = defaults.N_PROMPTS,
    seq_len: int = defaults.SEQ_LEN,
    batch_size: int = defaults.BATCH_SIZE,
    seed: int = 0,
    threshold: float | dict[str, float] | None = None,
    tl_compatible: bool = False,
    progress: ProgressFn | None = None,
    truncate: bool = False,
    n_boot: int = N_BOOT,
    device: str = "cpu",
    corpus: str | None = None,
    scan_path: str = "auto",
    resume: str | os.PathLike | None = None,
    device_map: str | dict[str, Any] | None = None,
    max_memory: dict[str | int, str | int] | None = None,
    offload_folder: str | os.PathLike | None = None,
    dtype: Any = None,
    trust_remote_code: bool = False,
) -> Any:
    """Score every head on every detector and label it (definitions and the label rule: docs/scores.md, "What each score means").

    Args:
        model_or_ref: a loaded model or a reference (zoo name, ``.safetensors`` path, ``hf:<dir>``,
            ``minilm``); None for the bundled default model.
        detectors: names (list or comma-separated), ``module:attribute`` references, or
            :class:`headlens.Detector` objects (your own head types); None for every registered
            detector this model supports (``headlens.detectors`` entry points included).
        prompts: the user's texts (a list of strings, or a path to a file with one prompt per
            line or JSONL with a ``"text"`` field); None for the generated probes. Dicts (or JSONL
            rows) with ``"targets"`` (character spans, :mod:`headlens.probes.spans`) define head types from
            data, named by their ``"detector"`` field (default ``"annotated"``); they are scored when
            named in ``detectors`` or when ``detectors`` is None, with ``preference`` columns when
            they carry ``"distractors"`` (:mod:`headlens.scoring.annotated`).
        n_prompts: prompts per generated probe (>= 10 for a meaningful interval).
        seq_len: generated prompt length in tokens, specials included (capped by the context).
        batch_size: prompts per forward pass; scores do not depend on it.
        seed: seeds the probes and the bootstrap.
        threshold: κ for the pattern detectors, or ``{detector: κ}``: a head is labelled when the low end of
            its strength's CI, ``(ci_low - chance) / (1 - chance)``, is at least κ (default 0.4; chance is the
            type's uniform baseline). Weight detectors read it as τ on their score (default their own: ov_copying
            and ov_suppression 0.05, successor 0.4); gated types (name movers) are labelled against their
            null unless they are given one.
        tl_compatible: reproduce TransformerLens ``detect_head`` ("mul", all rows, per-prompt mean)
            for its three head types instead of headlens' position-conditioned scores.
        progress: optional ``fn(done, total, stage)``: after every batch of the scan (``stage`` is
            ``"scanning <probe>"``), then in each later phase under its own name and total (``"weights copying:
            ..."``, ``"gate dla of name_mover: ..."``); a new total starts a new phase (:mod:`headlens.progress`).
        truncate: cut prompts longer than the context (with a warning) instead of refusing them.
        n_boot: bootstrap resamples.
        device: where a model loaded from a reference runs (``cpu``, ``cuda``, ``mps``, ``auto``).
        corpus: ``"stdlib"`` to read ``n_prompts`` windows of ``seq_len`` tokens of real Python
            source (held-out standard-library files) instead of the generated probes, or ``"prose"`` for
            English prose (the standard library's documentation: what a real LM reads).
        scan_path: ``"auto"`` (default), ``"dense"`` (read the attention pattern) or ``"sparse"``
            (q, k and the log-sum-exp, no pattern: long contexts); see :mod:`headlens.scoring.engine`.
            The path each probe took is in ``attrs["probes"][name]["scan_path"]``.
        resume: a folder for finished batches (:mod:`headlens.scoring.resume`): a rerun with the same
            arguments scans only the batches that are not there yet.
        device_map: for a model larger than one device (``hf:`` references): ``"auto"`` lets
            ``accelerate`` spread its layers over the GPUs, the CPU and the disk.
        max_memory: with ``device_map``, the memory each device may take (e.g.
            ``{0: "20GiB", "cpu": "64GiB"}``).
        offload_folder: with ``device_map``, where layers offloaded to disk go.
        dtype: ``"float32"`` (default), ``"bfloat16"`` or ``"float16"`` for a model loaded from a
            reference; the statistics are float64 sums whatever the model runs in.
        trust_remote_code: let an ``hf:`` repository run its own code (never otherwise).

    Under ``torchrun`` each rank scans a contiguous block of every probe's batches
    (:mod:`headlens.scoring.distributed`) and rank 0 computes the table from all of them; ``device="cuda"``
    means each rank's own GPU.

    Returns:
        the scores table (pandas DataFrame, schema in :mod:`headlens.scoring.table`), provenance in ``attrs``;
        None on ranks other than 0 under torchrun.
    """
    import pandas as pd

    from headlens import __version__
    from headlens.scoring.table import empty_table, kv_heads, n_kv_heads, validate

    rank = current()
    progress = progress if progress is not None else default_sink()  # a notebook shows progress by itself
    model = resolve_model(model_or_ref, device=rank.device(device), device_map=device_map, max_memory=max_memory,
                          offload_folder=offload_folder, dtype=dtype, trust_remote_code=trust_remote_code)
    if n_prompts < 1 or batch_size < 1:
        raise ProbeError(f"n_prompts and batch_size must be >= 1, got {n_prompts} and {batch_size}")
    asked, seq_len = int(seq_len), min(int(seq_len), int(model.cfg.n_ctx))
    if corpus is not None and prompts is not None:
        raise ProbeError("pass either prompts or a corpus, not both")
    texts, annotated_rows = prompt_rows(prompts)
    builtin, user_types = requested_types(detectors, annotated_rows)
    dets, skipped, explicit = select_detectors(model, builtin, tl_compatible) if builtin != [] else ([], {}, True)
    if packed := [name for name, why in skipped.items() if "packed" in why]:  # readable weights: decided up front
        warnings.warn(f"{getattr(model, 'name', 'the model')!r} stores its weights packed "
                      f"({getattr(model, 'packed_weights', '')}): skipping {', '.join(packed)}, which read weight "
                      f"matrices; attention scores are real", stacklevel=2)
    taus = thresholds(threshold, user_types, dets)
    by_null = against_null(threshold, dets)
    groups = _probes(model, dets, texts, n_prompts, seq_len, seed, truncate, corpus)
    jobs = annotated_jobs(model, dets, user_types, annotated_rows, texts is not None or corpus is not None,
                           n_prompts, seed, truncate)
    notes: list[str] = [why for pr, _ in groups if (why := short_of(pr, seq_len))]
    if asked > seq_len and any(pr.name != "prompts" for pr, _ in groups):
        notes.append(f"seq_len={asked} is beyond the model's context (n_ctx={seq_len}): probes were built "
                     f"at {seq_len} tokens")
    if groups and groups[0][0].name == "prompts" and groups[0][0].settings.get("n_truncated"):
        notes.append(f"{groups[0][0].settings['n_truncated']} prompt(s) were longer than the context "
                     f"and were truncated to n_ctx={model.cfg.n_ctx}")
    choose_path(scan_path, model, (1, 1))  # an unknown or unsupported path fails before any work
    paths: dict[str, str] = {}
    store = None
    if resume is not None:
        from headlens.scoring.resume import scan_store

        store = scan_store(resume, model, groups, dets, seed=seed, tl_compatible=tl_compatible, scan_path=scan_path,
                           rest=REST.name)
    total = sum(len(rank.batch_block(len(pr), batch_size)) for pr, _ in groups)
    total, done = total + (sum(len(pr) for pr in jobs.values()) if rank.is_main else 0), 0

    def ticker(stage: str) -> Callable[[int], None]:
        def tick(n: int) -> None:
            nonlocal done
            done += n
            if progress is not None:
                progress(done, total, f"scanning {stage}")

        return tick

    summaries: dict[str, Summary] = {}
    rests: dict[str, torch.Tensor | None] = {}  # detector -> resting mass per head on its probe
    reads = TokenLedger(model)  # every token each phase feeds the model, for the provenance
    for probe, served in groups:
        run = with_rest([*served, TL_NORM] if tl_compatible else served)
        info: dict[str, Any] = {}
        with reads(probe.name):
            stats = scan_blocks(model, probe, run, batch_size, ticker(probe.name), rank, store, path=scan_path, info=info)
        if stats is not None:  # None on ranks > 0: their rows went to rank 0
            paths[probe.name] = info["scan_path"]
            rests.update(dict.fromkeys([d.name for d in served], rest_of(stats, served)))
            summaries.update(_summaries(stats, tl_compatible, seed, n_boot))
    if not rank.is_main:
        return None
    preferences: dict[str, Summary | None] = {}
    for name, aprobe in jobs.items():  # annotated probes are small: rank 0 measures them alone
        with reads(f"annotated:{name}"):
            stats = measure(model, aprobe, batch_size, ticker(name))
        summaries[name], preferences[name] = target_summaries(stats, seed=seed, n_boot=n_boot)
        rests[name] = stats.rest_mass()
    L, H, H_kv = model.n_layers, model.n_heads, n_kv_heads(model)
    kv = kv_heads(H, H_kv)
    rows, extra, weights = [], [], {}
    by_name = {d.name: d for d in dets}  # Detector objects passed in need not be registered
    probe_of = {d.name: pr for pr, served in groups for d in served}  # where a gate measures its statistic
    gate_cache: dict = {}
    gated: set[str] = set()
    for name in [d.name for d in dets] + user_types:
        d = by_name.get(name) or DETECTORS.get(name)
        if d is not None and d.kind == "weights":
            try:
                with _post_scan(progress, f"weights {d.name}", reads(f"weights:{d.name}")):
                    w = summarize_weights(d.weights_fn(model), taus[d.name])
            except DetectorError as err:  # e.g. no ordered list of single tokens for successor
                if explicit:
                    raise
                skipped[name] = str(err)
                continue
            rows += head_rows(model.name, d.name, w.summary, w.summary.lift, w.labels, L, kv, None, w.columns)
            extra += [c for c in w.columns if c not in extra]
            weights[d.name] = w.attrs
            continue
        s = summaries.get(name)
        if s is None or s.n_positions == 0:
            source = corpus or ("prompts" if prompts is not None else d.probe)
            why = f"{name}: the {source} probe has no target positions"
            if explicit:
                raise ProbeError(why + " for this detector")
            skipped[name] = why
            continue
        lift, pref = s.lift, preferences.get(name)
        # with distractors, preference accuracy is the primary statistic (Clark et al. 2019); mass stays in the table
        if pref is not None:
            labels = preference_label(pref, s)
        elif name in by_null:  # gated types: the attention CI clears the type's null, then the gate decides
            labels = above_null(s)
        else:  # the strength's CI low end against κ (docs/scores.md, "the label rule")
            labels = strength_label(s, taus[name])
        if d is not None and d.gate is not None:  # what the head writes: the gate's CI must clear zero too
            with _post_scan(progress, f"gate {d.gate.name} of {name}", reads(f"gate:{probe_of[name].name}")):
                g = gate_summary(model, d.gate, probe_of[name], gate_cache, seed, n_boot)
            labels, gated = labels & gate_passes(g, d.gate.sign), gated | {d.gate.name}
        new_rows = head_rows(model.name, name, s, lift, labels, L, kv, rests.get(name))
        if d is not None and d.gate is not None:
            new_rows = with_gate(new_rows, d.gate, g)
        rows += with_preference(new_rows, pref) if name in preferences else new_rows
    forget(model)  # the weight detectors' shared readout and ranks
    columns = list(empty_table().columns) + (list(PREFERENCE_COLUMNS) if preferences else []) + extra
    columns += [c for name in sorted(gated) for c in gate_columns(name)]
    df = with_copy_suppression(pd.DataFrame(rows, columns=columns) if rows else empty_table())  # OV + attention
    if s_small := [d for d, s in summaries.items() if 0 < s.n_prompts < 10]:
        notes.append(f"fewer than 10 prompts with targets for {', '.join(s_small)}: wide intervals")
    for note in notes:
        warnings.warn(note, stacklevel=2)
    df.attrs.update({
        "headlens_version": __version__, "model": model.name,
        "causal": bool(model.is_causal), "n_layers": L, "n_heads": H, "n_kv_heads": H_kv,
        "seed": seed,
        "scoring": "tl_compatible" if tl_compatible else "headlens",
        "thresholds": {n: None if n in by_null else taus[n] for n in [d.name for d in dets] + user_types},
        "min_lift": MIN_LIFT,  # weight types
        "label_rule": ("pattern types: strength CI low end (ci_low - baseline) / (1 - baseline) >= thresholds[type] "
                       "(kappa); weight types: ci_low >= thresholds[type], lift >= min_lift and above their null's "
                       "interval; gated types: gate_rule; with distractors: preference_rule"),
        "preference_rule": (f"with distractors: preference ci_low >= chance + {PREFERENCE_MARGIN} * (1 - chance) "
                            f"and mass ci_low > its uniform baseline (Clark et al. 2019)"),
        "n_boot": n_boot, "rest": "attention on the first token (rows q >= 1) on each row's probe; resting labels last",
        "probes": {**{pr.name: {**pr.settings, "n_prompts": len(pr), "detectors": [d.name for d in sv],
                                "scan_path": paths[pr.name]} for pr, sv in groups},
                   **{f"annotated:{n}": {**pr.settings, "n_prompts": len(pr), "detectors": [n],
                                         "preference_chance": getattr(preferences[n], "baseline", None)}
                      for n, pr in jobs.items()}},
        "scan_path": "+".join(sorted(set(paths.values()))) or "none", "tokens_read": reads.summary(),
        "skipped": skipped, "warnings": notes, "batch_size": batch_size, "world_size": rank.world_size,
        "dtype": str(next(model.parameters()).dtype).removeprefix("torch."), "device": str(model.device),
        "substitutions": list(getattr(model, "substitutions", [])),  # what ran in place of what the model asked for
        "source": dict(getattr(model, "source", None) or {}),  # a GGUF's file, sha256 and quantization types
        "first_position": first_position(model),  # what first_token and sink measure attention to
        **({"weights": weights} if weights else {}),  # weight detectors: samples, lists, the null over all heads
    })
    if gated:  # the second half of the name movers' label (headlens.scoring.gates)
        df.attrs["gate_rule"] = (f"gate CI on its side of zero and |mean| >= {MIN_SHARE:g} x the strongest head's; "
                                 f"attention ci_low above its uniform baseline (no absolute attention threshold "
                                 f"and no lift floor; the kappa rule when a threshold is given)")
    if "retrieval" in set(df["detector"]):  # Wu et al.'s own rule next to ours
        r = df[(df["detector"] == "retrieval") & (df["score"] > WU_THRESHOLD)].sort_values("score", ascending=False)
        df.attrs["retrieval_wu_2024"] = {"threshold": WU_THRESHOLD, "rule": "score > 0.1 (Wu et al. 2024)",
                                         "heads": [f"L{a}H{b}" for a, b in zip(r["layer"], r["head"], strict=True)]}
    return validate(df)
