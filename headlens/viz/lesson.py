"""Plotly figures for the Learn view: the head split drawn on real tensors, the head-count sweep.

Pure builders like :mod:`headlens.viz.grid` and the rest of :mod:`headlens.viz` (no Streamlit, no model): they take the arrays of
``headlens.app.lesson``'s steps.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from headlens.viz.patterns import _label_every_token, _pattern_axes, display_token, patterns_figure

if TYPE_CHECKING:
    import numpy as np
    import plotly.graph_objects as go

# one colour per head, for the bands over the residual and the frames of the per-head slices
HEAD_COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22",
               "#7f7f7f", "#aec7e8", "#ffbb78")


def head_color(head: int) -> str:
    return HEAD_COLORS[head % len(HEAD_COLORS)]


def residual_split_figure(q: np.ndarray, n_heads: int, str_tokens: Sequence[str], window: range,
                          title: str = "", name: str = "q", head: str = "H") -> go.Figure:
    """``q`` ``(T, d_model)`` as a heatmap, its columns banded by the head that reads them.

    Column ``c`` belongs to head ``c // d_head``: the band over columns ``h * d_head`` to
    ``(h + 1) * d_head - 1`` is labelled ``H{h}``. Rows are the tokens in ``window``.
    """
    import numpy as np
    import plotly.graph_objects as go

    D = q.shape[1]  # (T, d_model)
    d_head = D // n_heads
    cats, labels = _pattern_axes(str_tokens, window)
    z = np.asarray(q, dtype=np.float32)[window.start:window.stop]  # (T_window, d_model)
    bound = float(np.abs(z).max()) or 1.0
    fig = go.Figure(go.Heatmap(
        z=z, x=list(range(D)), y=cats, colorscale="RdBu", zmid=0.0, zmin=-bound, zmax=bound,
        colorbar=dict(title=dict(text=name), thickness=10),
        hovertemplate=f"token %{{y}}<br>column %{{x}}<br>{name} %{{z:.3f}}<extra></extra>",
    ))
    for h in range(n_heads):
        lo, hi = h * d_head - 0.5, (h + 1) * d_head - 0.5
        fig.add_shape(type="rect", x0=lo, x1=hi, y0=1.0, y1=1.06, xref="x", yref="paper",
                      fillcolor=head_color(h), line=dict(width=0))
        fig.add_shape(type="line", x0=hi, x1=hi, y0=0, y1=1.0, xref="x", yref="paper",
                      line=dict(color="#222222", width=1.5 if h < n_heads - 1 else 0))
        if n_heads <= 32:
            fig.add_annotation(x=(lo + hi) / 2, y=1.03, xref="x", yref="paper", showarrow=False,
                               text=f"{head}{h}" if n_heads <= 16 else str(h), font=dict(color="#ffffff", size=11))
    fig.update_layout(title=dict(text=title), height=max(320, 12 * len(cats) + 180),
                      margin=dict(l=60, r=20, t=80, b=50))
    fig.update_yaxes(type="category", tickmode="array", tickvals=cats, ticktext=labels, autorange="reversed",
                     tickfont=dict(size=10 if len(cats) > 24 else 12), title="token (position)")
    fig.update_xaxes(title=f"column of {name} ({D} = {n_heads} x {d_head}; head h reads columns h·{d_head} … "
                           f"h·{d_head}+{d_head - 1})")
    return fig


def head_slices_figure(q_heads: np.ndarray, str_tokens: Sequence[str], window: range, max_heads: int = 12,
                       title: str = "", name: str = "q", reads: Sequence[int] | None = None) -> go.Figure:
    """Each head's own ``(T, d_head)`` queries (or keys: ``name``) after ``view`` + ``transpose``: one panel per
    head. ``reads[h]``: the key/value head query head ``h`` reads under grouped-query attention (in its title)."""
    import numpy as np
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    H, _, d_head = q_heads.shape
    shown = min(H, max_heads)
    cats, labels = _pattern_axes(str_tokens, window)
    bound = float(np.abs(q_heads).max()) or 1.0
    titles = [f"H{h}: {name}[:, {h}]" + (f" · kv {reads[h]}" if reads is not None else
                                          f" = cols {h * d_head}…{(h + 1) * d_head - 1}") for h in range(shown)]
    fig = make_subplots(rows=1, cols=shown, shared_yaxes=True, horizontal_spacing=0.015, subplot_titles=titles)
    for h in range(shown):
        fig.add_trace(go.Heatmap(
            z=np.asarray(q_heads[h], dtype=np.float32)[window.start:window.stop], x=list(range(d_head)), y=cats,
            colorscale="RdBu", zmid=0.0, zmin=-bound, zmax=bound, showscale=h == 0,
            colorbar=dict(title=dict(text=name), thickness=10),
            hovertemplate=f"H{h}<br>token %{{y}}<br>d_head index %{{x}}<br>{name} %{{z:.3f}}<extra></extra>",
        ), row=1, col=h + 1)
        fig.layout.annotations[h].font.color = head_color(h)
        if shown > 8:
            fig.layout.annotations[h].font.size = 11
    fig.update_layout(title=dict(text=title), height=max(320, 12 * len(cats) + 180),
                      margin=dict(l=60, r=20, t=80, b=50))
    fig.update_yaxes(type="category", tickmode="array", tickvals=cats, ticktext=labels, autorange="reversed",
                     tickfont=dict(size=10 if len(cats) > 24 else 12))
    fig.update_xaxes(showticklabels=False)
    return fig


def bugged_pattern_figure(pattern: np.ndarray, str_tokens: Sequence[str], window: range, max_panels: int = 4,
                          title: str = "") -> go.Figure:
    """What a bug makes of the pattern ``(A, S, S)``: positions x heads x heads when the split
    forgot its transpose (``S`` is then the head count), else heads x tokens x tokens."""
    import numpy as np
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    A, S, _ = pattern.shape
    if S == len(str_tokens):  # a (H, T, T) pattern: panels are "heads", axes tokens
        return patterns_figure([pattern[a] for a in range(min(A, max_panels))],
                               [f"'head' {a}" for a in range(min(A, max_panels))], str_tokens, causal=False,
                               window=window, title=title)
    # (T, H, H): for a few positions, the heads attending over heads
    picks = [window.start + (i * max(1, len(window) - 1)) // max(1, max_panels - 1) for i in range(max_panels)]
    picks = list(dict.fromkeys(min(p, A - 1) for p in picks))
    cats = labels = [f"H{h}" for h in range(S)]
    z_of = [np.asarray(pattern[p], dtype=np.float32) for p in picks]
    names = [f"position #{p} {display_token(str_tokens[p])}" for p in picks]
    fig = make_subplots(rows=1, cols=len(z_of), shared_yaxes=True, horizontal_spacing=0.02, subplot_titles=names)
    for i, z in enumerate(z_of):
        fig.add_trace(go.Heatmap(z=z, x=cats, y=cats, colorscale="Oranges", zmin=0.0, zmax=1.0, showscale=i == 0,
                                 colorbar=dict(title=dict(text="weight"), thickness=10),
                                 hovertemplate="row %{y}<br>column %{x}<br>weight %{z:.3f}<extra></extra>"),
                      row=1, col=i + 1)
    fig.update_layout(title=dict(text=title), height=max(300, 12 * len(cats) + 190), margin=dict(l=60, r=20, t=80, b=60))
    _label_every_token(fig, cats, labels)
    return fig


def head_count_figure(n_heads: Sequence[int], losses: Sequence[float], true_n_heads: int,
                      inferred: int | None = None) -> go.Figure:
    """Loss on the text with the weights split into each head count; the config's count stands out."""
    import plotly.graph_objects as go

    colors = ["#d62728" if h == true_n_heads else "#9ecae1" for h in n_heads]
    fig = go.Figure(go.Bar(
        x=[str(h) for h in n_heads], y=list(losses), marker=dict(color=colors),
        text=[f"{v:.2f}" for v in losses], textposition="outside",
        hovertemplate="n_heads %{x}<br>loss %{y:.3f} nats<extra></extra>",
    ))
    note = f" · doctor infers {inferred}" if inferred is not None else ""
    fig.update_layout(title=dict(text=f"loss on your text per n_heads (red: the config's {true_n_heads}){note}"),
                      height=340, margin=dict(l=60, r=20, t=60, b=50),
                      yaxis=dict(title="next-token loss (nats)"), xaxis=dict(title="n_heads the weights are split into",
                                                                           type="category"))
    return fig



def kv_sharing_figure(n_heads: int, n_kv_heads: int, title: str = "") -> go.Figure:
    """Which key/value head each query head reads under grouped-query attention (``repeat_kv``): query head
    ``h`` reads key/value head ``h // (n_heads / n_kv_heads)``, in that key/value head's colour."""
    import plotly.graph_objects as go

    group = n_heads // n_kv_heads
    fig = go.Figure()
    for g in range(n_kv_heads):
        heads = list(range(g * group, (g + 1) * group))
        fig.add_trace(go.Scatter(
            x=[f"H{h}" for h in heads], y=[f"kv {g}"] * group, mode="markers+text", text=[f"H{h}" for h in heads],
            textfont=dict(color="#ffffff", size=11), marker=dict(symbol="square", size=34, color=head_color(g)),
            name=f"kv head {g}", hovertemplate=f"query head %{{x}} reads key/value head {g}<extra></extra>"))
    fig.update_layout(title=dict(text=title), height=110 + 46 * n_kv_heads, showlegend=False,
                      margin=dict(l=60, r=20, t=60, b=40))
    fig.update_xaxes(type="category", categoryorder="array", categoryarray=[f"H{h}" for h in range(n_heads)],
                     title="query head", showgrid=False)
    fig.update_yaxes(type="category", categoryorder="array", categoryarray=[f"kv {g}" for g in reversed(range(n_kv_heads))],
                     title="key/value head", showgrid=False)
    return fig
