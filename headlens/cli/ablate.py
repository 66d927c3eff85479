"""``headlens ablate``: knock heads out and measure what breaks (thin layer over headlens.interventions.sweep)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from headlens.cli import options as opt
from headlens.cli.failure import fail
from headlens.errors import HeadlensError, ProbeError
from headlens.probes.prompt_file import utf8_lines


def read_prompts(path: Path) -> list[str]:
    """One prompt per line, each line plain text or a JSON object with a ``text`` field; blank lines skipped.
    The bytes are read as :func:`headlens.probes.prompt_file.utf8_lines` reads them (UTF-16, invalid UTF-8
    and NUL bytes refused naming the line)."""
    try:
        lines = utf8_lines(path.read_bytes(), str(path))
    except OSError as err:
        raise ProbeError(f"cannot read prompts file {str(path)!r}: {err.strerror or err}") from None
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


def prompts_arg(path: Path | None) -> list[str] | str | None:
    """``--prompts``: ``ioi`` names the IOI probe (``headlens.probes.ioi``); anything else is a prompts file."""
    if path is not None and str(path).strip().lower() == "ioi":
        return "ioi"
    return read_prompts(path) if path is not None else None


LEGEND = ("delta: ablated - clean, 95% CI over prompts; control Δ: the delta of random groups of as many heads "
          "(--n-control, --control); beats control: the CI of delta - control Δ clears 0 in the harmful direction "
          "('-': no control measured); attribution: the one-pass estimate of a single head's delta (attribution "
          "patching; '-' for groups)")


def render(df: Any, title: str) -> Any:
    """A rich table of a sweep result (worst effect first), its legend under it."""
    from rich.table import Table

    table = Table(title=title, caption=LEGEND, caption_justify="left")
    for col in ("heads", "metric", "clean", "ablated", "delta", "95% CI", "control Δ", "beats control",
                "attribution"):
        table.add_column(col, justify="left" if col in ("heads", "metric") else "right", no_wrap=True)
    for _, r in df.iterrows():
        table.add_row(
            r.heads, r.metric, f"{r.clean:.4f}", f"{r.ablated:.4f}",
            f"{r.delta:+.4f}", f"[{r.ci_low:+.4f}, {r.ci_high:+.4f}]",
            "-" if r.control_delta != r.control_delta else f"{r.control_delta:+.4f}",
            "-" if r.control_delta != r.control_delta else "yes" if r.beats_control else "no",
            "-" if r.attribution != r.attribution else f"{r.attribution:+.4f}",
        )
    return table


def register(app: typer.Typer) -> None:
    @app.command("ablate")
    def ablate_cmd(
        model: opt.Model = None,
        heads: Annotated[str | None, typer.Option("--heads", help="heads ablated together, e.g. L1H2,L0H3")] = None,
        method: Annotated[str, typer.Option("--method", help="{methods}")] = "zero",
        metric: Annotated[str, typer.Option("--metric", help="comma-separated: {metrics}")] = "repeated_loss",
        prompts: opt.Prompts = None,
        corpus: opt.Corpus = None,
        sweep_all: Annotated[bool, typer.Option("--sweep", help="also ablate every single head")] = False,
        out: opt.Out = None,
        n_prompts: Annotated[int, typer.Option("--n-prompts", min=2, help="probe prompts per metric")] = 32,
        seq_len: Annotated[int | None, typer.Option("--seq-len", min=8, help="tokens per generated probe "
                           "prompt, capped by the context (default: each metric's probe's own)")] = None,
        batch_size: Annotated[int | None, typer.Option("--batch-size", min=1, help="prompt rows per forward "
                              "pass when head groups are stacked (speed only; default 4096 tokens' worth)")] = None,
        n_control: Annotated[int, typer.Option("--n-control", min=0, help="random control groups per group")] = 8,
        control: Annotated[str, typer.Option(
            "--control", help="{controls}: where control heads are drawn: the group's own layers, anywhere, or "
            "auto (layer while the group's layers have heads to spare, else model)")] = "auto",
        seed: opt.Seed = 0,
        quiet: opt.Quiet = False,
        resume: opt.Resume = None,
        device: opt.Device = "cpu",
        dtype: opt.Dtype = "float32",
        trust_remote_code: opt.TrustRemoteCode = False,
    ) -> None:
        """Ablate heads (zero, mean, resample or uniform attention) and report the effect on task metrics
        with CIs and random-head controls; the table is headlens.sweep(...)."""
        try:
            run_ablate(model, heads, method, metric, prompts, corpus, sweep_all, out, n_prompts, seq_len, batch_size,
                       n_control, control, seed, quiet, resume, device, dtype, trust_remote_code)
        except HeadlensError as e:  # one line and the class's exit code, also under CliRunner
            raise fail(e) from None


def run_ablate(model: str | None, heads: str | None, method: str, metric: str, prompts: Path | None,
               corpus: str | None, sweep_all: bool, out: Path | None, n_prompts: int, seq_len: int | None,
               batch_size: int | None, n_control: int, control: str, seed: int, quiet: bool, resume: Path | None,
               device: str, dtype: str, trust_remote_code: bool) -> None:
    """The command body: every argument checked before the model loads, errors left to the caller."""
    from headlens.cli import precheck
    from headlens.zoo import names

    precheck.check_model(model)  # mistyped names: refused before torch loads
    opt.check_choice("ablation method", method, names.METHODS)
    precheck.check_names("metric", metric, names.METRICS)
    opt.check_choice("--control", control, names.CONTROLS)
    if corpus is None:  # a bad prompts file (UTF-16, binary, wrong JSONL): refused before torch loads
        prompts_arg(prompts)
    from rich.console import Console

    from headlens.cli.progress import is_terminal, progress
    from headlens.interventions.ablation import AblationError, check_method, parse_heads
    from headlens.interventions.metrics import get_metric
    from headlens.interventions.sweep import sweep
    from headlens.scoring.classification import resolve_model
    from headlens.scoring.distributed import current
    from headlens.scoring.output import check_output, write_frame
    from headlens.zoo import DEFAULT_MODEL

    check_method(method)
    metrics = [get_metric(m.strip()).name for m in metric.split(",") if m.strip()]
    if not metrics:
        raise AblationError(f"--metric {metric!r} names no metric")
    dtype = opt.check_dtype(dtype)
    if corpus is not None and prompts is not None:
        raise AblationError("give --prompts or --corpus, not both")
    if out is not None:
        check_output(out)
    if not heads and not sweep_all:
        raise AblationError("give --heads L1H2,... or --sweep (every single head)")
    texts = prompts_arg(prompts)
    rank = current()  # under torchrun: ranks share the head groups out, rank 0 reports
    quiet = quiet or not rank.is_main
    err = Console(stderr=True, quiet=quiet)
    if is_terminal():  # progress talk: in a log, the progress lines and the result say enough
        err.print(f"loading {model or DEFAULT_MODEL} ...")
    m = resolve_model(model, device=rank.device(device), dtype=dtype, trust_remote_code=trust_remote_code)
    groups: list[Any] = [tuple(parse_heads(heads, m.n_layers, m.n_heads))] if heads else []
    if sweep_all:
        groups += [((layer, h),) for layer in range(m.n_layers) for h in range(m.n_heads)]
    groups = list(dict.fromkeys(groups))
    with progress("ablating", quiet=quiet) as bar:
        df = sweep(m, groups=groups, method=method, metrics=metrics, prompts=texts, n_prompts=n_prompts,
                   n_control=n_control, control=control, seed=seed, resume=resume, seq_len=seq_len, corpus=corpus,
                   batch_size=batch_size, progress=lambda done, total: bar.update(done, total))
    if df is None:  # a rank other than 0: its head groups went to rank 0
        return
    shown = df.sort_values("delta", key=abs, ascending=False) if sweep_all else df
    Console(width=None if sys.stdout.isatty() else 160).print(render(shown, f"{getattr(m, 'name', model)}: {method} ablation"))
    for name, rho in df.attrs.get("attribution_spearman", {}).items():
        if rho == rho:
            err.print(f"attribution patching vs exact ({name}): Spearman {rho:.3f}")
    if out is not None:
        write_frame(df, out)
        err.print(f"wrote {len(df)} rows to {out} (provenance: {'sidecar ' + out.name + '.json' if out.suffix.lower() == '.csv' else 'in the file'})")
