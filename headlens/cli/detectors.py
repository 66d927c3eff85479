"""``headlens detectors``: every head type this install can score, as the registry knows it."""

from __future__ import annotations

from typing import Annotated

import typer


def rows() -> list[dict[str, str]]:
    """One dict per registered detector (plugins included): name, mark, kind, threshold, probe, description."""
    from headlens.detectors import all_detectors
    from headlens.scoring.stats import default_threshold
    from headlens.viz.grid import label_mark

    out = []
    for name, d in all_detectors().items():
        tau = f"{default_threshold(d):g}" if d.gate is None else "null"  # gated: against the type's null
        probe = d.probe or ("the weights (no probe)" if d.kind == "weights" else "annotated prompts (--prompts)")
        extra = [] if d.default else ["scored only when named with --detectors"]
        if d.bidirectional_only:
            extra.append("bidirectional models only")
        if d.gate is not None:
            extra.append(f"the label also needs {d.gate.name}'s CI {'above' if d.gate.sign > 0 else 'below'} 0 "
                         f"({d.gate.description})")
        out.append({"name": name, "mark": label_mark(name), "kind": d.kind, "threshold": tau,
                    "probe": probe, "description": "; ".join([d.description, *extra])})
    return out


def register(app: typer.Typer) -> None:
    @app.command("detectors")
    def detectors_cmd(
        as_json: Annotated[bool, typer.Option("--json", help="print the list as JSON")] = False,
    ) -> None:
        """List the head types: name, grid mark, kind, label threshold, the probe it needs, what it finds."""
        import json

        found = rows()
        if as_json:
            typer.echo(json.dumps(found, indent=1))
            return
        from rich.console import Console
        from rich.table import Table

        table = Table(title="headlens detectors", caption="threshold: kappa on the strength scale, a head is "
                      "labelled when (ci_low - chance) / (1 - chance) >= it; weights: tau, ci_low >= it, lift >= 3 "
                      "and above their null's interval; null: the CI above chance, and the gate")
        for col in ("name", "mark", "kind", "threshold", "probe", "description"):
            table.add_column(col, justify="right" if col == "threshold" else "left")
        for r in found:
            table.add_row(*r.values())
        Console().print(table)
