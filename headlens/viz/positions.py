"""The circuit graph at named positions: heads by layer (x) and by the position they act at (y), coloured by role.

An IOI circuit is a story told across positions: induction heads at S2 feed S-inhibition heads at END
through their values, which feed the name movers' queries at END. So each node is a head *at a position*
(``L23H0@END``), placed at its layer and in its position's row (several heads of a layer in one row sit
side by side in it); an edge runs from the sender at its ``sender_pos`` to the receiver at its
``receiver_pos`` (a key or value edge crosses rows), coloured by input, its width growing with ``|effect|``.
The embedding sits left of layer 0 in each row, MLPs between layers, the logits right of the last layer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd
    import plotly.graph_objects as go

ROLE_COLORS = {"name mover": "#d62728", "negative name mover": "#9467bd", "S-inhibition": "#ff7f0e",
               "induction": "#1f77b4", "duplicate token": "#17becf", "previous token": "#2ca02c",
               "writes the answer": "#d62728", "writes against": "#9467bd", "into a writer's query": "#ff7f0e"}
OTHER_COLOR = "#8c8c8c"
IOI_ORDER = ("IO", "S1", "S1+1", "S2", "END")


def role_color(role: str) -> str:
    """The colour of a role string (``"induction (induction, previous_token)"`` -> induction's)."""
    return ROLE_COLORS.get(role.split(" (")[0], OTHER_COLOR)


def _rows(edges: Any) -> list[str]:
    names = {p for col in ("receiver_pos", "sender_pos") for p in edges[col]} - {"all"}
    order = [p for p in IOI_ORDER if p in names] + sorted(names - set(IOI_ORDER))
    return order + (["all"] if "all" in set(edges.receiver_pos) | set(edges.sender_pos) else [])


def node_places(edges: Any, n_layers: int) -> dict[tuple[str, str], tuple[float, float]]:
    """``(name, position) -> (x, y)``: x the layer (embed -1, mlp l at l + 0.5, logits n_layers), y the
    position's row, heads of one layer and row spread across it."""
    rows = _rows(edges)
    nodes: set[tuple[str, str]] = set()
    for r in edges.itertuples():
        nodes |= {(r.sender, r.sender_pos), (r.receiver, r.receiver_pos)}
    out: dict[tuple[str, str], tuple[float, float]] = {}
    groups: dict[tuple[float, str], list[str]] = {}
    for name, pos in sorted(nodes):
        if name == "embed":
            x = -1.0
        elif name == "logits":
            x = float(n_layers)
        elif name.startswith("mlp"):
            x = int(name[3:]) + 0.5
        else:
            x = float(int(name[1:].split("H")[0]))
        groups.setdefault((x, pos), []).append(name)
    for (x, pos), names in groups.items():
        for i, name in enumerate(names):
            out[name, pos] = (x, rows.index(pos) + (i - (len(names) - 1) / 2) * 0.22)
    return out


def positional_figure(edges: pd.DataFrame, n_layers: int, roles: dict[str, str] | None = None,
                      title: str | None = None) -> go.Figure:
    """The graph of a positional edge table (``receiver_pos`` / ``sender_pos``), nodes coloured by ``roles``
    (``{"L23H0@END": "name mover"}``, discovery's ``attrs["roles"]``)."""
    import plotly.graph_objects as go

    from headlens.viz.circuit import INPUT_COLORS

    roles = roles or {}
    places = node_places(edges, n_layers)
    fig = go.Figure()
    biggest = float(edges.effect.abs().max()) if len(edges) else 1.0
    for c, color in INPUT_COLORS.items():
        mx, my, hover, data = [], [], [], []
        for r in edges[edges.input == c].itertuples():
            x0, y0 = places[r.sender, r.sender_pos]
            x1, y1 = places[r.receiver, r.receiver_pos]
            fig.add_trace(go.Scatter(x=[x0, x1], y=[y0, y1], mode="lines", hoverinfo="skip", showlegend=False,
                                     line=dict(color=color, width=1 + 9 * abs(r.effect) / (biggest or 1.0)),
                                     opacity=0.7))
            mx.append((x0 + x1) / 2)
            my.append((y0 + y1) / 2)
            data.append([r.sender, r.receiver, c])
            hover.append(f"{r.sender}@{r.sender_pos} → {r.receiver}.{c}@{r.receiver_pos}<br>effect {r.effect:+.3f} "
                         f"[{r.ci_low:+.3f}, {r.ci_high:+.3f}]")
        fig.add_trace(go.Scatter(x=mx, y=my, mode="markers", name=f"{c} edges", customdata=data, hovertext=hover,
                                 hoverinfo="text", marker=dict(color=color, size=8, symbol="diamond")))
    keys = list(places)
    labels = [roles.get(f"{n}@{p}", "") for n, p in keys]
    fig.add_trace(go.Scatter(
        x=[places[k][0] for k in keys], y=[places[k][1] for k in keys], mode="markers+text", name="heads",
        text=[n for n, _ in keys], textposition="top center", customdata=[[n, p] for n, p in keys],
        marker=dict(size=20, symbol="square", line=dict(color="#333333", width=1),
                    color=[role_color(x) if n.startswith("L") else "#555555" for (n, _), x in zip(keys, labels, strict=True)]),
        hovertext=[f"{n}@{p}: {x or '-'}" for (n, p), x in zip(keys, labels, strict=True)], hoverinfo="text"))
    for role in sorted({x.split(" (")[0] for x in labels if x}):  # a legend of the roles present
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name=role,
                                 marker=dict(size=12, symbol="square", color=role_color(role))))
    rows = _rows(edges)
    fig.update_layout(
        title=title or "circuit by layer and position (width: effect; colour: role)", height=200 + 110 * len(rows),
        xaxis=dict(title="layer", range=[-1.6, n_layers + 0.6], showgrid=False, zeroline=False,
                   tickvals=[-1, *range(0, n_layers, max(1, n_layers // 15)), n_layers],
                   ticktext=["embed", *(str(i) for i in range(0, n_layers, max(1, n_layers // 15))), "logits"]),
        yaxis=dict(title="position", tickvals=list(range(len(rows))), ticktext=rows, autorange="reversed",
                   showgrid=True, zeroline=False),
        plot_bgcolor="white", legend=dict(orientation="h", y=-0.15), margin=dict(l=60, r=20, t=60, b=70))
    return fig
