"""What ``headlens classify`` prints by default: a summary that fits a screen.

For each head type its strongest heads (score, 95 % CI, lift, and ``rest``: the head's attention on the
first token) and how many heads carry the label (:func:`headlens.scoring.summary.type_summaries`), the
layer x head grid of each head's strongest label where it fits the terminal, and where the full table
went. ``--all`` prints every labelled row instead (:func:`headlens.cli.classify.print_results`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from headlens.viz.grid import fmt_number

MAX_GRID_LAYERS = 48  # taller grids go to --report and the dashboard, not the terminal



def _cells(t: Any, r: Any, chance: float | None) -> list[str]:
    """score (or preference), CI, lift (over chance with distractors), rest of one listed head."""
    rest = fmt_number(getattr(r, "rest", None), ".2f")
    if t.weights:
        return [fmt_number(r.score), "weights", "-", rest]
    if t.preference:
        lift = float(r.preference) / chance if chance else float("nan")
        ci = f"[{fmt_number(r.preference_ci_low)}, {fmt_number(r.preference_ci_high)}]"
        return [fmt_number(r.preference), ci, fmt_number(lift, ".1f"), rest]
    return [fmt_number(r.score), f"[{fmt_number(r.ci_low)}, {fmt_number(r.ci_high)}]", fmt_number(r.lift, ".1f"), rest]


def type_table(df: Any, summaries: list[Any]) -> Any:
    """The rich table of the labelled types (and rankings with distractors), three heads each."""
    from rich import box
    from rich.table import Table

    from headlens.scoring.primary import preference_chance

    table = Table(box=box.SIMPLE_HEAD, show_edge=False, padding=(0, 1))
    for col in ("type", "labels", "head", "score", "95% CI", "lift", "rest"):
        table.add_column(col, justify="left" if col in ("type", "head") else "right", no_wrap=True)
    for t in summaries:
        if t.n_labelled == 0 and not t.preference:
            continue
        chance = preference_chance(df, t.detector) if t.preference else None
        name = t.detector + (" (weights)" if t.weights else " (preference)" if t.preference else "")
        count = f"{t.n_labelled}" + (f" ({t.n_only} only)" if t.resting else "")
        if t.heads.empty:  # a resting type whose heads all do something else too (their rest: the rest column)
            table.add_row(name, count, "none", "", "", "", "")
        for i, r in enumerate(t.heads.itertuples()):
            table.add_row(name if i == 0 else "", count if i == 0 else "", f"L{r.layer}H{r.head}", *_cells(t, r, chance))
    return table


def grid_table(df: Any) -> tuple[Any, list[str]]:
    """Layer x head: each head's strongest label (:func:`headlens.scoring.primary.label_order`), a resting
    label dim: only heads that do nothing else show one. Also the detectors shown, for the legend."""
    from rich import box
    from rich.table import Table

    from headlens.scoring.primary import is_resting
    from headlens.scoring.table import head_labels
    from headlens.viz.grid import label_mark

    labels = head_labels(df)
    n_layers, n_heads = int(df.attrs.get("n_layers", 0)), int(df.attrs.get("n_heads", 0))
    grid = Table(box=box.SIMPLE_HEAD, show_edge=False, padding=(0, 1))
    grid.add_column("")
    for h in range(n_heads):
        grid.add_column(f"H{h}", justify="center", no_wrap=True)
    shown: dict[str, None] = {}
    for layer in range(n_layers):
        cells = []
        for h in range(n_heads):
            det = labels.get((layer, h), [None])[0]
            cells.append("·" if det is None else f"[dim]{label_mark(det)}[/dim]" if is_resting(det) else label_mark(det))
            if det is not None:
                shown[det] = None
        grid.add_row(f"L{layer}", *cells)
    return grid, list(shown)


def grid_fits(df: Any, width: int) -> bool:
    """Whether the layer x head grid fits a terminal ``width`` columns wide (and :data:`MAX_GRID_LAYERS` tall)."""
    n_layers, n_heads = int(df.attrs.get("n_layers", 0)), int(df.attrs.get("n_heads", 0))
    return 0 < n_layers <= MAX_GRID_LAYERS and 6 + 4 * n_heads <= width


def print_summary(df: Any, console: Any, out: Path | None = None) -> None:
    """The default output of ``headlens classify`` (module docstring); ``out``: where ``--out`` wrote the table."""
    from headlens.scoring.summary import type_summaries
    from headlens.viz.grid import label_mark

    attrs = df.attrs
    L, H = int(attrs.get("n_layers", 0)), int(attrs.get("n_heads", 0))
    summaries = type_summaries(df)
    console.print(f"[bold]{attrs.get('model', '?')}[/bold]: {L * H} heads ({L} layers x {H}), "
                  f"{attrs.get('scoring', 'headlens')} scores; rest = attention on the first token", highlight=False)
    if any(t.n_labelled or t.preference for t in summaries):
        console.print(type_table(df, summaries))
    else:
        console.print("no head passes the label rule (ci_low >= threshold and lift >= 3)")
    unlabelled = [t.detector for t in summaries if t.n_labelled == 0 and not t.preference]
    if unlabelled:
        console.print(f"[dim]no label: {', '.join(unlabelled)}[/dim]", highlight=False)
    if grid_fits(df, console.width):
        grid, shown = grid_table(df)
        console.print(grid)
        legend = ", ".join(f"{label_mark(d)} {d}" for d in sorted(shown, key=label_mark))
        console.print(f"[dim]strongest label per head ({legend or 'none'}; · no label; a dim mark: rests and does "
                      f"nothing else)[/dim]", highlight=False)
    else:
        console.print(f"[dim]the {L} x {H} grid does not fit here: --report FILE.html, or headlens dashboard[/dim]",
                      highlight=False)
    where = f"in {out}" if out is not None else "not written (--out scores.csv|.parquet|.json)"
    console.print(f"[dim]full table ({len(df)} rows): {where}; every labelled row: --all[/dim]", highlight=False)


def print_confirmation(df: Any, console: Any) -> None:
    """``--confirm``: per type, its strongest heads ablated together against random heads of the same layers
    (:func:`headlens.interventions.confirm.confirm`)."""
    from rich import box
    from rich.table import Table

    results = df.attrs.get("confirmation")
    if results is None:
        return
    cfg = df.attrs.get("confirmation_settings", {})
    console.print(f"[bold]ablation check[/bold]: {cfg.get('method', 'mean')} ablation of each type's strongest "
                  f"heads together, {cfg.get('n_prompts', '?')} prompts; control: {cfg.get('n_control', '?')} random "
                  f"groups of as many heads in the same layers", highlight=False)
    if not results:
        console.print("[dim]no labelled type to test[/dim]")
        return
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, padding=(0, 1))
    for col in ("type", "heads", "metric", "clean", "ablated - clean", "95% CI", "random heads", "confirmed"):
        table.add_column(col, justify="left" if col in ("type", "heads", "metric", "confirmed") else "right",
                         no_wrap=col != "confirmed")
    for r in results:
        verdict = f"untested: {r['error']}" if r.get("error") else ("yes" if r["confirmed"] else "no")
        table.add_row(r["detector"], r["heads"], r["metric"], fmt_number(r["clean"]), fmt_number(r["delta"], "+.3f"),
                      f"[{fmt_number(r['ci_low'], '+.3f')}, {fmt_number(r['ci_high'], '+.3f')}]", fmt_number(r["control_delta"], "+.3f"),
                      verdict)
    console.print(table)
