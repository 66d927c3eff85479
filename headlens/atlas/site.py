"""The static atlas: an index grid of heads coloured by role, one page per head, the exemplars as Parquet.

Plain HTML and inline SVG, no script and no server: the folder opens from disk (``file://``) and can be
zipped and shared. Layout: ``index.html``, ``heads/L{l}H{h}.html``, ``exemplars.parquet``, ``descriptions.csv``.
Several models (:func:`write_sites`): each model's site in its own folder, and an ``index.html`` that draws
every model's named heads on relative depth (layer / (n_layers - 1)), so what recurs across models shows.
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

from headlens.atlas.exemplars import SAMPLED, deciles
from headlens.atlas.views import (
    CARD_STYLE,
    card_html,
    offset_svg,
    pairs_html,
    role_colour,
    scatter_svg,
    share_colour,
    tokens_html,
    windows_text,
)

RANKING_TITLES = {"attention": "strongest attention off the first token and itself",
                  "write": "largest write (norm of what it adds to the residual stream)",
                  "dla_pos": "largest direct push on the actual next token",
                  "dla_neg": "largest direct push against the actual next token",
                  SAMPLED: "across its range: query rows drawn at random, one per decile of its strongest off-rest "
                           "attention (1 = top tenth)"}
PAGE_STYLE = """body{font-family:system-ui,sans-serif;margin:2em;max-width:70em}table.grid td{width:2.6em;height:1.6em;
text-align:center;border:1px solid #999;font-size:.8em}table.grid a{color:#000;text-decoration:none;display:block}"""
# what an exemplar, a pair table and the meta lines need: the dashboard's head page draws them inside its own page
EXEMPLAR_STYLE = """.ex{font-family:monospace;white-space:pre-wrap;margin:.3em 0;line-height:1.9}.tok{padding:1px 0}
.key{outline:2px solid #e45756}.query{text-decoration:underline;font-weight:bold}.meta{color:#555;font-size:.85em}"""
STYLE = PAGE_STYLE + "\n" + EXEMPLAR_STYLE + "\n" + CARD_STYLE


def write_site(atlas: Any, out: str | Path, scores: Any = None) -> Path:
    """Write ``atlas`` (:class:`headlens.atlas.build.Atlas`) under ``out``; returns the index path. ``scores``: the
    model's scores table (``headlens classify``), whose labels each head's card shows beside the atlas' role."""
    from headlens.models.files import write_text

    root = Path(out)
    (root / "heads").mkdir(parents=True, exist_ok=True)
    frame = atlas.frame()
    frame.to_parquet(root / "exemplars.parquet", index=False)
    _descriptions_frame(atlas).to_csv(root / "descriptions.csv", index=False)
    if getattr(atlas, "substitution", None) is not None:
        atlas.substitution_frame().to_csv(root / "substitution.csv", index=False)
    for d in atlas.descriptions:
        write_text(root / "heads" / f"L{d.layer}H{d.head}.html", _head_page(atlas, d, scores))
    return write_text(root / "index.html", _index(atlas))


def _descriptions_frame(atlas: Any) -> Any:
    return atlas.descriptions_frame()  # the columns live with the Atlas (headlens.atlas.build)


def _page(title: str, body: str) -> str:
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{STYLE}</style></head><body>{body}</body></html>")


def _index(atlas: Any) -> str:
    ex = atlas.exemplars
    by = {(d.layer, d.head): d for d in atlas.descriptions}
    kept = any(getattr(d, "share_kept", None) is not None for d in atlas.descriptions)  # colour by share kept
    head_row = "".join(f"<th>H{h}</th>" for h in range(ex.n_heads))
    rows = []
    for layer in range(ex.n_layers):
        cells = []
        for h in range(ex.n_heads):
            d = by[(layer, h)]
            share = getattr(d, "share_kept", None)
            colour = share_colour(share) if kept else role_colour(d.role)
            tip = html.escape(f"L{layer}H{h}: {d.role} ({d.rule} r = {d.agreement:.2f}"
                              + ("" if share is None else f", share kept {share:.2f}")
                              + {"estimated": ", not put back", "no_effect": ", no effect to keep: not put back"}.get(
                                  d.evidence.get("share_how"), "") + ")",
                              quote=True)
            cells.append(f"<td style='background:{colour}' title='{tip}'><a href='heads/L{layer}H{h}.html'>"
                         f"{html.escape(_mark(d.role))}</a></td>")
        rows.append(f"<tr><th>L{layer}</th>{''.join(cells)}</tr>")
    counts: dict[str, int] = {}
    for d in atlas.descriptions:
        counts[d.role] = counts.get(d.role, 0) + 1
    legend = " ".join(f"<span style='background:{role_colour(r)};padding:2px 6px;border:1px solid #999'>"
                      f"{html.escape(_mark(r))} {html.escape(r)}: {n}</span>" for r, n in sorted(counts.items()))
    n_est = sum(d.evidence.get("share_how") == "estimated" for d in atlas.descriptions)
    n_none = sum(d.evidence.get("share_how") == "no_effect" for d in atlas.descriptions)
    unrun = (f"; {n_est} heads were not put back (the test runs a sample exactly, --subst exact runs every head; "
             "descriptions.csv: share_how)" if n_est else "")
    unrun += (f"; {n_none} heads whose mean ablation moves the loss by no more than its interval have no effect "
              "to keep and were not put back" if n_none else "")
    colours = ("Cells are coloured by the share of each head's effect its description keeps when put back into "
               "the model (red 0, green 1)" + unrun + "; letters give the role." if kept
               else "Cells are coloured by role" + unrun + ".")
    c = atlas.config
    return _page(f"headlens atlas: {atlas.model}", (
        f"<h1>Atlas of {html.escape(atlas.model)}</h1><p class='meta'>{ex.n_tokens} tokens of the "
        f"{html.escape(str(c.corpus))} corpus; top {c.k} exemplars per head and ranking; roles tested on held-out "
        f"windows. Click a head. {colours}</p><p>{legend}</p><table class='grid'><tr><th></th>{head_row}</tr>"
        f"{''.join(rows)}</table>{_put_back(atlas.substitution)}<h2>Every head at a glance</h2><p class='meta'>Each point is a head: how well "
        f"its best rule predicts its attention on held-out text (right: well), against how much of its attention "
        f"goes to keys other than the first token and itself (top: most). Resting heads sit at the bottom; "
        f"heads no rule explains, top left. Click a point to open its page.</p>{scatter_svg(atlas.descriptions)}"
        f"<p class='meta'>Exemplars: exemplars.parquet; descriptions: descriptions.csv</p>"))


def _put_back(sub: Any) -> str:
    """The whole-model line and each layer's, as a paragraph and a table (empty without a substitution test)."""
    if sub is None:
        return ""
    pct = lambda v: f"{100 * (v - sub.clean) / sub.clean:+.1f} %"  # noqa: E731
    rows = "".join(f"<tr><th>L{la}</th><td>{n}</td><td>{pct(v)}</td><td>{pct(sub.per_layer_mean[la])}</td>"
                   f"<td>{html.escape(sub.layer_how.get(la, sub.how))}</td></tr>"
                   for la, (n, v) in sorted(sub.per_layer.items()) if la in sub.per_layer_mean)
    said = sub.sentence()
    return (f"<h2>The descriptions put back together</h2><p>{html.escape(said[:1].upper() + said[1:])}"
            ".</p><p class='meta'>Each layer's described heads substituted at once, beside the same heads "
            "mean-ablated at once (change of the next-token loss; <i>estimated</i>: the sum of the heads' "
            "first-order estimates, which misses how a layer's heads compound; substitution.csv)</p>"
            f"<table class='pairs'><tr><th>layer</th><th>heads</th><th>substituted</th><th>mean-ablated</th>"
            f"<th>how</th></tr>{rows}</table>")


def _mark(role: str) -> str:
    return {"resting": "·", "no clear role": "?"}.get(role, "".join(w[0] for w in role.split("_")).upper())


def _head_page(atlas: Any, d: Any, scores: Any = None) -> str:
    from headlens.scoring.card import head_card

    ex = atlas.exemplars
    flat = d.layer * ex.n_heads + d.head
    card = head_card(d.layer, d.head, scores, d, corpus=str(atlas.config.corpus), windows=windows_text(atlas))
    hint = f"headlens classify --model {atlas.model} -o scores.json, then headlens atlas --scores scores.json"
    sections = "".join(ranking_html(atlas, name, kept[flat]) for name, kept in ex.top.items())
    return _page(f"L{d.layer}H{d.head} of {atlas.model}", (
        f"<p><a href='../index.html'>atlas of {html.escape(atlas.model)}</a></p><h1>L{d.layer}H{d.head}: "
        f"{html.escape(d.role.replace('_', ' '))}</h1>{card_html(card, hint)}"
        f"<p class='description'>{html.escape(d.text)}</p>"
        f"<p class='meta'>Held-out agreement of every candidate rule: {candidates_text(d)}</p>"
        f"<h2>Reads: attention by offset</h2>{offset_svg(ex.profile, d.layer, d.head)}"
        f"<h2>Frequent (query, key) pairs among its exemplars</h2>{pairs_html(atlas, d.layer, d.head)}"
        f"<h2>Exemplars</h2>{sections}"))


def candidates_text(d: Any) -> str:
    """Every candidate rule of description ``d`` with its held-out agreement, best first (escaped HTML)."""
    return ", ".join(f"{html.escape(n)} {v:.2f}" for n, v in sorted(d.candidates.items(), key=lambda kv: -kv[1]))


def _tok(s: str) -> str:
    return html.escape(s.replace("\n", "⏎"))


def ranking_html(atlas: Any, name: str, kept: list[Any]) -> str:
    """A ranking's exemplars of one head (``kept``: ``Exemplars.top[name][flat]``) under its title: each window's
    tokens shaded by the head's attention from the query (underlined), the attended key outlined, then its score,
    where it is in the corpus and the tokens the head promotes and suppresses there. The static page and the
    dashboard's head page both draw exemplars with it (styled by :data:`EXEMPLAR_STYLE`)."""
    lines = []
    shown = deciles(kept) if name == SAMPLED else [(None, e) for e in kept]
    for decile, e in shown:
        spans = []
        for i, (t, a) in enumerate(zip(e.tokens, e.attention, strict=False)):
            cls = "tok" + (" key" if i == e.key else "") + (" query" if i == e.query else "")
            spans.append(f"<span class='{cls}' style='background:rgba(228,87,86,{min(a, 1.0):.3f})' "
                         f"title='attention {a:.3f}'>{_tok(atlas.strings[t])}</span>")
        where = "" if decile is None else f"decile {decile}, "
        writes = (f"; promotes: {tokens_html(e.promoted, atlas.strings)}; suppresses: "
                  f"{tokens_html(e.suppressed, atlas.strings)}") if e.promoted or e.suppressed else ""
        lines.append(f"<div class='ex'>{''.join(spans)}</div><div class='meta'>{where}score {e.score:.3f}; window "
                     f"{e.window if atlas.seen is None else atlas.seen[e.window]}, position {e.position}{writes}</div>")
    return f"<h3>{html.escape(RANKING_TITLES.get(name, name))}</h3>{''.join(lines)}"


def write_sites(atlases: list[Any], out: str | Path, scores: list[Any] | None = None) -> Path:
    """One model: :func:`write_site` into ``out``. Several: each into ``out/<model>/`` and a cross-model index.
    ``scores``: each model's scores table (or None), in the order of ``atlases``."""
    from headlens.models.files import write_text

    if len(atlases) == 1:
        return write_site(atlases[0], out, scores[0] if scores else None)
    root = Path(out)
    folders = []
    for i, atlas in enumerate(atlases):
        folder = f"{i}-" + "".join(c if c.isalnum() or c in "-_." else "_" for c in atlas.model)
        write_site(atlas, root / folder, scores[i] if scores else None)
        folders.append(folder)
    return write_text(root / "index.html", _models_index(atlases, folders))


def _models_index(atlases: list[Any], folders: list[str]) -> str:
    """Each model a row: its named heads as dots on relative depth, coloured by role, linked to its site."""
    w, h = 600, 24
    rows = []
    for atlas, folder in zip(atlases, folders, strict=True):
        L = atlas.exemplars.n_layers
        dots = []
        for d in atlas.descriptions:
            if d.role in ("resting", "no clear role"):
                continue
            x = 10 + (w - 20) * (d.layer / max(L - 1, 1))
            y = 4 + (h - 8) * (d.head + 0.5) / atlas.exemplars.n_heads
            dots.append(f"<circle cx='{x:.1f}' cy='{y:.1f}' r='3' fill='{role_colour(d.role)}'>"
                        f"<title>L{d.layer}H{d.head}: {html.escape(d.role)} (r = {d.agreement:.2f})</title></circle>")
        rows.append(f"<tr><td><a href='{folder}/index.html'>{html.escape(atlas.model)}</a></td><td><svg width='{w}' "
                    f"height='{h}' role='img'><rect width='{w}' height='{h}' fill='#f4f4f4'/>{''.join(dots)}</svg>"
                    f"</td></tr>")
    roles = dict.fromkeys(d.role for a in atlases for d in a.descriptions if d.role not in ("resting", "no clear role"))
    legend = " ".join(f"<span style='color:{role_colour(r)}'>&#9679;</span> {html.escape(r)}" for r in roles)
    return _page("headlens atlas", (
        f"<h1>Atlas of {len(atlases)} models</h1><p class='meta'>Each model's named heads on relative depth "
        f"(first layer left, last right; heads top to bottom). {legend}</p><table><tr><th>model</th><th>"
        f"relative depth</th></tr>{''.join(rows)}</table>"))
