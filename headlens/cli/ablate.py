"""``headlens ablate``: knock heads out and measure what breaks (thin layer over headlens.interventions.sweep)."""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Annotated, Any

import typer

from headlens.cli import options as opt
from headlens.errors import OutputError, ProbeError


def read_prompts(path: Path) -> list[str]:
    """One prompt per line, or JSONL with a ``text`` field; blank lines skipped."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as err:
        raise ProbeError(f"cannot read prompts file {str(path)!r}: {err}") from None
    prompts = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        if line.lstrip().startswith("{"):
            try:
                line = str(json.loads(line)["text"])
            except (json.JSONDecodeError, KeyError, TypeError):
                raise ProbeError(f"{path}:{n}: a JSONL line needs a 'text' field") from None
        prompts.append(line)
    if not prompts:
        raise ProbeError(f"prompts file {str(path)!r} has no prompts (one per line)")
    return prompts


def check_output(path: Path) -> None:
    """Refuse an unknown suffix or a missing / read-only folder before any work is done."""
    suffix = path.suffix.lower()
    if suffix not in (".csv", ".json", ".parquet"):
        raise OutputError(f"unknown output suffix {suffix or '(none)'!r} for {str(path)!r}; use .csv, .json or .parquet")
    if not path.parent.is_dir():
        raise OutputError(f"cannot write {str(path)!r}: folder {str(path.parent)!r} does not exist")
    if not os.access(path.parent, os.W_OK):
        raise OutputError(f"cannot write {str(path)!r}: folder {str(path.parent)!r} is not writable")


def write_table(df: Any, path: Path) -> None:
    """Write ``df`` atomically as .csv, .json or .parquet (``OutputError`` otherwise)."""
    check_output(path)
    suffix = path.suffix.lower()
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=suffix)
    except OSError as err:
        raise OutputError(f"cannot write {str(path)!r}: {err.strerror}") from None
    os.close(fd)
    try:
        if suffix == ".csv":
            df.to_csv(tmp, index=False)
        elif suffix == ".json":
            df.to_json(tmp, orient="records", indent=1)
        else:
            df.to_parquet(tmp, index=False)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def render(df: Any, title: str) -> Any:
    """A rich table of a sweep result (worst effect first)."""
    from rich.table import Table

    table = Table(title=title)
    for col in ("heads", "metric", "clean", "ablated", "delta", "95% CI", "control Δ", "beats control",
                "attribution"):
        table.add_column(col, justify="left" if col in ("heads", "metric") else "right", no_wrap=True)
    for _, r in df.iterrows():
        table.add_row(
            r.heads, r.metric, f"{r.clean:.4f}", f"{r.ablated:.4f}",
            f"{r.delta:+.4f}", f"[{r.ci_low:+.4f}, {r.ci_high:+.4f}]",
            "-" if r.control_delta != r.control_delta else f"{r.control_delta:+.4f}",
            "yes" if r.beats_control else "no",
            "-" if r.attribution != r.attribution else f"{r.attribution:+.4f}",
        )
    return table


def register(app: typer.Typer) -> None:
    @app.command("ablate")
    def ablate_cmd(
        model: Annotated[str | None, typer.Option(help="model reference (default: the bundled default model)")] = None,
        heads: Annotated[str | None, typer.Option(help="heads ablated together, e.g. L1H2,L0H3")] = None,
        method: Annotated[str, typer.Option(help="zero | mean | resample | uniform")] = "zero",
        metric: Annotated[str, typer.Option(
            help="comma-separated: repeated_loss, first_half_loss, bracket_accuracy, lm_loss, kl")] = "repeated_loss",
        prompts: Annotated[Path | None, typer.Option(help="prompts file (one per line, or JSONL with 'text')")] = None,
        sweep_all: Annotated[bool, typer.Option("--sweep", help="also ablate every single head")] = False,
        out: Annotated[Path | None, typer.Option(help="write the table to .csv, .json or .parquet")] = None,
        n_prompts: Annotated[int, typer.Option(min=2, help="probe prompts per metric")] = 32,
        n_control: Annotated[int, typer.Option(min=0, help="random control groups per group")] = 8,
        control: Annotated[str, typer.Option(
            help="where control heads are drawn: layer (the group's own layers), model (anywhere), "
                 "auto (layer while the group's layers have heads to spare, else model)")] = "auto",
        seed: Annotated[int, typer.Option(help="seeds probes, controls, resampling, bootstrap")] = 0,
        resume: opt.Resume = None,
        device: opt.Device = "cpu",
        dtype: opt.Dtype = "float32",
        trust_remote_code: opt.TrustRemoteCode = False,
    ) -> None:
        """Ablate heads (zero, mean, resample or uniform attention) and report the effect on task metrics with CIs and controls."""
        from rich.console import Console
        from rich.progress import Progress

        from headlens.interventions.ablation import AblationError, check_method, parse_heads
        from headlens.interventions.metrics import get_metric
        from headlens.interventions.sweep import sweep
        from headlens.scoring.classification import resolve_model
        from headlens.scoring.distributed import current
        from headlens.zoo import DEFAULT_MODEL

        check_method(method)
        metrics = [get_metric(m.strip()).name for m in metric.split(",") if m.strip()]
        if out is not None:
            check_output(out)
        if not heads and not sweep_all:
            raise AblationError("give --heads L1H2,... or --sweep (every single head)")
        texts = read_prompts(prompts) if prompts is not None else None
        rank = current()  # under torchrun: ranks share the head groups out, rank 0 reports
        err = Console(stderr=True, quiet=not rank.is_main)
        err.print(f"loading {model or DEFAULT_MODEL} ...")
        # None: the bundled default, else another zoo model
        m = resolve_model(model, device=rank.device(device), dtype=dtype, trust_remote_code=trust_remote_code)
        groups: list[Any] = [tuple(parse_heads(heads, m.n_layers, m.n_heads))] if heads else []
        if sweep_all:
            groups += [((layer, h),) for layer in range(m.n_layers) for h in range(m.n_heads)]
        groups = list(dict.fromkeys(groups))
        with Progress(console=err, transient=True, disable=not rank.is_main) as bar:
            task = bar.add_task("ablating", total=None)
            df = sweep(m, groups=groups, method=method, metrics=metrics, prompts=texts, n_prompts=n_prompts,
                       n_control=n_control, control=control, seed=seed, resume=resume,
                       progress=lambda done, total: bar.update(task, completed=done, total=total))
        if df is None:  # a rank other than 0: its head groups went to rank 0
            return
        shown = df.sort_values("delta", key=abs, ascending=False) if sweep_all else df
        Console(width=None if sys.stdout.isatty() else 160).print(render(shown, f"{getattr(m, 'name', model)}: {method} ablation"))
        for name, rho in df.attrs.get("attribution_spearman", {}).items():
            if rho == rho:
                err.print(f"attribution patching vs exact ({name}): Spearman {rho:.3f}")
        if out is not None:
            write_table(df, out)
            err.print(f"wrote {out}")
