"""What ``headlens classify`` prints by default: a summary that fits a screen.

For each head type (what heads do on text first, weight scores after, resting last) its strongest heads
(strength on the one scale of every type, score, 95 % CI, and ``rest``: the head's attention on the first
token) and how many heads carry the label (:func:`headlens.scoring.summary.type_summaries`), the
layer x head grid of each head's strongest label where it fits the terminal, and where the full table
went. ``--all`` prints every labelled row instead (:func:`headlens.cli.classify.print_results`).
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

from headlens.scoring.primary import LABEL_RULE
from headlens.viz.grid import fmt_number

MAX_GRID_LAYERS = 48  # taller grids go to --report and the dashboard, not the terminal
MAX_LINES = 60  # the summary of a model whose grid fits: types list fewer heads rather than pass this



def _cells(t: Any, r: Any, power: float) -> list[str]:
    """strength, score (or preference), CI, rest of one listed head. Lift is left to ``--all`` and the table:
    it compares heads of one type, and this table lists many types."""
    rest = fmt_number(getattr(r, "rest", None), ".2f")
    power_cell = fmt_number(power, ".2f")
    if t.weights:
        return [power_cell, fmt_number(r.score), "weights", rest]
    if t.preference:
        ci = f"[{fmt_number(r.preference_ci_low)}, {fmt_number(r.preference_ci_high)}]"
        return [power_cell, fmt_number(r.preference), ci, rest]
    return [power_cell, fmt_number(r.score), f"[{fmt_number(r.ci_low)}, {fmt_number(r.ci_high)}]", rest]


def type_name(t: Any) -> str:
    """A type's name in the table: ``(pref)`` with distractors, ``(rests)`` for a resting type (the legend says
    which types are read from the weights and how many heads only rest)."""
    return t.detector + (" (pref)" if t.preference else " (rests)" if t.resting else "")


def type_table(df: Any, summaries: list[Any]) -> Any:
    """The rich table of the labelled types (and rankings with distractors), three heads each."""
    from rich import box
    from rich.table import Table

    from headlens.scoring.primary import strength
    from headlens.viz.grid import label_mark

    table = Table(box=box.SIMPLE_HEAD, show_edge=False, padding=(0, 1, 0, 0), pad_edge=False)  # 80 columns
    for col in ("type", "mark", "n", "head", "strength", "score", "95% CI", "rest"):
        table.add_column(col, justify="left" if col in ("type", "mark", "head") else "right", no_wrap=True)
    for t in summaries:
        if t.n_labelled == 0 and not t.preference:
            continue
        count = str(t.n_labelled)
        mark = label_mark(t.detector)  # the grid's abbreviation
        if t.heads.empty:  # a resting type whose heads all do something else too: listed under that type
            table.add_row(type_name(t), mark, count, "(all listed under another type)", "", "", "", "")
        powers = strength(t.heads).tolist() if not t.heads.empty else []
        for i, r in enumerate(t.heads.itertuples()):
            first = i == 0
            table.add_row(type_name(t) if first else "", mark if first else "", count if first else "",
                          f"L{r.layer}H{r.head}", *_cells(t, r, powers[i]))
    return table


def legend(summaries: list[Any]) -> str:
    """The lines under the type table: what each column means, which types are read from the weights, and how
    each resting type's heads are listed (one line each, so none ends mid-sentence where a terminal wraps)."""
    parts = ["n: heads with the label; strength: (score - chance) / (1 - chance), one scale for all types "
             "(lift, within a type: --all); rest: first-token attention"]
    if any(t.preference for t in summaries):
        parts[0] += "; (pref): preference accuracy"
    if ov := [t.detector for t in summaries if t.ov and t.n_labelled]:
        parts.append(f"read from the weights (what the OV circuit would write), not from attention on text: "
                     f"{', '.join(ov)}")
    parts += [_resting_words(t) for t in summaries if t.resting and t.n_labelled]
    return "\n".join(parts)


def _resting_words(t: Any) -> str:
    """How a resting type's heads are listed: those that only rest under it (as many as the table shows), the
    others under what else they do."""
    one, shown = t.n_labelled == 1, len(t.heads)
    if t.n_only == 0:
        return (f"{t.detector}: its {t.n_labelled} {'head does' if one else 'heads do'} something else too, "
                f"listed there")
    listed = "listed" if shown >= t.n_only else f"the strongest {shown} listed"
    if t.n_only == t.n_labelled:
        return f"{t.detector}: its {t.n_labelled} {'head only rests' if one else 'heads only rest'} ({listed})"
    return (f"{t.detector}: {t.n_only} of {t.n_labelled} heads only rest ({listed}), the others are listed under "
            f"what else they do")


def grid_table(df: Any) -> Any:
    """Layer x head: each head's strongest label (:func:`headlens.scoring.primary.label_order`), a resting
    label dim: only heads that do nothing else show one."""
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
    for layer in range(n_layers):
        cells = []
        for h in range(n_heads):
            det = labels.get((layer, h), [None])[0]
            cells.append("·" if det is None else f"[dim]{label_mark(det)}[/dim]" if is_resting(det) else label_mark(det))
        grid.add_row(f"L{layer}", *cells)
    return grid


def grid_fits(df: Any, width: int) -> bool:
    """Whether the layer x head grid fits a terminal ``width`` columns wide (and :data:`MAX_GRID_LAYERS` tall)."""
    n_layers, n_heads = int(df.attrs.get("n_layers", 0)), int(df.attrs.get("n_heads", 0))
    return 0 < n_layers <= MAX_GRID_LAYERS and 6 + 4 * n_heads <= width


def fit_lines(summaries: list[Any], budget: int) -> list[Any]:
    """The type summaries with fewer heads each until the type table fits ``budget`` rows: of the types listing
    the most heads, the last-listed (resting, weight scores, the weakest) gives one up first, and every type
    keeps at least one.

    >>> import pandas as pd
    >>> from headlens.scoring.summary import TypeSummary
    >>> types = [TypeSummary(d, 3, pd.DataFrame({"head": range(3)})) for d in ("induction", "ov_copying", "first_token")]
    >>> [len(t.heads) for t in fit_lines(types, 7)]
    [3, 2, 2]
    """
    import dataclasses

    listed = [i for i, t in enumerate(summaries) if t.n_labelled or t.preference]
    counts = {i: len(summaries[i].heads) for i in listed}
    while sum(counts.values()) > budget and max(counts.values(), default=1) > 1:
        most = max(counts.values())
        counts[max(i for i in listed if counts[i] == most)] -= 1
    return [dataclasses.replace(t, heads=t.heads.head(counts[i])) if i in counts else t
            for i, t in enumerate(summaries)]


def print_summary(df: Any, console: Any, out: Path | None = None) -> None:
    """The default output of ``headlens classify`` (module docstring); ``out``: where ``--out`` wrote the table."""
    from headlens.scoring.summary import type_summaries

    attrs = df.attrs
    L, H = int(attrs.get("n_layers", 0)), int(attrs.get("n_heads", 0))
    summaries = type_summaries(df)
    unlabelled = [t.detector for t in summaries if t.n_labelled == 0 and not t.preference]
    fits = grid_fits(df, console.width)
    where = f"in {out}" if out is not None else "not written (--out scores.csv|.parquet|.json)"
    notes = [legend(summaries), f"no label: {', '.join(unlabelled)}" if unlabelled else "",
             "each head's strongest label, marked as in the table (dim: it only rests; · none)" if fits else
             f"the {L} x {H} grid does not fit here: --report FILE.html, or headlens dashboard",
             f"full table ({len(df)} rows): {where}; every labelled row: --all"]
    width = max(int(console.width), 1)
    fixed = 3 + sum(len(textwrap.wrap(line, width)) for n in notes for line in n.splitlines()) + (
        L + 2 if fits else 0)  # title, header, rule, the notes as this terminal wraps them, the grid
    summaries = fit_lines(summaries, MAX_LINES - fixed)
    notes[0] = legend(summaries)  # as many resting heads as are now listed
    console.print(f"[bold]{attrs.get('model', '?')}[/bold]: {L * H} heads ({L} layers x {H}), "
                  f"{attrs.get('scoring', 'headlens')} scores", highlight=False)
    if any(t.n_labelled or t.preference for t in summaries):
        console.print(type_table(df, summaries))
        console.print(f"[dim]{notes[0]}[/dim]", highlight=False)
    else:
        console.print(f"no head passes the label rule ({LABEL_RULE})", highlight=False)
    if unlabelled:
        console.print(f"[dim]{notes[1]}[/dim]", highlight=False)
    if fits:
        console.print(grid_table(df))
    console.print(f"[dim]{notes[2]}[/dim]", highlight=False)
    console.print(f"[dim]{notes[3]}[/dim]", highlight=False)


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
                  f"heads together, {cfg.get('n_prompts', '?')} prompts; change = ablated - clean; random: "
                  f"{cfg.get('n_control', '?')} groups of as many heads in the same layers", highlight=False)
    if not results:
        console.print("[dim]no labelled type to test[/dim]")
        return
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, padding=(0, 1, 0, 0), pad_edge=False)
    for col in ("type", "heads", "metric", "clean", "change", "95% CI", "random", "confirmed"):
        table.add_column(col, justify="left" if col in ("type", "heads", "metric", "confirmed") else "right",
                         no_wrap=col != "confirmed")
    for r in results:
        verdict = f"untested: {r['error']}" if r.get("error") else ("yes" if r["confirmed"] else "no")
        table.add_row(r["detector"], r["heads"], r["metric"], fmt_number(r["clean"]), fmt_number(r["delta"], "+.3f"),
                      f"[{fmt_number(r['ci_low'], '+.3f')}, {fmt_number(r['ci_high'], '+.3f')}]", fmt_number(r["control_delta"], "+.3f"),
                      verdict)
    console.print(table)
