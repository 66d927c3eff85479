"""Training-series figures (``headlens trajectory``): every head's score over checkpoints, under the loss.

One figure module of :mod:`headlens.viz` (which re-exports its builders).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas as pd
    import plotly.graph_objects as go


def trajectory_losses(table: pd.DataFrame) -> pd.DataFrame:
    """``step, loss`` of a trajectory table (``headlens trajectory``): one row per checkpoint that has a loss."""
    import pandas as pd

    if table.empty or "loss" not in table.columns:
        return pd.DataFrame(columns=["step", "loss"])
    return table[["step", "loss"]].dropna().drop_duplicates("step").sort_values("step").reset_index(drop=True)


def trajectory_figure(table: pd.DataFrame, detectors: Sequence[str] | None = None,
                      highlight: Sequence[tuple[int, int]] = ()) -> go.Figure:
    """Every head's score over training, one panel per detector, under the loss when the table has one.

    Args:
        table: a trajectory table (scores with ``step`` and, optionally, ``loss`` columns).
        detectors: the panels (default: every detector in the table).
        highlight: heads drawn thick in every panel (default: in each panel, the heads that carry
            that panel's label at the last checkpoint).
    """
    import plotly.graph_objects as go
    from plotly.colors import qualitative
    from plotly.subplots import make_subplots

    from headlens.viz.grid import head_name

    losses = trajectory_losses(table)
    detectors = list(detectors or dict.fromkeys(table["detector"]))
    last = table[table["step"] == table["step"].max()] if not table.empty else table
    thick = {(int(la), int(hd), det) for la, hd in highlight for det in detectors} or {
        (int(r.layer), int(r.head), str(r.detector)) for r in last[last["label"]].itertuples()}
    titles = (["training loss"] if len(losses) else []) + [f"{d} score per head" for d in detectors]
    fig = make_subplots(rows=len(titles), cols=1, shared_xaxes=True, vertical_spacing=0.06, subplot_titles=titles)
    if len(losses):
        fig.add_trace(go.Scatter(x=losses["step"], y=losses["loss"], mode="lines+markers", name="loss",
                                 line=dict(color="#333333")), row=1, col=1)
        fig.update_yaxes(title_text="loss", row=1, col=1)
    heads = sorted({(int(la), int(hd)) for la, hd in zip(table["layer"], table["head"], strict=True)})
    colors = {h: qualitative.Dark24[i % len(qualitative.Dark24)] for i, h in enumerate(heads)}  # one per head
    for i, det in enumerate(detectors, 1 + bool(len(losses))):
        rows = table[table["detector"] == det].sort_values("step")
        for (layer, head), group in rows.groupby(["layer", "head"], sort=True):
            name, bold = head_name(layer, head), (int(layer), int(head), det) in thick
            fig.add_trace(go.Scatter(
                x=group["step"], y=group["score"], mode="lines+markers", name=f"{name} {det}",
                legendgroup=name, line=dict(width=4 if bold else 1.2, color=colors[(int(layer), int(head))]),
                marker=dict(size=6 if bold else 3), hovertemplate="step %{x}: %{y:.3f}<extra>" + name + "</extra>",
            ), row=i, col=1)
        fig.update_yaxes(title_text="score", range=[0, 1.05], row=i, col=1)
    fig.update_xaxes(title_text="training step", row=len(titles), col=1)
    fig.update_layout(height=220 + 260 * len(titles), margin=dict(l=60, r=20, t=50, b=40))
    return fig
