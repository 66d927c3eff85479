"""``headlens circuit``: edges sender -> receiver.{q,k,v} with CIs and controls (thin layer over headlens.circuits)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from headlens.cli import options as opt

LEGEND = ("effect: the metric's change with the sender ablated on this path only (95% CI over prompts); control: "
          "the same for random senders of the sender's layer ('-': none); composition: how much the weights compose, "
          "z: against a null of random rotations; disagree: yes where the weights and the effect disagree; label: "
          "classify's labels, sender -> receiver")


def cached_scores(ref: str | None, dtype: str, device: str) -> Any:
    """A ``classify`` table of this model that is already on disk, or None: a zoo model's shipped scores, else
    the dashboard's store (:mod:`headlens.app.score_store`), both of the default scan. Reading them costs no
    scan, so ``circuit`` fills its ``label`` column whenever one exists."""
    from headlens.app import score_store
    from headlens.scoring import defaults
    from headlens.zoo import DEFAULT_MODEL
    from headlens.zoo import scores as shipped

    name = ref or DEFAULT_MODEL
    table = shipped.read(name, defaults.N_PROMPTS, defaults.SEED) if dtype == "float32" else None
    if table is None:
        try:
            table = score_store.read(name, defaults.N_PROMPTS, defaults.SEED, None, (dtype, device))
        except (OSError, ValueError):  # an unreadable store is only a missing label
            table = None
    return table


def render(df: Any, title: str, caption: str = LEGEND) -> Any:
    """A rich table of an edge table, largest effect first, its legend under it."""
    from rich.table import Table

    table = Table(title=title, caption=caption, caption_justify="left")
    for col in ("edge", "kv", "effect", "95% CI", "control", "composition", "z", "disagree", "label"):
        table.add_column(col, justify="left" if col in ("edge", "label") else "right", no_wrap=True)
    for _, r in df.iterrows():
        nan = r.control != r.control
        rp, sp = getattr(r, "receiver_pos", "all"), getattr(r, "sender_pos", "all")
        at_s = "" if sp == "all" or (r.input in ("q", "resid") and sp == rp) else f"@{sp}"
        at_r = "" if rp == "all" else f"@{rp}"
        table.add_row(f"{r.sender}{at_s} -> {r.receiver}.{r.input}{at_r}", "-" if r.kv_head < 0 else str(r.kv_head),
                      f"{r.effect:+.4f}", f"[{r.ci_low:+.4f}, {r.ci_high:+.4f}]",
                      "-" if nan else f"{r.control:+.4f}",
                      "-" if r.composition != r.composition else f"{r.composition:.3f}",
                      "-" if r.composition_z != r.composition_z else f"{r.composition_z:+.1f}",
                      "yes" if r.disagree else "", r.label)
    return table


def register(app: typer.Typer) -> None:
    @app.command("circuit")
    def circuit_cmd(
        model: opt.Model = None,
        receivers: Annotated[str | None, typer.Option(
            "--receivers", help="receiver heads (or logits), e.g. L1H0,L1H1; none: discover the circuit for --metric")] = None,
        senders: Annotated[str | None, typer.Option(
            "--senders", help="senders, e.g. L0H0,embed,mlp0 (default: all earlier)")] = None,
        inputs: Annotated[str, typer.Option("--inputs", help="receiver inputs: letters of qkv")] = "qkv",
        metric: Annotated[str, typer.Option("--metric", help="{metrics}; or receiver:DETECTOR (the receiver's own score, "
                                            "e.g. receiver:induction; q/k edges, nothing downstream)")] = "repeated_loss",
        method: Annotated[str, typer.Option("--method", help="{edge_methods}")] = "mean",
        positions: Annotated[str | None, typer.Option(
            "--positions", help="receiver positions the prompts name, e.g. END,S2 (or all): the receiver's output "
            "is patched there only; one row per position")] = None,
        sender_positions: Annotated[str | None, typer.Option(
            "--sender-positions", help="positions of the sender's write into a key or value, e.g. S2,IO "
            "(a query reads at its own position)")] = None,
        halves: Annotated[bool, typer.Option(
            "--position-halves", help="add the effect with the sender patched at t <= T/2 and after")] = False,
        per_group: Annotated[bool, typer.Option("--per-group", help="GQA: k/v edges per key/value group")] = False,
        prompts: opt.Prompts = None,
        out: opt.Out = None,
        report: Annotated[Path | None, typer.Option(
            "--report", help="also classify the heads (labels) and write an HTML report with the circuit graph")] = None,
        n_prompts: Annotated[int, typer.Option("--n-prompts", min=2, help="probe prompts")] = 32,
        n_control: Annotated[int, typer.Option("--n-control", min=0, help="random control senders per edge")] = 8,
        first_pass: Annotated[int | None, typer.Option(
            "--first-pass", min=1, help="discovery: patch only the top N candidates per round, ranked by edge "
            "attribution patching (every reported edge is still exact)")] = None,
        no_check: Annotated[bool, typer.Option(
            "--no-check", help="skip the run-time check (the strongest edge and one at random re-measured by path "
            "patching by freezing; exit 11 when they disagree)")] = False,
        seed: opt.Seed = 0,
        quiet: opt.Quiet = False,
        device: opt.Device = "cpu",
        dtype: opt.Dtype = "float32",
        trust_remote_code: opt.TrustRemoteCode = False,
    ) -> None:
        """Measure how heads work together: each edge's effect by exact path patching, with CI, control and composition."""
        from headlens.cli import precheck
        from headlens.zoo import names

        precheck.check_model(model)  # mistyped names: refused before torch loads
        opt.check_choice("edge ablation method", method, names.EDGE_METHODS)
        precheck.check_names("metric", metric, names.METRICS, keep="receiver:")
        from headlens.cli.ablate import prompts_arg

        prompts_arg(prompts)  # a bad prompts file: refused before torch loads
        if metric.startswith("receiver:"):
            from headlens.errors import ConfigError, DetectorError

            try:
                precheck.check_detectors(metric.partition(":")[2])
            except DetectorError as e:  # a bad circuit input: exit 2, like the library's own check
                raise ConfigError(str(e)) from None
        from rich.console import Console

        from headlens.circuits.local import is_receiver_metric, receiver_detector
        from headlens.circuits.nodes import parse_inputs
        from headlens.circuits.senders import check_method
        from headlens.cli.progress import progress
        from headlens.interventions.metrics import get_metric
        from headlens.probes.spans import read_rows
        from headlens.scoring.output import check_output, write_frame
        from headlens.viz.report import check_report_path, write_report
        from headlens.zoo import DEFAULT_MODEL

        check_method(method)
        if is_receiver_metric(metric):
            receiver_detector(metric)
        else:
            get_metric(metric)
        parse_inputs(inputs)
        if out is not None:
            check_output(out)
        if report is not None:
            check_report_path(report)
        texts = prompts_arg(prompts)  # "ioi", or a file's rows (which may name positions by character span)
        if isinstance(texts, list):
            texts = read_rows(prompts)
        from headlens.scoring.distributed import current

        main = os.environ.get("RANK", "0") in ("", "0")  # under torchrun rank 0 reports (the group is not up yet)
        # the phases (load, labels, patching) under one bar, opened before torch is imported
        with progress(f"loading {model or DEFAULT_MODEL}", quiet=quiet or not main) as bar:
            from headlens.circuits.api import circuit
            from headlens.scoring.classification import classify, resolve_model

            rank = current()  # under torchrun: ranks share the edges out
            m = resolve_model(model, device=rank.device(device), dtype=dtype, trust_remote_code=trust_remote_code)
            if report is not None:  # the report's labels: a classify of its own
                scores = classify(m, seed=seed, progress=lambda done, total, what: bar.update(
                    done, total, f"classifying: {what}"))
            else:
                scores = cached_scores(model, dtype, device)
            now = {"what": "patching edges", "total": None, "done": 0}  # the stage the library says it is in

            def stage(what: str, total: int, done: int) -> None:
                now.update(what=what, total=total, done=done)
                bar.update(done, total, what)

            def step(n: int) -> None:
                now["done"] += n
                bar.update(now["done"], now["total"], now["what"])

            df = circuit(m, receivers=receivers, senders=senders, inputs=inputs, metric=metric, method=method,
                         prompts=texts, n_prompts=n_prompts, n_control=n_control, per_group=per_group,
                         positions=True if halves else positions, sender_positions=sender_positions, seed=seed,
                         labels=scores, progress=step, first_pass=first_pass, stage=stage,
                         check=not no_check)
        err = Console(stderr=True, quiet=quiet or not rank.is_main)
        if df is None:  # a rank other than 0
            return
        if df.attrs.get("verdict") == "inconclusive":  # discovery found no evidence: say so, not an empty circuit
            print(f"inconclusive: {df.attrs['why']}")
        else:
            shown = df.sort_values("effect", key=abs, ascending=False)
            title = (f"{getattr(m, 'name', model)}: {metric}, {method} ablation on the direct path "
                     f"(clean {df.attrs['clean']:.4f})")
            caption = LEGEND if scores is not None else LEGEND + (
                " (empty: no classify of this model is cached; --report classifies it, or open the model once in "
                "headlens dashboard)")
            Console(width=None if sys.stdout.isatty() else 180).print(render(shown, title, caption))
        if df.attrs.get("composition_note"):
            err.print(df.attrs["composition_note"])
        if "first_pass" in df.attrs:
            fp = df.attrs["first_pass"]
            rho = f", Spearman {fp['spearman']:.2f} with the exact effects" if "spearman" in fp else ""
            err.print(f"first pass: patched {fp['kept']} of {fp['candidates']} candidate edges{rho}"
                      + (f" (all: {fp['skipped']})" if "skipped" in fp else ""))
        if df.attrs.get("verdict") != "inconclusive" and "faithfulness" in df.attrs:
            from headlens.circuits.faithfulness import describe

            for line in describe(df.attrs):
                err.print(line)
        if out is not None:
            write_frame(df, out)
            err.print(f"wrote {out}")
        if report is not None:
            write_report(m, scores, report, edges=df)
            err.print(f"wrote {report}")
