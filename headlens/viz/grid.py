"""The layer x head grid: one square per head, coloured by a score or by its strongest label.

Nothing here calls Streamlit or runs a model, so every figure the dashboard shows can
also be built in a notebook or an analysis script and saved with :func:`figure_html`.

Why the head grid is a scatter and not a heatmap: Streamlit reports chart selections
for scatter points but not for heatmap cells, so the layer x head grid is drawn as
square markers whose ``customdata`` starts with ``[layer, head]``; a click on a square
then tells the app which head was picked.
"""

from __future__ import annotations

import html
import math
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from headlens.scoring.primary import primary, strength, strongest_rows
from headlens.scoring.table import head_labels

if TYPE_CHECKING:
    import pandas as pd
    import plotly.graph_objects as go

# The one vocabulary of label abbreviations: the dashboard's grid, the HTML report and the CLI's
# layer x head overview all print these (never a detector's name cut short: `sink` is a detector).
LABEL_MARKS = {
    "previous_token": "PT",
    "next_token": "NT",
    "current_token": "CT",
    "first_token": "1st",
    "duplicate_token": "DUP",
    "induction": "IND",
    "bracket_matching": "BR",
    "bracket_matching_hard": "BR!",
    "open_bracket": "OB",
    "open_bracket_hard": "OB!",
    "ov_copying": "OVC",
    "ov_suppression": "OVS",
    "copy_suppression": "CSU",
    "successor": "SUC",
    "coreference": "REF",
    "sink": "SNK",
    "streaming": "STR",
    "retrieval": "RET",
    "name_mover": "NM",
    "negative_name_mover": "NNM",
}


def label_mark(detector: str) -> str:
    """The abbreviation of ``detector`` (a variant ``streaming(w=128)`` takes its base's; others their first
    three letters).

    >>> label_mark("first_token"), label_mark("streaming(w=128)"), label_mark("two_back")
    ('1st', 'STR', 'two')
    """
    base = str(detector).split("(")[0]
    return LABEL_MARKS.get(base, base[:3])


SELECTED_COLOR = "#ff2d55"  # border of the heads selected in the dashboard
# one hue per head type for the grid's "strongest label" colouring (intensity = strength)
LABEL_COLORS = {
    "previous_token": "#1f77b4", "next_token": "#17becf", "current_token": "#7f7f7f", "first_token": "#8c564b",
    "duplicate_token": "#9467bd", "induction": "#d62728", "bracket_matching": "#2ca02c",
    "bracket_matching_hard": "#2ca02c", "open_bracket": "#ff7f0e", "open_bracket_hard": "#ff7f0e",
    "ov_copying": "#e377c2", "name_mover": "#bcbd22", "negative_name_mover": "#393b79",
    "ov_suppression": "#8c6d31", "copy_suppression": "#843c39", "successor": "#637939",
}
UNLABELLED_COLOR = "#d9d9d9"


def head_name(layer: int, head: int) -> str:
    """TransformerLens-style head id.

    >>> head_name(1, 3)
    'L1H3'
    """
    return f"L{int(layer)}H{int(head)}"


def fmt_number(x: Any, spec: str = ".3f") -> str:
    """``x`` formatted with ``spec``; ``-`` for NaN, None and what is not a number (tables, hovers, reports).

    >>> fmt_number(0.12345), fmt_number(float("nan")), fmt_number(2.5, "+.1f")
    ('0.123', '-', '+2.5')
    """
    try:
        value = float(x)
    except (TypeError, ValueError):
        return "-"
    return "-" if math.isnan(value) else format(value, spec)


def _fmt(x: Any, digits: int = 3) -> str:
    return fmt_number(x, f".{digits}f")


def _labels_by_head(scores: pd.DataFrame) -> dict[tuple[int, int], list[str]]:
    """Detectors each head is labelled with, strongest first and resting last (the library's one rule,
    :func:`headlens.scoring.primary.label_order`)."""
    if "label" not in scores.columns or scores.empty:
        return {}
    return head_labels(scores)


def head_grid_figure(
    scores: pd.DataFrame,
    detector: str,
    n_layers: int,
    n_heads: int,
    color_by: str = "score",
    selected: Iterable[tuple[int, int]] = (),
    title: str | None = None,
) -> go.Figure:
    """Layers x heads as square markers coloured by one detector's score (or strength, or lift).

    Args:
        scores: the tidy scores table (``layer, head, detector, score, ci_low, ci_high,
            baseline, lift, label``); may be empty, then every square is grey.
        detector: which detector colours the grid.
        n_layers: number of layers (rows); heads missing from ``scores`` are drawn grey.
        n_heads: number of heads per layer (columns).
        color_by: ``"score"`` (0..1), ``"strength"`` (the score's place between its chance and a
            perfect head, ``(score - chance) / (1 - chance)``, one scale for every type:
            :func:`headlens.scoring.primary.strength`), ``"lift"`` (score / uniform baseline, within a
            type) or ``"label"``: each head in the colour of its strongest label (``LABEL_COLORS``), as
            intense as that label's strength; unlabelled heads grey (``detector`` is then only used in
            the hover). The hover shows the score, its CI, baseline, lift and strength.
        selected: heads drawn with a thick border.
        title: figure title.

    Returns:
        A figure with one scatter trace whose ``customdata`` rows start with ``[layer, head]``.
    """
    import plotly.graph_objects as go

    from headlens.scoring.primary import light

    if color_by not in ("score", "strength", "lift", "label"):
        raise ValueError(f"color_by must be 'score', 'strength', 'lift' or 'label', got {color_by!r}")
    scores = light(scores)  # pandas copies attrs at every step: a real LM's provenance cost more than the grid
    if color_by == "label":
        return _label_grid(scores, n_layers, n_heads, selected, title)
    rows: dict[tuple[int, int], Any] = {}
    if not scores.empty and "detector" in scores.columns:
        mine = scores[scores["detector"] == detector]
        mine = mine.assign(strength=strength(mine) if "baseline" in mine.columns else float("nan"))
        for row in mine.itertuples(index=False):
            rows[(int(row.layer), int(row.head))] = row
    labels = _labels_by_head(scores)
    chosen = {(int(lay), int(hd)) for lay, hd in selected}

    xs, ys, colors, custom, texts, line_colors, line_widths = [], [], [], [], [], [], []
    for layer in range(n_layers):
        for head in range(n_heads):
            row = rows.get((layer, head))
            value = float(getattr(row, color_by, float("nan"))) if row is not None else float("nan")
            head_labels = labels.get((layer, head), [])
            xs.append(head)
            ys.append(layer)
            colors.append(None if math.isnan(value) else value)
            texts.append(" ".join(label_mark(d) for d in head_labels))
            custom.append([
                layer, head, head_name(layer, head),
                _fmt(getattr(row, "score", None)), _fmt(getattr(row, "ci_low", None)),
                _fmt(getattr(row, "ci_high", None)), _fmt(getattr(row, "baseline", None)),
                _fmt(getattr(row, "lift", None), 2), ", ".join(head_labels) or "none",
                _fmt(getattr(row, "strength", None), 2),
            ])
            is_sel = (layer, head) in chosen
            line_colors.append(SELECTED_COLOR if is_sel else ("#111111" if head_labels else "#ffffff"))
            line_widths.append(4 if is_sel else (2 if head_labels else 1))

    finite = [c for c in colors if c is not None]
    cmax = 1.0 if color_by in ("score", "strength") else max(3.0, max(finite, default=3.0))
    size = max(14, min(44, int(440 / max(n_layers, n_heads, 1))))
    trace = go.Scatter(
        x=xs, y=ys, mode="markers+text", text=texts, textposition="middle center",
        textfont=dict(size=max(8, size // 4), color="#ffffff"),
        marker=dict(
            symbol="square", size=size, color=[0.0 if c is None else c for c in colors],
            opacity=[0.25 if c is None else 1.0 for c in colors],  # no score: faded
            colorscale="Viridis", cmin=0.0, cmax=cmax, showscale=True,
            colorbar=dict(title=dict(text=color_by), thickness=12),
            line=dict(color=line_colors, width=line_widths),
        ),
        customdata=custom,
        hovertemplate=(
            "<b>%{customdata[2]}</b><br>" + html.escape(detector) + ": %{customdata[3]} "
            "[%{customdata[4]}, %{customdata[5]}]<br>baseline %{customdata[6]} · lift %{customdata[7]} · "
            "strength %{customdata[9]}<br>labels: %{customdata[8]}<extra></extra>"
        ),
        name="heads",
        showlegend=False,
    )
    fig = go.Figure(trace)
    fig.update_layout(
        title=dict(text=title or f"{detector} {color_by} per head"),
        height=max(240, n_layers * (size + 18) + 120),
        margin=dict(l=50, r=20, t=_top(title), b=40),
        clickmode="event+select",
        dragmode=False,
        plot_bgcolor="#ffffff",
    )
    fig.update_xaxes(title="head", tickmode="array", tickvals=list(range(n_heads)),
                     range=[-0.6, n_heads - 0.4], showgrid=False, zeroline=False)
    fig.update_yaxes(title="layer", tickmode="array", tickvals=list(range(n_layers)),
                     range=[n_layers - 0.4, -0.6], showgrid=False, zeroline=False)
    return fig


def _top(title: str | None) -> int:
    """The top margin: room for the title's lines (a plotly title does not wrap; callers break it with ``<br>``)."""
    return 50 + 22 * (title or "").count("<br>")


def _tint(hex_color: str, strength: float) -> str:
    """``hex_color`` mixed with white: ``strength`` 1 is the full colour, 0 is white."""
    r, g, b = (int(hex_color[i:i + 2], 16) for i in (1, 3, 5))
    s = min(1.0, max(0.0, strength))
    return "#" + "".join(f"{round(255 - (255 - c) * s):02x}" for c in (r, g, b))


def _is_num(x: Any) -> bool:
    return isinstance(x, int | float) and not math.isnan(x)


def _label_grid(scores: pd.DataFrame, n_layers: int, n_heads: int, selected: Iterable[tuple[int, int]],
                title: str | None) -> go.Figure:
    """The head grid coloured by each head's strongest label (hue) and its strength (intensity: the primary
    statistic's place between its type's chance and a perfect head, one scale for every type,
    :func:`headlens.scoring.primary.strength`; the score where a table has no baselines)."""
    import plotly.graph_objects as go

    best: dict[tuple[int, int], Any] = {}  # each head's strongest label, resting only when it does nothing else
    top = strongest_rows(scores)
    power = strength(top) if "baseline" in top.columns else primary(top)
    for row in top.assign(primary_stat=primary(top), power=power).itertuples(index=False):
        best[(int(row.layer), int(row.head))] = row
    labels = _labels_by_head(scores)
    chosen = {(int(lay), int(hd)) for lay, hd in selected}
    xs, ys, colors, custom, texts, line_colors, line_widths = [], [], [], [], [], [], []
    for layer in range(n_layers):
        for head in range(n_heads):
            row = best.get((layer, head))
            detector = str(row.detector) if row is not None else ""
            score = float(row.power) if row is not None else float("nan")  # one scale for every type
            xs.append(head)
            ys.append(layer)
            colors.append(_tint(LABEL_COLORS.get(detector, "#444444"), 0.25 + 0.75 * (score if score == score else 1))
                          if row is not None else UNLABELLED_COLOR)
            texts.append(label_mark(detector) if row is not None else "")
            pref = row is not None and _is_num(getattr(row, "preference", None))
            stat, lo, hi = (("preference", "preference_ci_low", "preference_ci_high") if pref
                            else ("score", "ci_low", "ci_high"))
            custom.append([layer, head, head_name(layer, head), (detector + (" preference" if pref else ""))
                           or "none", _fmt(getattr(row, stat, None)),
                           _fmt(getattr(row, lo, None)), _fmt(getattr(row, hi, None)),
                           _fmt(getattr(row, "lift", None), 2), ", ".join(labels.get((layer, head), [])) or "none",
                           _fmt(score, 2)])
            is_sel = (layer, head) in chosen
            line_colors.append(SELECTED_COLOR if is_sel else "#ffffff")
            line_widths.append(4 if is_sel else 1)
    size = max(14, min(44, int(440 / max(n_layers, n_heads, 1))))
    fig = go.Figure(go.Scatter(
        x=xs, y=ys, mode="markers+text", text=texts, textposition="middle center",
        textfont=dict(size=max(8, size // 4), color="#111111"),
        marker=dict(symbol="square", size=size, color=colors, line=dict(color=line_colors, width=line_widths)),
        customdata=custom, name="heads", showlegend=False,
        hovertemplate=("<b>%{customdata[2]}</b><br>strongest label: %{customdata[3]} %{customdata[4]} "
                       "[%{customdata[5]}, %{customdata[6]}] · strength %{customdata[9]} · lift %{customdata[7]}"
                       "<br>all labels: "
                       "%{customdata[8]}<extra></extra>"),
    ))
    for detector in dict.fromkeys(str(r.detector) for r in best.values()):  # a legend entry per type shown
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name=detector, hoverinfo="skip",
                                 marker=dict(symbol="square", size=12, color=LABEL_COLORS.get(detector, "#444444"))))
    fig.update_layout(
        title=dict(text=title or "strongest label per head (colour: type, intensity: strength)"),
        height=max(240, n_layers * (size + 18) + 140), margin=dict(l=50, r=20, t=_top(title), b=40),
        clickmode="event+select", dragmode=False, plot_bgcolor="#ffffff",
        legend=dict(title=dict(text="strongest label"), itemclick=False, itemdoubleclick=False),
    )
    fig.update_xaxes(title="head", tickmode="array", tickvals=list(range(n_heads)),
                     range=[-0.6, n_heads - 0.4], showgrid=False, zeroline=False)
    fig.update_yaxes(title="layer", tickmode="array", tickvals=list(range(n_layers)),
                     range=[n_layers - 0.4, -0.6], showgrid=False, zeroline=False)
    return fig


def placeholder_figure(message: str, height: int = 300) -> go.Figure:
    """An empty figure that says ``message``: stands in for a figure still being computed."""
    import plotly.graph_objects as go

    fig = go.Figure()
    fig.add_annotation(text=message, showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper",
                       font=dict(size=15, color="#777777"))
    fig.update_layout(height=height, margin=dict(l=20, r=20, t=20, b=20), plot_bgcolor="#ffffff")
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    return fig
