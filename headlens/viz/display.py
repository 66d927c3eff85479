"""Rich display in Jupyter: a scores table shows its head grid and labelled heads, an edge table its graph, a model
its one-line card. Plain Python, ``print(table)`` and the CLI are unchanged.

Why IPython formatters and not methods: a scores table is a plain pandas DataFrame (subclassing it would change
its type for every test and user comparing frames; patching pandas would change every DataFrame). IPython lets a
library add an HTML printer *by type name* without importing the type: :func:`register` adds one for
``pandas.DataFrame`` that answers only for headlens' tables (recognised by their columns) and hands every other
frame back to pandas' own ``_repr_html_``, and one for each model class (its card). ``import headlens`` calls
:func:`register` when it runs inside IPython (``%load_ext headlens`` does too); outside IPython nothing happens.
The HTML is static (inline SVG and tables, no JavaScript), so a notebook rendered in the docs shows it as well.
"""

from __future__ import annotations

import html
from typing import Any

SCORES_KEY = ("model", "layer", "head", "kv_head", "detector", "score")  # headlens.scoring.table.COLUMNS' start
EDGES_KEY = ("model", "sender", "receiver", "kv_head", "input", "effect")  # headlens.circuits.edges.COLUMNS' start
MODELS = (("headlens.models.hf.bridge", "BridgeModel"), ("headlens.models.gpt", "GPT"))


def register(ip: Any) -> None:
    """Add headlens' HTML printers to the IPython shell ``ip`` (see the module docstring)."""
    html_formatter = ip.display_formatter.formatters["text/html"]
    for module in ("pandas", "pandas.core.frame"):  # DataFrame.__module__: "pandas" from pandas 3 on
        html_formatter.for_type_by_name(module, "DataFrame", frame_html)
    for module, name in MODELS:
        html_formatter.for_type_by_name(module, name, model_card_html)


def frame_html(df: Any) -> str | None:
    """The rich view of a headlens table; any other DataFrame as pandas shows it."""
    cols = tuple(df.columns[:6])
    if cols == SCORES_KEY:
        return scores_html(df)
    if cols == EDGES_KEY:
        return edges_html(df)
    return df._repr_html_()


def scores_html(df: Any) -> str:
    """The layer x head grid (each head coloured by its strongest label on text, :mod:`headlens.viz.grid`'s
    colours), then the labelled heads as the HTML report lists them; labels read from the weights alone (what a
    head's OV would write, not what it attends to) in one line after them, never as behaviour."""
    from headlens.scoring.primary import from_weights, strongest_rows
    from headlens.viz.grid import LABEL_COLORS, UNLABELLED_COLOR, _tint, label_mark
    from headlens.viz.report import _labelled_table

    if df.empty:
        return "<p>headlens scores: no rows</p>"
    n_layers, n_heads = int(df["layer"].max()) + 1, int(df["head"].max()) + 1
    ov = from_weights(df)
    best = {(int(r.layer), int(r.head)): r for r in strongest_rows(df[~ov]).itertuples()}
    rows = []
    for layer in range(n_layers):
        cells = []
        for head in range(n_heads):
            r = best.get((layer, head))
            color = UNLABELLED_COLOR if r is None else _tint(LABEL_COLORS.get(str(r.detector).split("(")[0],
                                                                               "#555555"), 0.35 + 0.65 * r.score)
            text = "" if r is None else html.escape(label_mark(r.detector))
            tip = f"L{layer}H{head}" + ("" if r is None else f" {html.escape(str(r.detector))} {r.score:.3f}")
            cells.append(f'<td title="{tip}" style="background:{color};width:2.6em;text-align:center;'
                         f'font-size:0.8em">{text}</td>')
        rows.append(f"<tr><th>L{layer}</th>{''.join(cells)}</tr>")
    header = "".join(f"<th>H{h}</th>" for h in range(n_heads))
    labelled = df[df["label"].fillna(False).astype(bool)]
    model = html.escape(str(df["model"].iloc[0]))
    return (f"<div><b>headlens scores</b>: {model}, {len(df)} rows, {labelled[['layer', 'head']].drop_duplicates().shape[0]}"
            f" labelled heads of {n_layers * n_heads}<table><tr><th></th>{header}</tr>{''.join(rows)}</table>"
            f"{_labelled_table(labelled[~ov[labelled.index]])}{_weights_line(labelled[ov[labelled.index]])}</div>")


def _weights_line(rows: Any) -> str:
    """The weight-only labels in one line: type, then its heads (strongest first)."""
    if rows.empty:
        return ""
    by_type = {d: ", ".join(f"L{r.layer}H{r.head}" for r in g.sort_values("score", ascending=False).itertuples())
               for d, g in rows.groupby("detector", sort=False)}
    return ("<p>Read from the weights (what the OV circuit would write), not from attention on text: "
            + html.escape("; ".join(f"{d} {heads}" for d, heads in by_type.items())) + "</p>")


def edges_html(df: Any, width: int = 520, height: int = 260) -> str:
    """The circuit graph as inline SVG (nodes where :func:`headlens.viz.circuit.node_xy` puts them, an edge's
    colour its input and its width ``|effect|``; edges the table does not call significant faint), then the table."""
    from headlens.circuits.edges import significant_mask
    from headlens.viz.circuit import INPUT_COLORS, node_xy

    if df.empty:
        return "<p>headlens edges: no rows</p>"
    heads = [n for n in (*df["sender"], *df["receiver"]) if n.startswith("L")]
    n_layers = max([int(n[1:].split("H")[0]) + 1 for n in heads] + [1])
    n_heads = max([int(n.split("H")[1]) + 1 for n in heads] + [1])
    xy = {n: node_xy(n, n_layers, n_heads) for n in {*df["sender"], *df["receiver"]}}

    def at(n: str) -> tuple[float, float]:
        x, y = xy[n]
        return 30 + x * (width - 60) / (n_layers + 1), height - 30 - (y + 1) * (height - 60) / (n_heads + 1)

    strongest = float(df["effect"].abs().max()) or 1.0
    sig = significant_mask(df)
    lines = []
    for r, s in zip(df.itertuples(), sig, strict=True):
        (x1, y1), (x2, y2) = at(r.sender), at(r.receiver)
        lines.append(f'<line x1="{x1:.0f}" y1="{y1:.0f}" x2="{x2:.0f}" y2="{y2:.0f}" '
                     f'stroke="{INPUT_COLORS.get(r.input, "#7f7f7f")}" stroke-opacity="{0.9 if s else 0.15}" '
                     f'stroke-width="{1 + 5 * abs(r.effect) / strongest:.1f}"><title>{r.sender} -> {r.receiver}.'
                     f'{r.input} {r.effect:+.4f}</title></line>')
    nodes = [f'<circle cx="{at(n)[0]:.0f}" cy="{at(n)[1]:.0f}" r="9" fill="#fff" stroke="#333"/><text x="'
             f'{at(n)[0]:.0f}" y="{at(n)[1] - 12:.0f}" font-size="10" text-anchor="middle">{html.escape(n)}</text>'
             for n in sorted(xy)]
    legend = " ".join(f'<span style="color:{c}">&#9644; {k}</span>' for k, c in INPUT_COLORS.items())
    return (f"<div><b>headlens edges</b>: {len(df)} edges, {int(sig.sum())} significant ({legend})<br>"
            f'<svg width="{width}" height="{height}">{"".join(lines)}{"".join(nodes)}</svg>'
            f"{df._repr_html_()}</div>")


def model_card(model: Any) -> str:
    """One line: name, family, heads (and key/value heads), width, dtype and device, packed weights, origin.

    >>> from headlens.testing import planted_circuit_model
    >>> model_card(planted_circuit_model())
    'planted · headlens GPT · 2 layers x 4 heads · d_model 128 · float32 on cpu'
    """
    cfg = model.cfg
    family = str(getattr(model, "hf_config", {}).get("model_type", "")) or "headlens GPT"
    kv = int(getattr(cfg, "n_kv_heads", 0) or cfg.n_heads)
    param = next(model.parameters())
    parts = [str(getattr(model, "name", "") or type(model).__name__), family,
             f"{cfg.n_layers} layers x {cfg.n_heads} heads" + (f" ({kv} kv heads)" if kv != cfg.n_heads else ""),
             f"d_model {cfg.d_model}", f"{str(param.dtype).removeprefix('torch.')} on {param.device}"]
    source = dict(getattr(model, "source", None) or {})
    if packed := getattr(model, "packed_weights", None):
        parts.append(f"packed weights: {packed}")
    if source.get("kind") == "gguf":
        parts.append(f"GGUF {source.get('quantization')} {source.get('file', '').rsplit('/', 1)[-1]}, dequantized")
    if source.get("object"):
        parts.append(f"a {source['object']} object in memory")
    return " · ".join(parts)


def model_card_html(model: Any) -> str:
    return f"<code>{html.escape(model_card(model))}</code>"
