"""The circuit graph: heads where they belong, one edge per row coloured by input, hover with CI and composition."""

from __future__ import annotations

import pandas as pd

from headlens.circuits.edges import COLUMNS
from headlens.viz import circuit_figure, selected_edge
from headlens.viz.circuit import INPUT_COLORS, node_xy


def _table() -> pd.DataFrame:
    rows = [["m", "L0H0", "L1H1", 1, "k", 3.4, 3.3, 3.5, 1.2, 1.1, 1.3, 0.16, 7.0, False, ""],
            ["m", "L0H2", "L1H1", 1, "k", 1.0, 0.9, 1.1, 1.2, 1.1, 1.3, 0.12, 1.0, True, ""],
            ["m", "embed", "L1H1", 1, "q", 2.0, 1.9, 2.1, float("nan"), float("nan"), float("nan"),
             float("nan"), float("nan"), False, ""]]
    return pd.DataFrame([[*r, "all", "all"] for r in rows], columns=COLUMNS)


def test_graph_places_heads_and_draws_each_edge():
    fig = circuit_figure(_table(), 2, 4, {"L0H0": "previous_token", "L1H1": "induction"})
    lines = [t for t in fig.data if t.mode == "lines"]
    assert len(lines) == 3
    widths = sorted(t.line.width for t in lines)
    assert widths[-1] == 10 and widths[0] < widths[-1]  # widest: the largest |effect|
    k_marks = next(t for t in fig.data if t.name == "k edges")
    assert k_marks.marker.color == INPUT_COLORS["k"] and len(k_marks.customdata) == 2
    assert "composition 0.160 (z +7.0)" in k_marks.hovertext[0] and "weights disagree" in k_marks.hovertext[1]
    heads = next(t for t in fig.data if t.name == "heads")
    assert len(heads.x) == 1 + 8  # embed and every head
    assert node_xy("L1H1", 2, 4) == (2.0, 1.0)


def test_selected_edge_reads_an_edge_marker_and_ignores_heads():
    assert selected_edge({"selection": {"points": [{"customdata": ["L1H1"]}]}}) is None
    assert selected_edge([{"customdata": ["L0H0", "L1H1", "k"]}]) == ("L0H0", "L1H1", "k")


def test_the_positional_graph_places_heads_by_layer_and_position_coloured_by_role():
    from headlens.viz import positional_figure
    from headlens.viz.positions import ROLE_COLORS, node_places

    def row(sender, receiver, c, sp, rp, effect):
        return ["m", sender, receiver, 0, c, effect, effect - 0.1, effect + 0.1, 0.0, -0.1, 0.1, float("nan"),
                float("nan"), False, "", rp, sp]

    df = pd.DataFrame([row("L9H9", "logits", "resid", "END", "END", -2.0),
                       row("L7H3", "L9H9", "q", "END", "END", -0.5),
                       row("L5H5", "L7H3", "v", "S2", "END", -0.3),
                       row("L5H1", "L7H3", "v", "S2", "END", -0.2)], columns=COLUMNS)
    roles = {"L9H9@END": "name mover", "L7H3@END": "S-inhibition", "L5H5@S2": "induction (induction)",
             "L5H1@S2": "duplicate token"}
    places = node_places(df, 12)
    assert places["L9H9", "END"][0] == 9 and places["logits", "END"][0] == 12
    assert places["L5H5", "S2"][1] < places["L9H9", "END"][1]  # S2's row comes before END's
    assert places["L5H5", "S2"] != places["L5H1", "S2"]  # two heads of one layer and row, side by side
    fig = positional_figure(df, 12, roles)
    heads = next(t for t in fig.data if t.name == "heads")
    colour = dict(zip((tuple(c) for c in heads.customdata), heads.marker.color, strict=True))
    assert colour["L5H5", "S2"] == ROLE_COLORS["induction"] and colour["L9H9", "END"] == ROLE_COLORS["name mover"]
    v = next(t for t in fig.data if t.name == "v edges")
    assert len(v.customdata) == 2 and "L5H5@S2 → L7H3.v@END" in v.hovertext[0]
    assert {"name mover", "S-inhibition", "induction", "duplicate token"} <= {t.name for t in fig.data}
