"""The circuit graph: heads at their (layer, head) place, edges sender -> receiver.{q,k,v} from an edge table.

Pure plotly (no graphviz). Heads are coloured by their ``classify`` label; each receiver has three
ports (q below, k level, v above) so a pair's q, k and v edges stay apart; an edge's colour is its
input and its width grows with ``|effect|``. Lines cannot carry hover text in plotly, so each edge
has a marker at its midpoint whose hover shows the effect with its CI, the control and the
composition, and whose ``customdata`` ``[sender, receiver, input]`` a selection reads
(:func:`selected_edge`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd
    import plotly.graph_objects as go

INPUT_COLORS = {"q": "#1f77b4", "k": "#d62728", "v": "#2ca02c", "resid": "#7f7f7f"}
PORT_OFFSET = {"q": -0.18, "k": 0.0, "v": 0.18, "resid": 0.0}


def node_xy(name: str, n_layers: int, n_heads: int) -> tuple[float, float]:
    """Where a node sits: ``L{l}H{h}`` at ``(l + 1, h)``, ``embed`` left, ``mlp{l}`` under layer l, ``logits`` right.

    >>> node_xy("L1H2", 2, 4), node_xy("embed", 2, 4), node_xy("mlp0", 2, 4)
    ((2.0, 2.0), (0.0, 1.5), (1.5, -1.0))
    """
    mid = (n_heads - 1) / 2
    if name == "embed":
        return 0.0, mid
    if name == "logits":
        return float(n_layers + 1), mid
    if name.startswith("mlp"):
        return int(name[3:]) + 1.5, -1.0
    layer, head = name[1:].split("H")
    return float(int(layer) + 1), float(int(head))


def circuit_figure(edges: pd.DataFrame, n_layers: int, n_heads: int, labels: dict[str, str] | None = None,
                   title: str | None = None) -> go.Figure:
    """The graph of ``edges`` (an edge table, e.g. ``headlens.circuit(...)``) on an ``n_layers x n_heads`` model.

    Args:
        edges: the edge table; every row is drawn (filter it first, e.g. to significant edges).
        n_layers: the model's layer count.
        n_heads: heads per layer (every head is drawn, grey when unlabelled).
        labels: ``{"L1H1": "induction"}`` (``classify``'s labels) colouring the heads.
        title: the figure title.
    """
    import plotly.graph_objects as go

    from headlens.viz.grid import LABEL_COLORS, UNLABELLED_COLOR

    labels = labels or {}
    fig = go.Figure()
    biggest = float(edges.effect.abs().max()) if len(edges) else 1.0
    for c, color in INPUT_COLORS.items():
        rows = edges[edges.input == c]
        xs, ys, mx, my, hover, data = [], [], [], [], [], []
        for r in rows.itertuples():
            x0, y0 = node_xy(r.sender, n_layers, n_heads)
            x1, y1 = node_xy(r.receiver, n_layers, n_heads)
            y1 += PORT_OFFSET[c]
            width = 1 + 9 * abs(r.effect) / (biggest or 1.0)
            fig.add_trace(go.Scatter(x=[x0, x1], y=[y0, y1], mode="lines", line=dict(color=color, width=width),
                                     opacity=0.75, hoverinfo="skip", showlegend=False))
            mx.append((x0 + x1) / 2)
            my.append((y0 + y1) / 2)
            data.append([r.sender, r.receiver, c])
            comp = "-" if r.composition != r.composition else f"{r.composition:.3f} (z {r.composition_z:+.1f})"
            ctrl = "-" if r.control != r.control else f"{r.control:+.3f} [{r.control_ci_low:+.3f}, {r.control_ci_high:+.3f}]"
            hover.append(f"{r.sender} → {r.receiver}.{c}<br>effect {r.effect:+.3f} [{r.ci_low:+.3f}, {r.ci_high:+.3f}]"
                         f"<br>control {ctrl}<br>composition {comp}" + ("<br><b>weights disagree</b>" if r.disagree else ""))
            xs.append(x0)
            ys.append(y0)
        fig.add_trace(go.Scatter(x=mx, y=my, mode="markers", name=f"{c} edges", customdata=data,
                                 marker=dict(color=color, size=9, symbol="diamond"), hovertext=hover,
                                 hoverinfo="text"))
    names = ["embed", *(f"L{layer}H{h}" for layer in range(n_layers) for h in range(n_heads))]
    names += sorted({n for n in (*edges.sender, *edges.receiver) if n.startswith("mlp") or n == "logits"})
    xy = [node_xy(n, n_layers, n_heads) for n in names]
    colors = [LABEL_COLORS.get(labels.get(n, "").split(",")[0].strip(), UNLABELLED_COLOR if n.startswith("L")
                               else "#555555") for n in names]
    fig.add_trace(go.Scatter(
        x=[p[0] for p in xy], y=[p[1] for p in xy], mode="markers+text", text=names, textposition="top center",
        customdata=[[n] for n in names], marker=dict(color=colors, size=22, symbol="square",
                                                      line=dict(color="#333333", width=1)),
        hovertext=[f"{n}: {labels.get(n) or 'unlabelled'}" for n in names], hoverinfo="text", name="heads"))
    fig.update_layout(
        title=title or "circuit: edges sender → receiver.{q,k,v} (width: effect)", height=160 + 70 * n_heads,
        xaxis=dict(tickvals=list(range(n_layers + 2)), showgrid=False, zeroline=False,
                   ticktext=["embed", *(f"layer {i}" for i in range(n_layers)), "logits"]),
        yaxis=dict(title="head", showgrid=False, zeroline=False, autorange="reversed", dtick=1),
        plot_bgcolor="white", legend=dict(orientation="h", y=-0.12), margin=dict(l=50, r=20, t=60, b=60))
    return fig


def selected_edge(selection: Any) -> tuple[str, str, str] | None:
    """``(sender, receiver, input)`` of the first edge marker in a plotly selection (Streamlit's
    ``on_select`` payload or a list of points), else None.

    >>> selected_edge({"selection": {"points": [{"customdata": ["L0H0", "L1H1", "k"]}]}})
    ('L0H0', 'L1H1', 'k')
    """
    points = selection.get("selection", {}).get("points", []) if isinstance(selection, dict) else selection or []
    for p in points:
        data = p.get("customdata") if isinstance(p, dict) else None
        if data and len(data) == 3:
            return str(data[0]), str(data[1]), str(data[2])
    return None
