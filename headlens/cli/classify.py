"""``headlens classify``: label every head of a model; a thin layer over :func:`headlens.classify`.

stdout: by default a summary that fits a screen (:mod:`headlens.cli.summary`: per head type its
strongest heads and how many carry the label, the layer x head grid of strongest labels, where the
full table went). ``--all``: a table of every labelled head (strongest first, resting labels last;
``kv_head`` is each query head's key/value group under grouped-query attention, equal to the head
otherwise) and the layer x head overview; for annotated head types with distractors (coreference) also
the top heads by preference accuracy with their mass, labelled or not.
stderr: progress, warnings, and on bad input one line ``headlens: error: ...`` with the exit
code of its error class (see ``headlens.cli``): 4 unknown model, 5 prompts/probe problems
(missing or empty prompts file, a prompt longer than the context unless ``--truncate``, a
probe with no target positions for a requested detector, a bad annotation: span out of range,
empty keys, unknown field; a tokenizer that splits the coreference probe's words), 6 unknown
or unsupported detector, 7 unwritable output path or unknown suffix (also for ``--report``,
which must end in ``.html``).

``--confirm`` runs the ablation check of ``headlens.interventions.confirm.confirm(model, table)``: each
labelled type's strongest heads ablated together against random heads of the same layers (it adds its
columns to the table and prints one row per type).
"""

from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path
from typing import Annotated, Any

import typer

from headlens.cli import options as opt
from headlens.cli import precheck
from headlens.cli.failure import fail
from headlens.errors import HeadlensError
from headlens.scoring import defaults

N_RANKED = 8  # heads listed per annotated head type, labelled or not


def _confirm_fn() -> Any:
    for module in ("headlens.interventions.confirm", "headlens.interventions.ablation"):
        try:
            fn = getattr(__import__(module, fromlist=["confirm"]), "confirm", None)
        except ImportError:
            continue
        if callable(fn):
            return fn
    raise HeadlensError("--confirm needs headlens.interventions.confirm.confirm, which this install does not have")


def _cells(r: Any) -> list[str]:
    """score, 95% CI, baseline, lift, positions of one labelled row; a weight-based score (ov_copying: no probe,
    no positions, no baseline) says "weights" instead of a degenerate CI."""
    if int(r.n_positions) == 0 and r.lift != r.lift:
        return [f"{r.score:.3f}", "weights", "-", "-", "-"]
    return [f"{r.score:.3f}", f"[{r.ci_low:.3f}, {r.ci_high:.3f}]", f"{r.baseline:.3f}",
            "-" if r.lift != r.lift else f"{r.lift:.1f}", str(r.n_positions)]


def _confirm_cell(r: Any) -> list[str]:
    """The ablation check in words: metric, rounded change, confirmed or not."""
    metric = getattr(r, "ablation_metric", None)
    delta = getattr(r, "ablation_delta", float("nan"))
    if not metric or delta != delta:
        return ["-", "-"]
    return [f"{metric} {delta:+.3f}", "yes" if bool(r.confirmed) else "no"]


def print_results(df: Any, console: Any, asked: list[str] | None = None) -> None:
    """The labelled heads (strongest first), then a layer x head overview of their top labels.

    ``asked``: the detectors the user named; a detector skipped without being asked for is not reported.
    """
    from rich.table import Table

    from headlens.scoring.primary import strength
    from headlens.scoring.table import head_labels, labelled_heads
    from headlens.viz.grid import fmt_number, label_mark

    attrs = df.attrs
    title = f"{attrs.get('model', '?')}: labelled heads ({attrs.get('scoring', 'headlens')} scores)"
    lab = labelled_heads(df)
    table = Table(title=title, caption_justify="left", caption=(
        "behaviour types first, weight scores after, resting last; strength: (score - chance) / (1 - chance), one "
        "scale for every type; score, its 95% CI over prompts; baseline: the score of uniform attention (chance); "
        "lift: score / baseline, to compare heads of one type; positions: query rows with a target; rest: "
        "first-token attention"))
    for col in ("head", "kv_head", "detector", "strength", "score", "95% CI", "baseline", "lift", "positions",
                "rest"):
        table.add_column(col, justify="left" if col in ("head", "detector") else "right", no_wrap=True)
    confirmed = "ablation_delta" in lab.columns
    gated = "dla" in lab.columns and bool(lab["dla"].notna().any())  # name movers: what the head writes
    if confirmed:
        table.add_column("ablation: metric change", justify="right", no_wrap=True)
        table.add_column("confirmed", justify="right", no_wrap=True)
    if gated:
        table.add_column("DLA (95% CI)", justify="right", no_wrap=True)
    powers = strength(lab).tolist() if len(lab) else []
    for r, power in zip(lab.itertuples(), powers, strict=True):
        kv = getattr(r, "kv_head", r.head)  # the key/value group (== head without GQA)
        rest = getattr(r, "rest", float("nan"))  # attention on the first token, on the row's probe
        dla = [] if not gated else ["-" if r.dla != r.dla else f"{r.dla:+.3f} [{r.dla_ci_low:+.3f}, {r.dla_ci_high:+.3f}]"]
        table.add_row(f"L{r.layer}H{r.head}", str(kv), r.detector, fmt_number(power, ".2f"), *_cells(r),
                      "-" if rest != rest else f"{rest:.2f}",
                      *(_confirm_cell(r) if confirmed else []), *dla)
    if not len(lab):
        table.add_row("-", "", "no head passes the rule", "", "", "", "", "", "", "")
    console.print(table)
    labels = head_labels(df)
    n_layers, n_heads = int(attrs.get("n_layers", 0)), int(attrs.get("n_heads", 0))
    grid = Table(title="layer x head: top label", caption="· no label (marks: headlens detectors)",
                 padding=(0, 1))
    grid.add_column("")
    for h in range(n_heads):
        grid.add_column(f"H{h}", justify="center")
    for layer in range(n_layers):
        grid.add_row(f"L{layer}", *[label_mark(labels[(layer, h)][0]) if (layer, h) in labels else "·"
                                     for h in range(n_heads)])
    console.print(grid)
    print_rankings(df, console)
    print_skipped(df, console, asked)


def print_skipped(df: Any, console: Any, asked: list[str] | None) -> None:
    """Why a detector the user named was skipped (a default one skipped unasked is not reported)."""
    wanted = {n.split("(")[0] for n in asked or []}
    for name, why in df.attrs.get("skipped", {}).items():
        if name.split("(")[0] in wanted:
            console.print(f"[dim]skipped {name}: {why}[/dim]")


def print_rankings(df: Any, console: Any) -> None:
    """For annotated head types with distractors (coreference ...): the top heads by preference accuracy
    (their primary statistic, Clark et al. 2019) with the attention mass, labelled or not, so a census
    without labels still shows its ranking."""
    from rich.table import Table

    from headlens.scoring.primary import ranked

    if "preference" not in df.columns:
        return
    for det, rows in df[df["preference"].notna()].groupby("detector", sort=False):
        top = ranked(rows, str(det)).head(N_RANKED)
        n_lab = int(rows["label"].sum())
        chance = df.attrs.get("probes", {}).get(f"annotated:{det}", {}).get("preference_chance")
        table = Table(title=f"{det}: top {len(top)} heads by preference accuracy ({n_lab} labelled)",
                      caption=f"preference = how often the target beats the distractors; mass = attention on "
                              f"it (chance "
                              f"{'-' if chance is None else f'{chance:.2f}'})")
        for col in ("head", "preference", "95% CI", "mass", "95% CI ", "lift", "label"):
            table.add_column(col, justify="left" if col == "head" else "right")
        for r in top.itertuples():
            table.add_row(f"L{r.layer}H{r.head}", f"{r.preference:.3f}",
                          f"[{r.preference_ci_low:.3f}, {r.preference_ci_high:.3f}]", f"{r.score:.3f}",
                          f"[{r.ci_low:.3f}, {r.ci_high:.3f}]", f"{r.lift:.1f}", "yes" if r.label else "no")
        console.print(table)


def run_classify(
    model: str | None, detectors: str | None, prompts: Path | None, n_prompts: int, seq_len: int,
    batch_size: int, seed: int, threshold: float | None, tl_compatible: bool, out: Path | None,
    quiet: bool, truncate: bool, confirm: bool, corpus: str | None = None, scan_path: str = "auto",
    resume: Path | None = None, device: str = "cpu", load_options: dict[str, Any] | None = None,
    report: Path | None = None, show_all: bool = False,
) -> None:
    """The command body: library calls only, errors left to the caller.

    Under torchrun only rank 0 shows progress, warnings and results and writes ``out``.
    """
    if prompts is not None:  # a missing, empty, UTF-16 or binary file: refused before torch and the model load
        from headlens.probes.prompt_file import read_prompts

        read_prompts(prompts)
    if model is not None:  # a model that will not fit: refused before torch is imported (seconds, not minutes)
        from headlens.models.memory import check_fits

        check_fits(model, opt.check_dtype((load_options or {}).get("dtype") or "float32"), device,
                   (batch_size, seq_len), (load_options or {}).get("device_map"))
    from rich.console import Console

    from headlens.cli.progress import progress
    from headlens.scoring.defaults import SCAN_PATHS
    from headlens.scoring.distributed import current
    from headlens.scoring.table import check_output_path, write_table
    from headlens.viz.report import check_report_path, write_report

    err = Console(stderr=True)
    opt.check_choice("--scan-path", scan_path, SCAN_PATHS)
    if load_options and "dtype" in load_options:
        load_options = {**load_options, "dtype": opt.check_dtype(load_options["dtype"])}
    if out is not None:
        check_output_path(out)  # fail before the scan, not after
    if report is not None:
        check_report_path(report)
    caught: list[warnings.WarningMessage] = []
    main = os.environ.get("RANK", "0") in ("", "0")  # torchrun: rank 0 alone talks (the group is not up yet)
    # the phases (load, scan, weights, gates) under one bar, opened before torch is imported: a real model's
    # start says what it is doing within seconds
    with progress(f"loading {model or 'the default model'}", quiet=quiet or not main) as bar:
        from headlens.scoring.classification import classify, resolve_model

        rank = current()
        with warnings.catch_warnings(record=True) as heard:
            warnings.simplefilter("always")
            loaded = resolve_model(model, device=rank.device(device), **(load_options or {}))
            df = classify(loaded, detectors=detectors, prompts=prompts, n_prompts=n_prompts, seq_len=seq_len,
                          batch_size=batch_size, seed=seed, threshold=threshold, tl_compatible=tl_compatible,
                          progress=bar.update,
                          truncate=truncate, corpus=corpus, scan_path=scan_path, resume=resume)
        caught += heard
    quiet = quiet or not rank.is_main
    if df is None:  # a rank other than 0: its rows went to rank 0
        return
    if confirm:
        from headlens.scoring.distributed import single_process

        attrs = dict(df.attrs)
        with warnings.catch_warnings(record=True) as heard:
            warnings.simplefilter("always")
            with single_process(), progress("confirming", quiet=quiet) as bar:  # rank 0 alone: the others are done
                df = _confirm_fn()(loaded, df, progress=lambda done, total: bar.update(done, total, "ablating"))
        caught += heard
        df.attrs.update(attrs)
    for w in caught:
        print(f"headlens: warning: {w.message}", file=sys.stderr)
    if out is not None:
        write_table(df, out)
        if not quiet:
            err.print(f"wrote {len(df)} rows to {out}")
    if report is not None:
        from headlens.readout.dla import attribute

        ioi = "dla" in df.columns and bool(df["dla"].notna().any())  # name movers ran: who writes IO - S
        same = df.attrs.get("probes", {}).get("ioi", {}).get("seed", seed)  # the prompts the name movers read
        write_report(loaded, df, report, attribution=attribute(loaded, "ioi", n_prompts=n_prompts, seed=same)
                     if ioi else None)
        if not quiet:
            err.print(f"wrote the report to {report} (one page, opens offline)")
    asked = [n.strip() for n in detectors.split(",")] if detectors else []
    console = Console(file=sys.stdout, width=None if sys.stdout.isatty() else 200)  # logs: no cuts
    from headlens.cli.summary import print_confirmation, print_summary

    if show_all:
        print_results(df, console, asked)
    else:
        print_summary(df, console, out)
        print_skipped(df, console, asked)
    print_confirmation(df, console)


def register(app: typer.Typer) -> None:
    @app.command("classify")
    def classify_cmd(
        model: opt.Model = None,
        detectors: opt.Detectors = None,
        prompts: Annotated[Path | None, typer.Option("--prompts", "-p", help="your texts: one per line, or "
                           "JSONL with a 'text' field; JSONL rows with 'targets' (character spans) define "
                           "head types from data (see the docs) (default: generated probes)")] = None,
        corpus: opt.Corpus = None,
        n_prompts: opt.NPrompts = defaults.N_PROMPTS,
        seq_len: opt.SeqLen = defaults.SEQ_LEN,
        batch_size: opt.BatchSize = defaults.BATCH_SIZE,
        seed: opt.Seed = defaults.SEED,
        threshold: opt.Threshold = None,
        tl_compatible: Annotated[bool, typer.Option("--tl-compatible", help="TransformerLens detect_head "
                                 "numbers for its 3 head types")] = False,
        out: opt.Out = None,
        quiet: opt.Quiet = False,
        truncate: Annotated[bool, typer.Option("--truncate", help="cut prompts longer than the context "
                            "(with a warning) instead of refusing them (exit 5)")] = False,
        confirm: Annotated[bool, typer.Option("--confirm", help="confirm labels by ablation: each type's "
                           "strongest heads ablated together, their effect on the type's task metric beside "
                           "random heads of the same layers")] = False,
        scan_path: opt.ScanPath = defaults.SCAN_PATH,
        resume: opt.Resume = None,
        device: opt.Device = "cpu",
        device_map: opt.DeviceMap = None,
        max_memory: opt.MaxMemory = None,
        offload_folder: opt.OffloadFolder = None,
        dtype: opt.Dtype = "float32",
        trust_remote_code: opt.TrustRemoteCode = False,
        report: Annotated[Path | None, typer.Option("--report", help="also write one standalone HTML page "
                          "(grid, labelled heads with CIs, their patterns, provenance; opens offline)")] = None,
        show_all: Annotated[bool, typer.Option("--all", help="print every labelled row (and the rankings of "
                            "types with distractors) instead of the summary of each type's strongest heads")] = False,
    ) -> None:
        """Score every head on every detector, label them, print a summary (--all: every labelled head).

        Under torchrun (torchrun --nproc-per-node N -m headlens classify ...) each rank scans a block
        of the prompts and rank 0 writes the table.
        """
        try:
            precheck.check_model(model)  # a mistyped name: refused before torch loads
            if prompts is None:  # a JSONL prompts file may define head types of its own ("detector": "prev")
                precheck.check_detectors(detectors)
            opt.check_choice("--scan-path", scan_path, defaults.SCAN_PATHS)
            run_classify(model, detectors, prompts, n_prompts, seq_len, batch_size, seed, threshold,
                         tl_compatible, out, quiet, truncate, confirm, corpus, scan_path, resume, device,
                         {**opt.load_options(device_map, max_memory, offload_folder), "dtype": dtype,
                          "trust_remote_code": trust_remote_code, "batch_shape": (batch_size, seq_len)},
                         report, show_all)
        except HeadlensError as e:  # one line and the class's exit code, also under CliRunner
            raise fail(e) from None
