"""Plotly figures for comparing two models or two checkpoints of one: the change of every head's score."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import plotly.graph_objects as go


def score_diff_figure(diff: Any, detector: str, n_layers: int, n_heads: int, title: str = "") -> go.Figure:
    """Layers x heads coloured by the change of one detector's score (``diff`` rows from
    ``headlens.app.history.score_diff``): red where the second model scores higher, blue lower."""
    import plotly.graph_objects as go

    rows = diff[diff["detector"] == detector]
    values = {(int(r.layer), int(r.head)): (float(r.score_a), float(r.score_b), float(r.diff)) for r in rows.itertuples()}
    xs, ys, colors, custom = [], [], [], []
    for layer in range(n_layers):
        for head in range(n_heads):
            a, b, d = values.get((layer, head), (float("nan"),) * 3)
            xs.append(head)
            ys.append(layer)
            colors.append(0.0 if d != d else d)
            custom.append([layer, head, f"L{layer}H{head}", f"{a:.3f}", f"{b:.3f}", f"{d:+.3f}"])
    bound = max((abs(c) for c in colors), default=0.0) or 1.0
    size = max(14, min(44, int(440 / max(n_layers, n_heads, 1))))
    fig = go.Figure(go.Scatter(
        x=xs, y=ys, mode="markers+text", text=[f"{c:+.2f}" for c in colors], textfont=dict(size=max(8, size // 4)),
        marker=dict(symbol="square", size=size, color=colors, colorscale="RdBu_r", cmin=-bound, cmax=bound,
                    showscale=True, colorbar=dict(title=dict(text="Δ score"), thickness=12)),
        customdata=custom, showlegend=False,
        hovertemplate="<b>%{customdata[2]}</b><br>first %{customdata[3]} → second %{customdata[4]}"
                      "<br>change %{customdata[5]}<extra></extra>",
    ))
    fig.update_layout(title=dict(text=title or f"{detector}: second − first"),
                      height=max(240, n_layers * (size + 18) + 120), margin=dict(l=50, r=20, t=50, b=40),
                      plot_bgcolor="#ffffff", dragmode=False)
    fig.update_xaxes(title="head", tickmode="array", tickvals=list(range(n_heads)), range=[-0.6, n_heads - 0.4],
                     showgrid=False, zeroline=False)
    fig.update_yaxes(title="layer", tickmode="array", tickvals=list(range(n_layers)), range=[n_layers - 0.4, -0.6],
                     showgrid=False, zeroline=False)
    return fig
