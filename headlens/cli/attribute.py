"""``headlens attribute``: which heads write a prediction (thin layer over headlens.attribute, direct logit attribution)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from headlens.cli import options as opt


def render(rows: Any, title: str) -> Any:
    """A rich table of summary rows: component, mean attribution, its 95 % CI, share of the total."""
    from rich.table import Table

    table = Table(title=title, caption="attribution: what the component writes into the logit (the final norm's "
                  "scale frozen), mean over prompts, 95% CI over prompts ('-': one prompt); share: of the total",
                  caption_justify="left")
    for col in ("component", "attribution", "95% CI", "share"):
        table.add_column(col, justify="left" if col == "component" else "right", no_wrap=True)
    for _, r in rows.iterrows():
        ci = "-" if r.ci_low != r.ci_low else f"[{r.ci_low:+.3f}, {r.ci_high:+.3f}]"
        table.add_row(r.component, f"{r.attribution:+.3f}", ci, f"{r.share:+.1%}")
    return table


def register(app: typer.Typer) -> None:
    @app.command("attribute")
    def attribute_cmd(
        model: opt.Model = None,
        prompt: Annotated[str | None, typer.Option("--prompt", help="one text to attribute")] = None,
        prompts: opt.Prompts = None,
        target: Annotated[str | None, typer.Option(
            "--target", help="the token whose logit is decomposed, one token with its leading space (' Paris'); "
            "default: the model's own top prediction")] = None,
        contrast: Annotated[str | None, typer.Option(
            "--contrast", help="two tokens A,B: decompose logit(A) - logit(B), e.g. ' Mary, John'")] = None,
        metric: Annotated[str | None, typer.Option(
            "--metric", help="logit_diff: each IOI prompt's IO - S (the default with --prompts ioi)")] = None,
        position: Annotated[str | None, typer.Option(
            "--position", help="where the logits are read: a token index (-1 = last), a named position of the "
            "probe (IOI: END, S2, ...) or 'all' (default: each prompt's last token; IOI's END)")] = None,
        top: Annotated[int, typer.Option("--top", min=1, help="writers and suppressors shown")] = 10,
        n_prompts: Annotated[int, typer.Option("--n-prompts", min=2, help="IOI prompts (--prompts ioi)")] = 128,
        batch_size: Annotated[int | None, typer.Option("--batch-size", min=1, help="prompts per forward")] = None,
        n_boot: Annotated[int, typer.Option("--n-boot", min=10, help="bootstrap resamples for the CIs")] = 1000,
        out: opt.Out = None,
        seed: opt.Seed = 0,
        quiet: opt.Quiet = False,
        device: opt.Device = "cpu",
        dtype: opt.Dtype = "float32",
        trust_remote_code: opt.TrustRemoteCode = False,
    ) -> None:
        """Direct logit attribution: how much each head, MLP and the embedding writes into a logit (the final
        norm's scale frozen), mean over prompts with bootstrap CIs; --out writes the tidy table."""
        run_attribute(model, prompt, prompts, target, contrast, metric, position, top, n_prompts, batch_size, n_boot,
                      out, seed, quiet, device, dtype, trust_remote_code)


def run_attribute(model: str | None, prompt: str | None, prompts: Path | None, target: str | None,
                  contrast: str | None, metric: str | None, position: str | None, top: int, n_prompts: int,
                  batch_size: int | None, n_boot: int, out: Path | None, seed: int, quiet: bool, device: str,
                  dtype: str, trust_remote_code: bool) -> None:
    """The command body: every argument checked before the model loads."""
    from headlens.cli.precheck import check_model

    check_model(model)  # a mistyped name: refused before torch loads
    from headlens.cli.ablate import prompts_arg

    prompts_arg(prompts)  # a bad prompts file: refused before torch loads
    from rich.console import Console

    from headlens.cli.ablate import prompts_arg
    from headlens.cli.progress import is_terminal, progress
    from headlens.errors import ConfigError
    from headlens.readout.dla import attribute
    from headlens.scoring.classification import resolve_model
    from headlens.scoring.output import check_output, write_frame
    from headlens.scoring.writers import attribution_summary, strongest
    from headlens.zoo import DEFAULT_MODEL

    if (prompt is None) == (prompts is None):
        raise ConfigError("give --prompt TEXT or --prompts FILE (or --prompts ioi), one of them")
    given = [n for n, v in (("--target", target), ("--contrast", contrast), ("--metric", metric)) if v is not None]
    if len(given) > 1:
        raise ConfigError(f"give one of --target, --contrast and --metric, not {' and '.join(given)}")
    dtype = opt.check_dtype(dtype)
    if out is not None:
        check_output(out)
    texts: Any = [prompt] if prompt is not None else prompts_arg(prompts)
    at: int | str | None = int(position) if position is not None and position.lstrip("-").isdigit() else position
    err = Console(stderr=True, quiet=quiet)
    if is_terminal():
        err.print(f"loading {model or DEFAULT_MODEL} ...")
    m = resolve_model(model, device=device, dtype=dtype, trust_remote_code=trust_remote_code)
    with progress("attributing", quiet=quiet) as bar:
        df = attribute(m, texts, target=target, position=at, contrast=contrast, metric=metric, n_prompts=n_prompts,
                       seed=seed, batch_size=batch_size, progress=lambda done, total: bar.update(done, total))
    summary = attribution_summary(df, n_boot=n_boot, seed=seed)
    writers, suppressors = strongest(summary, top)
    tot, n = summary.attrs["total"], int(summary.n_prompts.iloc[0])
    what = str(summary.target.iloc[0])
    head = (f"{getattr(m, 'name', model)}: direct logit attribution to {what}, mean over {n} prompt(s); total "
            f"{tot['mean']:+.3f}" + (f" [{tot['ci_low']:+.3f}, {tot['ci_high']:+.3f}]" if n > 1 else ""))
    console = Console(width=None if sys.stdout.isatty() else 160)
    console.print(head)
    console.print(render(writers, "strongest writers"))
    console.print(render(suppressors, "strongest suppressors"))
    bias = summary[summary.component == "bias"].attribution
    err.print(f"bias {float(bias.iloc[0]):+.3f}; the parts sum to the model's logits within "
              f"{df.attrs['max_error']:.1g}" + (f" (logits before the soft-cap {df.attrs['softcap']:g})"
                                                if df.attrs.get("softcap") else ""))
    if out is not None:
        write_frame(df, out)
        err.print(f"wrote {len(df)} rows to {out} (provenance: {'sidecar ' + out.name + '.json' if out.suffix.lower() == '.csv' else 'in the file'})")
