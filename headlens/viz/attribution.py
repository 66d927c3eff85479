"""Direct logit attribution as figures: which heads wrote a token, and the tokens of a text to pick from.

One figure module of :mod:`headlens.viz` (which re-exports its builders). Both figures are scatters or
bars whose ``customdata`` names what a click picks (Streamlit reports selections on those, not on
heatmaps): a bar's ``[layer, head]`` (head ``-1`` for an MLP, layer and head ``-1`` for the embedding), a
token square's ``[position]``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas as pd
    import plotly.graph_objects as go

WRITER_COLOR, SUPPRESSOR_COLOR = "#2e8b57", "#c0392b"


def writers_figure(summary: pd.DataFrame, top: int = 10, heads_only: bool = False, title: str | None = None
                   ) -> go.Figure:
    """The ``top`` strongest writers (green, pushing the target up) and suppressors (red) of a target, one
    horizontal bar each, with the 95 % CI over prompts when there are several.

    Args:
        summary: :func:`headlens.attribution_summary` of an attribution table.
        top: writers and suppressors shown (each).
        heads_only: leave out the MLPs and the embedding.
        title: figure title (default: the target and the total).
    """
    import plotly.graph_objects as go

    from headlens.scoring.writers import strongest

    writers, suppressors = strongest(summary, top, heads_only=heads_only)
    # plotly draws the first bar at the bottom: strongest suppressor first, strongest writer last (on top)
    rows = [*suppressors.itertuples(), *writers.iloc[::-1].itertuples()]
    has_ci = any(r.ci_low == r.ci_low for r in rows)
    fig = go.Figure(go.Bar(
        x=[r.attribution for r in rows], y=[r.component for r in rows], orientation="h",
        marker_color=[WRITER_COLOR if r.attribution > 0 else SUPPRESSOR_COLOR for r in rows],
        customdata=[[int(r.layer), int(r.head)] for r in rows],
        error_x=dict(type="data", symmetric=False, array=[r.ci_high - r.attribution for r in rows],
                     arrayminus=[r.attribution - r.ci_low for r in rows], visible=has_ci),
        hovertemplate="%{y}: %{x:+.3f} logits<extra></extra>"))
    total = summary.attrs.get("total", {}).get("mean", float("nan"))
    target = str(summary["target"].iloc[0]) if len(summary) else ""
    fig.update_layout(
        title=title or f"who wrote {target}: direct logit attribution (total {total:+.2f})",
        xaxis_title="direct logit attribution (logits" + (", 95% CI over prompts)" if has_ci else ")"),
        height=max(260, 22 * len(rows) + 110), margin=dict(l=10, r=10, t=50, b=40), clickmode="event+select",
        yaxis=dict(type="category"))
    fig.add_vline(x=0, line_color="#777777")
    return fig


def token_strip_figure(tokens: list[str], selected: int | None = None, per_row: int = 16) -> go.Figure:
    """The text's tokens as squares in reading order, ``per_row`` to a line, the ``selected`` one outlined;
    ``customdata`` is each token's position. The first token (BOS) is drawn grey: nothing predicts it."""
    import plotly.graph_objects as go

    from headlens.viz.grid import SELECTED_COLOR
    from headlens.viz.patterns import display_token

    xs = [i % per_row for i in range(len(tokens))]
    ys = [-(i // per_row) for i in range(len(tokens))]
    fig = go.Figure(go.Scatter(
        x=xs, y=ys, mode="markers+text", text=[display_token(t) for t in tokens], textfont=dict(size=11),
        customdata=[[i] for i in range(len(tokens))], hovertemplate="position %{customdata[0]}: %{text}<extra></extra>",
        marker=dict(symbol="square", size=34, color=["#eeeeee" if i == 0 else "#dbe9f6" for i in range(len(tokens))],
                    line=dict(color=[SELECTED_COLOR if i == selected else "#ffffff" for i in range(len(tokens))],
                              width=[3 if i == selected else 1 for i in range(len(tokens))]))))
    n_rows = (len(tokens) + per_row - 1) // per_row
    fig.update_layout(height=40 * n_rows + 40, margin=dict(l=5, r=5, t=5, b=5), showlegend=False,
                      xaxis=dict(visible=False, range=[-0.6, per_row - 0.4]), yaxis=dict(visible=False),
                      clickmode="event+select")
    return fig
