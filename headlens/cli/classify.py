"""``headlens classify``: label every head of a model; a thin layer over :func:`headlens.classify`.

stdout: a table of the labelled heads (strongest first; ``kv_head`` is each query head's key/value
group under grouped-query attention, equal to the head otherwise) and a layer x head overview;
for annotated head types with distractors (coreference) also the top heads by score with their
preference accuracy, labelled or not.
stderr: progress, warnings, and on bad input one line ``headlens: error: ...`` with the exit
code of its error class (see ``headlens.cli``): 4 unknown model, 5 prompts/probe problems
(missing or empty prompts file, a prompt longer than the context unless ``--truncate``, a
probe with no target positions for a requested detector, a bad annotation: span out of range,
empty keys, unknown field; a tokenizer that splits the coreference probe's words), 6 unknown
or unsupported detector, 7 unwritable output path or unknown suffix (also for ``--report``,
which must end in ``.html``).

``--confirm`` runs the ablation check of ``headlens.interventions.confirm.confirm(model, table)`` on the
labelled heads when that module is installed (it adds its columns to the table).
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path
from typing import Annotated, Any

import typer

from headlens.cli import options as opt
from headlens.cli.failure import fail
from headlens.errors import HeadlensError, ProbeError

SHORT = {  # overview cell for each label
    "previous_token": "prev", "next_token": "next", "current_token": "self", "first_token": "sink",
    "duplicate_token": "dup", "induction": "ind", "bracket_matching": "brk",
    "bracket_matching_hard": "brk!", "open_bracket": "open", "open_bracket_hard": "open!", "copying": "copy",
    "coreference": "coref",
}
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


def print_results(df: Any, console: Any) -> None:
    """The labelled heads (strongest first), then a layer x head overview of their top labels."""
    from rich.table import Table

    from headlens.scoring.table import head_labels, labelled_heads

    attrs = df.attrs
    title = f"{attrs.get('model', '?')}: labelled heads ({attrs.get('scoring', 'headlens')} scores)"
    lab = labelled_heads(df)
    table = Table(title=title)
    for col in ("head", "kv_head", "detector", "score", "95% CI", "baseline", "lift", "positions"):
        table.add_column(col, justify="left" if col in ("head", "detector") else "right")
    extra = [c for c in ("ablation_delta", "confirmed") if c in lab.columns]
    for c in extra:
        table.add_column(c, justify="right")
    for r in lab.itertuples():
        kv = getattr(r, "kv_head", r.head)  # the key/value group (== head without GQA)
        cells = [f"L{r.layer}H{r.head}", str(kv), r.detector, f"{r.score:.3f}", f"[{r.ci_low:.3f}, {r.ci_high:.3f}]",
                 f"{r.baseline:.3f}", "-" if r.lift != r.lift else f"{r.lift:.1f}", str(r.n_positions)]
        cells += [str(getattr(r, c)) for c in extra]
        table.add_row(*cells)
    if not len(lab):
        table.add_row("-", "", "no head passes the rule", "", "", "", "", "")
    console.print(table)
    labels = head_labels(df)
    n_layers, n_heads = int(attrs.get("n_layers", 0)), int(attrs.get("n_heads", 0))
    grid = Table(title="layer x head: top label", caption="· = no label", padding=(0, 1))
    grid.add_column("")
    for h in range(n_heads):
        grid.add_column(f"H{h}", justify="center")
    for layer in range(n_layers):
        grid.add_row(f"L{layer}", *[SHORT.get(labels[(layer, h)][0], labels[(layer, h)][0][:4])
                                     if (layer, h) in labels else "·" for h in range(n_heads)])
    console.print(grid)
    print_rankings(df, console)
    for name, why in attrs.get("skipped", {}).items():
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
    report: Path | None = None,
) -> None:
    """The command body: library calls only, errors left to the caller.

    Under torchrun only rank 0 shows progress, warnings and results and writes ``out``.
    """
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from headlens.scoring.classification import classify, resolve_model
    from headlens.scoring.distributed import current
    from headlens.scoring.table import check_output_path, write_table
    from headlens.viz.report import check_report_path, write_report

    rank = current()
    quiet = quiet or not rank.is_main
    err = Console(stderr=True)
    if out is not None:
        check_output_path(out)  # fail before the scan, not after
    if report is not None:
        check_report_path(report)
    if prompts is not None and not prompts.is_file():
        raise ProbeError(f"prompts file {str(prompts)!r} does not exist")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loaded = resolve_model(model, device=rank.device(device), **(load_options or {}))
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      console=err, disable=quiet, transient=True) as bar:
            task = bar.add_task("scanning", total=None)

            def progress(done: int, total: int, stage: str) -> None:
                bar.update(task, completed=done, total=total, description=f"scanning {stage}")

            df = classify(loaded, detectors=detectors, prompts=prompts, n_prompts=n_prompts, seq_len=seq_len,
                          batch_size=batch_size, seed=seed, threshold=threshold, tl_compatible=tl_compatible,
                          progress=progress, truncate=truncate, corpus=corpus, scan_path=scan_path,
                          resume=resume)
        if df is None:  # a rank other than 0: its rows went to rank 0
            return
        if confirm:
            from headlens.scoring.distributed import single_process

            attrs = dict(df.attrs)
            with single_process():  # rank 0 alone: the other ranks are done
                df = _confirm_fn()(loaded, df)
            df.attrs.update(attrs)
    for w in caught:
        print(f"headlens: warning: {w.message}", file=sys.stderr)
    if out is not None:
        write_table(df, out)
        if not quiet:
            err.print(f"wrote {len(df)} rows to {out}")
    if report is not None:
        write_report(loaded, df, report)
        if not quiet:
            err.print(f"wrote the report to {report} (one page, opens offline)")
    print_results(df, Console(file=sys.stdout, width=max(100, Console().width)))


def register(app: typer.Typer) -> None:
    @app.command("classify")
    def classify_cmd(
        model: Annotated[str | None, typer.Option("--model", "-m", help="zoo name, .safetensors path, "
                         "hf:<dir>, hf:ORG/NAME[@REVISION] or minilm (default: the bundled default model)")] = None,
        detectors: Annotated[str | None, typer.Option("--detectors", "-d", help="comma-separated detector "
                             "names or module:attribute references to your own headlens.Detector (default: every "
                             "registered detector the model supports, headlens.detectors entry points included)")] = None,
        prompts: Annotated[Path | None, typer.Option("--prompts", "-p", help="your texts: one per line, or "
                           "JSONL with a 'text' field; JSONL rows with 'targets' (character spans) define "
                           "head types from data (see README) (default: generated probes)")] = None,
        corpus: Annotated[str | None, typer.Option("--corpus", help="'stdlib': real Python source (held-out "
                          "standard-library files) instead of generated probes")] = None,
        n_prompts: Annotated[int, typer.Option("--n-prompts", min=1, help="prompts per generated probe "
                             "(or corpus windows)")] = 64,
        seq_len: Annotated[int, typer.Option("--seq-len", min=8, help="tokens per generated prompt "
                           "(or corpus window), capped by the context")] = 64,
        batch_size: Annotated[int, typer.Option("--batch-size", min=1, help="prompts per forward pass")] = 32,
        seed: Annotated[int, typer.Option("--seed", help="seeds probes and bootstrap")] = 0,
        threshold: Annotated[float | None, typer.Option("--threshold", min=0.0, max=1.0, help="label when "
                             "ci_low >= this and lift >= 3 (default 0.4)")] = None,
        tl_compatible: Annotated[bool, typer.Option("--tl-compatible", help="TransformerLens detect_head "
                                 "numbers for its 3 head types")] = False,
        out: Annotated[Path | None, typer.Option("--out", "-o", help="write the scores table "
                       "(.csv, .parquet, .json), atomically")] = None,
        quiet: Annotated[bool, typer.Option("--quiet", "-q", help="no progress bar")] = False,
        truncate: Annotated[bool, typer.Option("--truncate", help="cut prompts longer than the context "
                            "(with a warning) instead of refusing them (exit 5)")] = False,
        confirm: Annotated[bool, typer.Option("--confirm", help="confirm labels by ablation "
                           "(headlens.interventions.confirm)")] = False,
        scan_path: Annotated[str, typer.Option("--scan-path", help="auto | dense (read the attention "
                             "pattern) | sparse (q, k and log-sum-exp, no T x T pattern: long contexts)")] = "auto",
        resume: opt.Resume = None,
        device: opt.Device = "cpu",
        device_map: opt.DeviceMap = None,
        max_memory: opt.MaxMemory = None,
        offload_folder: opt.OffloadFolder = None,
        dtype: opt.Dtype = "float32",
        trust_remote_code: opt.TrustRemoteCode = False,
        report: Annotated[Path | None, typer.Option("--report", help="also write one standalone HTML page "
                          "(grid, labelled heads with CIs, their patterns, provenance; opens offline)")] = None,
    ) -> None:
        """Score every head on every detector, label them, print the labelled heads.

        Under torchrun (torchrun --nproc-per-node N -m headlens classify ...) each rank scans a block
        of the prompts and rank 0 writes the table.
        """
        try:
            run_classify(model, detectors, prompts, n_prompts, seq_len, batch_size, seed, threshold,
                         tl_compatible, out, quiet, truncate, confirm, corpus, scan_path, resume, device,
                         {**opt.load_options(device_map, max_memory, offload_folder), "dtype": dtype,
                          "trust_remote_code": trust_remote_code}, report)
        except HeadlensError as e:  # one line and the class's exit code, also under CliRunner
            raise fail(e) from None
