"""One standalone HTML page for a classification run: what scripted runs look at instead of a CSV.

The page opens offline (plotly.js is inlined once, every figure after it reuses it) and holds:
what the heads do (per type its strongest heads, as ``headlens classify`` prints it), the head grid
coloured by each head's strongest label (resting only where a head does nothing else), the labelled heads with their 95 %
confidence intervals, each labelled head's pattern on an example prompt (heatmap and coloured
text), what the vocabulary heads write (:mod:`headlens.viz.vocabulary`), the circuit when an edge table is given
(graph and table), the heads that write a prediction when an attribution table is given (direct logit
attribution: bars and the strongest writers and suppressors with their CIs), and the provenance of the scores
(model, probes, seeds, thresholds, headlens version).

>>> import headlens
>>> model = headlens.load("induction-2l")  # doctest: +SKIP
>>> write_report(model, headlens.classify(model), "report.html")  # doctest: +SKIP
"""

from __future__ import annotations

import datetime
import html
import json
import os
from pathlib import Path
from typing import Any

from headlens.errors import OutputError
from headlens.models.files import check_writable, write_text
from headlens.scoring.primary import LABEL_RULE
from headlens.viz.grid import fmt_number

PROVENANCE_TAG = '<script type="application/json" id="headlens-provenance">'
MAX_PATTERNS = 16  # labelled heads whose pattern is drawn (strongest first); the table lists them all

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1200px; color: #222; }
table { border-collapse: collapse; font-size: 0.9em; } td, th { padding: 0.25em 0.7em; text-align: right; }
th { border-bottom: 2px solid #444; } tr:nth-child(even) td { background: #f4f4f4; }
td:first-child, td:nth-child(2), th:first-child, th:nth-child(2) { text-align: left; }
pre { background: #f6f6f6; padding: 0.8em; overflow-x: auto; font-size: 0.85em; }
.head { margin: 1.5em 0; border-top: 1px solid #ddd; padding-top: 0.5em; }
"""


def report_html(model: Any, table: Any, prompt: str | None = None, edges: Any = None, attribution: Any = None) -> str:
    """The report page for ``table`` (a ``headlens.classify`` result on ``model``) as one HTML string.

    Args:
        model: the model the table scores (patterns are computed on it).
        table: the scores table; its ``attrs`` are the provenance.
        prompt: the example text the patterns are drawn on (default: a text with a repeated
            segment and nested brackets in the model's own alphabet).
        edges: an edge table (``headlens.circuit``): adds the circuit graph of its significant
            edges and the whole table.
        attribution: an attribution table (``headlens.attribute``): adds who writes its target.
    """
    from headlens.probes.texts import example_text
    from headlens.scoring.primary import from_weights
    from headlens.scoring.table import labelled_heads
    from headlens.viz.grid import head_grid_figure
    from headlens.viz.vocabulary import vocabulary_section

    attrs = dict(table.attrs)
    name = str(attrs.get("model", getattr(model, "name", "model")))
    text = table[~from_weights(table)]  # behaviour on text; the weight-only types have their own section
    grid = head_grid_figure(text, "induction", model.n_layers, model.n_heads, color_by="label",
                            title=f"{name}: strongest label per head on text (colour: type, intensity: score)")
    parts = [f"<h1>headlens report: {html.escape(name)}</h1>",
             f"<p>{model.n_layers} layers × {model.n_heads} heads; {int(table['label'].sum())} labels on "
             f"{len(set(zip(table['layer'], table['head'], strict=True)))} heads. Generated "
             f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M UTC} by headlens "
             f"{html.escape(str(attrs.get('headlens_version', '')))}.</p>",
             *[f"<p><b>What runs:</b> {html.escape(str(line))}</p>" for line in attrs.get("substitutions") or []],
             "<h2>What the heads do</h2>", _summary_table(text), _weights_note(table),
             "<h2>Head grid</h2>", grid.to_html(full_html=False, include_plotlyjs=True),
             "<h2>Labelled heads</h2>", _labelled_table(labelled_heads(text))]
    prompt = prompt if prompt is not None else example_text(model)
    parts += _patterns(model, text, prompt)
    parts += vocabulary_section(model, table)
    if edges is not None:
        parts += _circuit(model, table, edges)
    if attribution is not None:
        parts += _attribution(attribution)
    prov = json.dumps(attrs, indent=1, default=str)
    embedded = prov.replace("</", "<\\/")  # JSON-equal; cannot close the script element
    parts += ["<h2>Provenance</h2>", f"<pre>{html.escape(prov, quote=False)}</pre>",
              # the same, machine-readable: json.loads(page.split(PROVENANCE_TAG)[1].split("</script>")[0])
              f"{PROVENANCE_TAG}{embedded}</script>"]
    return (f"<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>headlens report: {html.escape(name)}"
            f"</title><style>{_STYLE}</style></head><body>{''.join(parts)}</body></html>\n")



def _summary_table(table: Any) -> str:
    """Per head type: how many heads carry the label and the strongest of them, with their ``rest`` (the
    same selection ``headlens classify`` prints, :func:`headlens.scoring.summary.type_summaries`)."""
    from headlens.scoring.primary import strength
    from headlens.scoring.summary import type_summaries

    types = [t for t in type_summaries(table) if t.n_labelled or t.preference]
    if not types:
        return f"<p>No head passes the labelling rule ({html.escape(LABEL_RULE)}).</p>"
    body = []
    for t in types:
        stat = "preference" if t.preference else "score"
        powers = strength(t.heads).tolist() if not t.heads.empty and "baseline" in t.heads else [float("nan")] * len(t.heads)
        heads = ", ".join(f"L{r.layer}H{r.head} {fmt_number(getattr(r, stat))} "
                          f"(strength {fmt_number(p, '.2f')}, rest {fmt_number(getattr(r, 'rest', None), '.2f')})"
                          for r, p in zip(t.heads.itertuples(), powers, strict=True)) or "none that does nothing else"
        count = f"{t.n_labelled}" + (f" ({t.n_only} rest and do nothing else)" if t.resting else "")
        body.append(f"<tr><td>{html.escape(t.detector)}</td><td>{count}</td><td>{html.escape(heads)}</td></tr>")
    return ("<p>What heads do on text: the text's own patterns first, task types after them, resting last. strength = (score - chance) / (1 - "
            "chance), one scale for every type (0 at chance, 1 perfect); rest = the head's attention on the first "
            "token, on the probe its row was scored on; resting labels "
            "(first_token, sink) list only the heads that do nothing else.</p><table><tr><th>type</th><th>labels</th>"
            f"<th>strongest heads</th></tr>{''.join(body)}</table>")


def _weights_note(table: Any) -> str:
    """One line: the types read from the weights alone, and where their heads are (not among the behaviour)."""
    from headlens.scoring.primary import from_weights

    rows = table[from_weights(table) & table["label"].fillna(False).astype(bool)]
    if rows.empty:
        return ""
    counts = ", ".join(f"{d} {n}" for d, n in rows["detector"].value_counts(sort=False).items())
    return (f"<p>Read from the weights, not from attention on text ({html.escape(counts)} heads): what a head's OV "
            "circuit would write if it attended to a token, whatever it attends to. Listed under Vocabulary heads, "
            "not in the grid or the tables of behaviour above.</p>")


def _labelled_table(rows: Any) -> str:
    if rows.empty:
        return f"<p>No head passes the labelling rule ({html.escape(LABEL_RULE)}).</p>"
    gated = "dla" in rows.columns and rows["dla"].notna().any()  # name movers: what the head writes
    cols = ("head", "label", "score", "95% CI", "baseline", "lift", "positions", "rest") + (
        ("DLA (95% CI)",) if gated else ())
    head = "".join(f"<th>{c}</th>" for c in cols)
    body = []
    for r in rows.itertuples():
        dla = "" if not gated else ("<td>-</td>" if r.dla != r.dla else
                                    f"<td>{r.dla:+.3f} [{r.dla_ci_low:+.3f}, {r.dla_ci_high:+.3f}]</td>")
        body.append(f"<tr><td>L{r.layer}H{r.head}</td><td>{html.escape(str(r.detector))}</td><td>{r.score:.3f}</td>"
                    f"<td>[{r.ci_low:.3f}, {r.ci_high:.3f}]</td><td>{fmt_number(r.baseline)}</td>"
                    f"<td>{fmt_number(r.lift, '.1f')}</td>"
                    f"<td>{int(r.n_positions)}</td><td>{fmt_number(getattr(r, 'rest', None), '.2f')}</td>{dla}</tr>")
    return f"<table><tr>{head}</tr>{''.join(body)}</table>"


def _patterns(model: Any, table: Any, prompt: str) -> list[str]:
    """Each labelled head's pattern on ``prompt``: a heatmap (every token labelled) and coloured text."""
    import torch

    from headlens.models.token_text import readable_tokens
    from headlens.scoring.table import head_labels
    from headlens.viz.patterns import pattern_figure, token_window
    from headlens.viz.tokenview import token_view_html

    labels = head_labels(table)
    if not labels or not prompt:
        return []
    heads = list(labels)[:MAX_PATTERNS]
    names = [f"blocks.{layer}.attn.hook_pattern" for layer in sorted({layer for layer, _ in heads})]
    tokens = model.to_tokens(prompt)  # (1, T)
    with torch.inference_mode():
        _, cache = model.run_with_cache(tokens, names_filter=lambda n: n in names)
    str_tokens = readable_tokens(model, tokens)  # ' Paris', not 'ĠParis'
    window = token_window(len(str_tokens))
    out = [f"<h2>Patterns of the labelled heads</h2><p>On the example prompt <code>{html.escape(prompt)}</code>"
           + (f" (first {len(window)} of {len(str_tokens)} tokens in the heatmaps)" if len(window) < len(str_tokens)
              else "") + ".</p>"]
    for layer, head in heads:
        pattern = cache[f"blocks.{layer}.attn.hook_pattern"][0, head].float().cpu().numpy()  # (Q, K)
        name = f"L{layer}H{head}"
        fig = pattern_figure(pattern, str_tokens, title=f"{name}: {', '.join(labels[(layer, head)])}",
                                 causal=model.is_causal, window=window)
        out.append(f'<div class="head"><h3>{name}: {html.escape(", ".join(labels[(layer, head)]))}</h3>'
                   + fig.to_html(full_html=False, include_plotlyjs=False)
                   + token_view_html(str_tokens, {name: pattern}, uid=f"tokens-{name}") + "</div>")
    return out


def _circuit(model: Any, table: Any, edges: Any) -> list[str]:
    """The circuit section: the graph of the significant edges (heads coloured by label) and every edge."""
    from headlens.circuits.api import head_labels
    from headlens.circuits.edges import significant_mask
    from headlens.viz.circuit import circuit_figure

    labels = head_labels(table) or {}
    sig = edges[significant_mask(edges)]
    title = f"significant edges for {edges.attrs.get('metric', '')} ({len(sig)} of {len(edges)})"
    at = "receiver_pos" in edges and bool(((edges.receiver_pos != "all") | (edges.sender_pos != "all")).any())
    if at:  # a circuit at named positions (IOI): by layer and position, coloured by role
        from headlens.viz.positions import positional_figure

        fig = positional_figure(sig, model.n_layers, edges.attrs.get("roles"), title=title)
    else:
        fig = circuit_figure(sig, model.n_layers, model.n_heads, labels, title=title)
    cols = ["sender", "receiver", "kv_head", "input", *(("sender_pos", "receiver_pos") if at else ()), "effect",
            "ci_low", "ci_high", "control", "composition", "composition_z", "disagree", "label"]
    rows = "".join("<tr>" + "".join(f"<td>{_cell(getattr(r, c))}</td>" for c in cols) + "</tr>"
                   for r in edges.itertuples())
    head = "".join(f"<th>{c}</th>" for c in cols)
    return ["<h2>Circuit</h2>", f"<p>Edges sender → receiver.input by exact patching on the direct path "
            f"({html.escape(str(edges.attrs.get('method', '')))} ablation; clean "
            f"{html.escape(str(edges.attrs.get('metric', '')))} {edges.attrs.get('clean', float('nan')):.4f}).</p>",
            fig.to_html(full_html=False, include_plotlyjs=False), *_roles(edges),
            f"<table><tr>{head}</tr>{rows}</table>"]


def _roles(edges: Any) -> list[str]:
    """Discovery's roles and faithfulness, when it ran (a positional circuit: IOI)."""
    out = []
    roles = edges.attrs.get("roles")
    if roles:
        items = "".join(f"<tr><td>{html.escape(k)}</td><td>{html.escape(v)}</td></tr>" for k, v in roles.items())
        out.append(f"<h3>Roles</h3><table><tr><th>head at position</th><th>role</th></tr>{items}</table>")
    ioi, mib = edges.attrs.get("ioi_faithfulness"), edges.attrs.get("mib")
    if ioi and mib:
        out.append(f"<p>Faithfulness: the circuit alone recovers {edges.attrs['faithfulness']:.2f} of the "
                   f"clean-vs-ablated gap; F(M) {ioi['F_M']:.3f}, F(C) {ioi['F_C']:.3f}, |F(M) - F(C)| "
                   f"{ioi['abs_diff']:.3f} (Wang et al. 2022); MIB CPR {mib['cpr']:.3f}, CMD {mib['cmd']:.3f} "
                   f"(Mueller et al. 2025) over {mib['n_edges']} measured edges.</p>")
    return out


def _attribution(table: Any, top: int = 10) -> list[str]:
    """The direct logit attribution section: the strongest writers and suppressors, as bars and as a table."""
    from headlens.scoring.writers import attribution_summary, strongest
    from headlens.viz.attribution import writers_figure

    summary = attribution_summary(table)
    writers, suppressors = strongest(summary, top)
    total, n = summary.attrs["total"], int(summary["n_prompts"].iloc[0])
    cols = ["component", "attribution", "ci_low", "ci_high", "share"]
    rows = "".join("<tr>" + "".join(f"<td>{_cell(getattr(r, c))}</td>" for c in cols) + "</tr>"
                   for r in [*writers.itertuples(), *suppressors.itertuples()])
    head = "".join(f"<th>{c}</th>" for c in cols)
    what = html.escape(str(summary["target"].iloc[0]))
    return ["<h2>Who writes the prediction</h2>",
            f"<p>Direct logit attribution to {what} over {n} prompt(s) (the final norm's scale frozen; mean "
            f"total {total['mean']:+.3f}, CIs over prompts); the parts sum to the model's logits within "
            f"{table.attrs.get('max_error', float('nan')):.1g}.</p>",
            writers_figure(summary, top).to_html(full_html=False, include_plotlyjs=False),
            f"<table><tr>{head}</tr>{rows}</table>"]


def _cell(v: Any) -> str:
    if isinstance(v, float):
        return "-" if v != v else f"{v:+.3f}"
    return html.escape(str(v))


def check_report_path(path: str | os.PathLike) -> Path:
    """Fail early (``OutputError``) on a suffix other than ``.html`` or a place that cannot be written."""
    p = Path(path)
    if p.suffix.lower() not in (".html", ".htm"):
        raise OutputError(f"report path {str(path)!r} must end in .html")
    return check_writable(p, (".html", ".htm"), what="the report")


def write_report(model: Any, table: Any, path: str | os.PathLike, prompt: str | None = None,
                 edges: Any = None, attribution: Any = None) -> Path:
    """Write :func:`report_html` to ``path`` (``.html``), atomically, with the umask's mode; returns the path.

    Raises ``OutputError`` for another suffix or a folder that cannot be written (checked before the
    page is computed).
    """
    p = check_report_path(path)
    return write_text(p, report_html(model, table, prompt, edges, attribution))
