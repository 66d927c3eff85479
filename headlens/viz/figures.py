"""Plotly figures beside the grid: head profiles, ablation effects, per-token loss, training curves,
induction by distance, and :func:`figure_html` to save any figure as a standalone page.

Pure functions from tables and arrays to ``go.Figure``; nothing here calls Streamlit or runs a model.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from headlens.viz.grid import head_name
from headlens.viz.patterns import display_token

if TYPE_CHECKING:
    import pandas as pd
    import plotly.graph_objects as go


def head_profile_figure(scores: pd.DataFrame, heads: Sequence[tuple[int, int]]) -> go.Figure:
    """Each selected head's score on every detector, with CI error bars and the baseline."""
    import plotly.graph_objects as go

    fig = go.Figure()
    for layer, head in heads:
        rows = scores[(scores["layer"] == layer) & (scores["head"] == head)]
        if rows.empty:
            continue
        fig.add_trace(go.Bar(
            x=rows["detector"], y=rows["score"], name=head_name(layer, head),
            error_y=dict(type="data", symmetric=False, array=rows["ci_high"] - rows["score"],
                         arrayminus=rows["score"] - rows["ci_low"]),
            customdata=rows[["baseline", "lift"]].to_numpy(),
            hovertemplate="%{x}: %{y:.3f}<br>baseline %{customdata[0]:.3f} · lift %{customdata[1]:.1f}"
                          "<extra>" + head_name(layer, head) + "</extra>",
        ))
    fig.update_layout(barmode="group", title=dict(text="scores across detectors (95% CI)"),
                      yaxis=dict(title="score", range=[0, 1.05]), height=300,
                      margin=dict(l=50, r=20, t=50, b=40), legend=dict(orientation="h", y=1.12, x=1, xanchor="right"))
    fig.update_xaxes(tickangle=-35)
    return fig


def ablation_figure(effects: pd.DataFrame) -> go.Figure:
    """Metric change per ablation as bars with CI error bars.

    Args:
        effects: rows with ``heads`` (a display string), ``metric``, ``delta``, ``ci_low``,
            ``ci_high``; e.g. the chosen heads next to a random-heads control.
    """
    import plotly.graph_objects as go

    fig = go.Figure()
    for metric, rows in effects.groupby("metric", sort=False):
        fig.add_trace(go.Bar(
            x=rows["heads"].astype(str), y=rows["delta"], name=str(metric),
            error_y=dict(type="data", symmetric=False, array=rows["ci_high"] - rows["delta"],
                         arrayminus=rows["delta"] - rows["ci_low"]),
            hovertemplate="%{x}<br>change %{y:.4f}<extra>" + html.escape(str(metric)) + "</extra>",
        ))
    fig.update_layout(barmode="group", title=dict(text="metric change when ablated (95% CI)"),
                      yaxis=dict(title="ablated - clean"), height=320, margin=dict(l=60, r=20, t=50, b=40))
    return fig


def token_loss_figure(str_tokens: Sequence[str], diff: Sequence[float]) -> go.Figure:
    """Per-token loss difference (ablated - clean): red where ablation hurts, blue where it helps.

    Args:
        str_tokens: the *predicted* tokens, one per bar.
        diff: loss difference in nats for each of them.
    """
    import plotly.graph_objects as go

    values = [float(d) for d in diff]
    bound = max((abs(v) for v in values if not math.isnan(v)), default=1.0) or 1.0
    labels = [display_token(t) for t in str_tokens]
    fig = go.Figure(go.Bar(
        x=list(range(len(values))), y=values, customdata=labels,
        marker=dict(color=values, colorscale="RdBu_r", cmin=-bound, cmax=bound),
        hovertemplate="%{customdata}: %{y:+.3f} nats<extra></extra>",
    ))
    step = max(1, math.ceil(len(values) / 60))
    ticks = list(range(0, len(values), step))
    fig.update_layout(title=dict(text="per-token loss change (ablated - clean)"), height=300,
                      yaxis=dict(title="Δ loss (nats)"), margin=dict(l=60, r=20, t=50, b=60))
    fig.update_xaxes(tickmode="array", tickvals=ticks, ticktext=[labels[i] for i in ticks], tickangle=0)
    return fig


def training_figure(
    losses: pd.DataFrame, head_scores: pd.DataFrame, detector: str, highlight: Sequence[tuple[int, int]] = ()
) -> go.Figure:
    """Training loss and per-head detector scores over training steps (one line per head).

    Args:
        losses: ``step, loss`` rows (the training log or the snapshots' losses).
        head_scores: tidy scores of each snapshot with a ``step`` column.
        detector: which detector's scores to plot.
        highlight: heads drawn thick; the others thin.
    """
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.08,
                        subplot_titles=("training loss", f"{detector} score per head"))
    if not losses.empty:
        fig.add_trace(go.Scatter(x=losses["step"], y=losses["loss"], mode="lines", name="loss",
                                 line=dict(color="#333333")), row=1, col=1)
    chosen = {(int(lay), int(hd)) for lay, hd in highlight}
    rows = head_scores[head_scores["detector"] == detector] if not head_scores.empty else head_scores
    if not rows.empty:
        for (layer, head), group in rows.sort_values("step").groupby(["layer", "head"], sort=True):
            name = head_name(layer, head)
            fig.add_trace(go.Scatter(
                x=group["step"], y=group["score"], mode="lines+markers", name=name,
                line=dict(width=4 if (layer, head) in chosen else 1.5), marker=dict(size=5),
                hovertemplate="step %{x}: %{y:.3f}<extra>" + name + "</extra>",
            ), row=2, col=1)
    fig.update_yaxes(title_text="loss", row=1, col=1)
    fig.update_yaxes(title_text="score", range=[0, 1.05], row=2, col=1)
    fig.update_xaxes(title_text="training step", row=2, col=1)
    fig.update_layout(height=560, margin=dict(l=60, r=20, t=50, b=40))
    return fig


def induction_distance_figure(curve: pd.DataFrame, heads: Sequence[tuple[int, int]] | None = None,
                              top: int = 6) -> go.Figure:
    """Induction score against the gap between the copies, one line per head, with 95 % CIs.

    Args:
        curve: the table of :func:`headlens.scoring.induction_distance.induction_curve`.
        heads: ``(layer, head)`` pairs to draw; default the ``top`` heads by their best score.
        top: how many heads when ``heads`` is None.
    """
    import plotly.graph_objects as go

    if heads is None:
        best = curve.groupby(["layer", "head"])["score"].max().sort_values(ascending=False)
        heads = list(best.index[:top])
    fig = go.Figure()
    for layer, head in heads:
        c = curve[(curve.layer == layer) & (curve["head"] == head)].sort_values("gap")
        fig.add_trace(go.Scatter(
            x=c.gap, y=c.score, mode="lines+markers", name=head_name(layer, head),
            error_y=dict(type="data", symmetric=False, array=c.ci_high - c.score, arrayminus=c.score - c.ci_low),
            hovertemplate="gap %{x}: %{y:.3f}<extra>" + head_name(layer, head) + "</extra>"))
    base = curve.groupby("gap")["baseline"].first().sort_index()
    fig.add_trace(go.Scatter(x=base.index, y=base.values, mode="lines", name="uniform",
                             line=dict(dash="dot", color="#777777")))
    fig.update_xaxes(type="log", title_text="gap between the two copies (tokens)", tickvals=list(base.index))
    fig.update_yaxes(range=[0, 1], title_text="attention on the token after the earlier copy")
    fig.update_layout(height=380, margin=dict(l=60, r=20, t=50, b=50), template="plotly_white",
                      title=dict(text="induction by distance", x=0.01))
    return fig


def figure_html(fig: go.Figure | dict) -> str:
    """A standalone HTML page of ``fig``, a figure or its JSON dict (plotly.js inlined, so it opens offline)."""
    import plotly.graph_objects as go

    return go.Figure(fig).to_html(include_plotlyjs=True, full_html=True)
