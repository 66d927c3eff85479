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

from headlens.atlas.reads import MAX_OFFSET, token_pairs

ROLE_COLOURS = {"resting": "#d9d9d9", "no clear role": "#ffffff", "previous_token": "#4c78a8", "induction": "#e45756",
                "duplicate_token": "#f58518", "offset_2": "#72b7b2", "offset_3": "#54a24b", "predicted_token": "#eeca3b",
                "copy_suppression": "#9d755d"}
RANKING_TITLES = {"attention": "strongest attention off the first token and itself",
                  "write": "largest write (norm of what it adds to the residual stream)",
                  "dla_pos": "largest direct push on the actual next token",
                  "dla_neg": "largest direct push against the actual next token"}
PAGE_STYLE = """body{font-family:system-ui,sans-serif;margin:2em;max-width:70em}table.grid td{width:2.6em;height:1.6em;
text-align:center;border:1px solid #999;font-size:.8em}table.grid a{color:#000;text-decoration:none;display:block}"""
# what an exemplar, a pair table and the meta lines need: the dashboard's head page draws them inside its own page
EXEMPLAR_STYLE = """.ex{font-family:monospace;white-space:pre-wrap;margin:.3em 0;line-height:1.9}.tok{padding:1px 0}
.key{outline:2px solid #e45756}.query{text-decoration:underline;font-weight:bold}.meta{color:#555;font-size:.85em}"""
STYLE = PAGE_STYLE + "\n" + EXEMPLAR_STYLE


def write_site(atlas: Any, out: str | Path) -> Path:
    """Write ``atlas`` (:class:`headlens.atlas.build.Atlas`) under ``out``; returns the index path."""
    from headlens.models.files import write_text

    root = Path(out)
    (root / "heads").mkdir(parents=True, exist_ok=True)
    frame = atlas.frame()
    frame.to_parquet(root / "exemplars.parquet", index=False)
    _descriptions_frame(atlas).to_csv(root / "descriptions.csv", index=False)
    if getattr(atlas, "substitution", None) is not None:
        atlas.substitution_frame().to_csv(root / "substitution.csv", index=False)
    for d in atlas.descriptions:
        write_text(root / "heads" / f"L{d.layer}H{d.head}.html", _head_page(atlas, d))
    return write_text(root / "index.html", _index(atlas))


def _descriptions_frame(atlas: Any) -> Any:
    return atlas.descriptions_frame()  # the columns live with the Atlas (headlens.atlas.build)


def _page(title: str, body: str) -> str:
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{STYLE}</style></head><body>{body}</body></html>")


def _index(atlas: Any) -> str:
    ex = atlas.exemplars
    by = {(d.layer, d.head): d for d in atlas.descriptions}
    head_row = "".join(f"<th>H{h}</th>" for h in range(ex.n_heads))
    rows = []
    for layer in range(ex.n_layers):
        cells = []
        for h in range(ex.n_heads):
            d = by[(layer, h)]
            colour = ROLE_COLOURS.get(d.role, "#b279a2")
            tip = html.escape(f"L{layer}H{h}: {d.role} ({d.rule} r = {d.agreement:.2f})", quote=True)
            cells.append(f"<td style='background:{colour}' title='{tip}'><a href='heads/L{layer}H{h}.html'>"
                         f"{_mark(d.role)}</a></td>")
        rows.append(f"<tr><th>L{layer}</th>{''.join(cells)}</tr>")
    counts: dict[str, int] = {}
    for d in atlas.descriptions:
        counts[d.role] = counts.get(d.role, 0) + 1
    legend = " ".join(f"<span style='background:{ROLE_COLOURS.get(r, '#b279a2')};padding:2px 6px;border:1px solid #999'>"
                      f"{html.escape(r)}: {n}</span>" for r, n in sorted(counts.items()))
    c = atlas.config
    return _page(f"headlens atlas: {atlas.model}", (
        f"<h1>Atlas of {html.escape(atlas.model)}</h1><p class='meta'>{ex.n_tokens} tokens of the "
        f"{html.escape(str(c.corpus))} corpus; top {c.k} exemplars per head and ranking; roles tested on held-out "
        f"windows. Click a head.</p><p>{legend}</p><table class='grid'><tr><th></th>{head_row}</tr>"
        f"{''.join(rows)}</table><p class='meta'>Exemplars: exemplars.parquet; descriptions: descriptions.csv</p>"))


def _mark(role: str) -> str:
    return {"resting": "·", "no clear role": "?"}.get(role, "".join(w[0] for w in role.split("_")).upper())


def _head_page(atlas: Any, d: Any) -> str:
    ex = atlas.exemplars
    flat = d.layer * ex.n_heads + d.head
    sections = "".join(ranking_html(atlas, name, kept[flat]) for name, kept in ex.top.items())
    return _page(f"L{d.layer}H{d.head} of {atlas.model}", (
        f"<p><a href='../index.html'>atlas of {html.escape(atlas.model)}</a></p><h1>L{d.layer}H{d.head}: "
        f"{html.escape(d.role)}</h1><p class='description'>{html.escape(d.text)}</p>"
        f"<p class='meta'>Held-out agreement of every candidate rule: {candidates_text(d)}</p>"
        f"<h2>Reads: attention by offset</h2>{profile_svg(ex.profile, d.layer, d.head)}"
        f"<h2>Frequent (query, key) pairs among its exemplars</h2>{pairs_html(atlas, d.layer, d.head)}"
        f"<h2>Exemplars</h2>{sections}"))


def candidates_text(d: Any) -> str:
    """Every candidate rule of description ``d`` with its held-out agreement, best first (escaped HTML)."""
    return ", ".join(f"{html.escape(n)} {v:.2f}" for n, v in sorted(d.candidates.items(), key=lambda kv: -kv[1]))


def pairs_html(atlas: Any, layer: int, head: int) -> str:
    """A table of the head's most frequent (query token, key token) pairs among its attention exemplars."""
    kept = atlas.exemplars.top["attention"][layer * atlas.exemplars.n_heads + head]
    rows = "".join(f"<tr><td>{_tok(q)}</td><td>{_tok(k)}</td><td>{n}</td></tr>"
                   for q, k, n in token_pairs(kept, atlas.strings))
    return f"<table class='pairs'><tr><th>query</th><th>key</th><th>n</th></tr>{rows}</table>"


def _tok(s: str) -> str:
    return html.escape(s.replace("\n", "⏎"))


def ranking_html(atlas: Any, name: str, kept: list[Any]) -> str:
    """A ranking's exemplars of one head (``kept``: ``Exemplars.top[name][flat]``) under its title: each window's
    tokens shaded by the head's attention from the query (underlined), the attended key outlined, then its score,
    where it is in the corpus and the tokens the head promotes and suppresses there. The static page and the
    dashboard's head page both draw exemplars with it (styled by :data:`EXEMPLAR_STYLE`)."""
    lines = []
    for e in kept:
        spans = []
        for i, (t, a) in enumerate(zip(e.tokens, e.attention, strict=False)):
            cls = "tok" + (" key" if i == e.key else "") + (" query" if i == e.query else "")
            spans.append(f"<span class='{cls}' style='background:rgba(228,87,86,{min(a, 1.0):.3f})' "
                         f"title='attention {a:.3f}'>{_tok(atlas.strings[t])}</span>")
        ups = " ".join(_tok(atlas.strings[t]) for t in e.promoted)
        downs = " ".join(_tok(atlas.strings[t]) for t in e.suppressed)
        lines.append(f"<div class='ex'>{''.join(spans)}</div><div class='meta'>score {e.score:.3f}; window "
                     f"{e.window if atlas.seen is None else atlas.seen[e.window]}, position {e.position}; promotes: {ups}; suppresses: {downs}</div>")
    return f"<h3>{html.escape(RANKING_TITLES.get(name, name))}</h3>{''.join(lines)}"


def profile_svg(profile: Any, layer: int, head: int) -> str:
    """Bars of mean attention per query row at offsets 0 .. MAX_OFFSET, then 'farther', then the first token."""
    share = [*profile.share(layer, head).tolist(), float(profile.first[layer, head]) / max(profile.rows, 1)]
    w, h = 8, 100
    bars = "".join(f"<rect x='{i * w}' y='{h - v * h:.1f}' width='{w - 1}' height='{v * h:.1f}' fill='#4c78a8'>"
                   f"<title>{_offset_name(i)}: {v:.3f}</title></rect>" for i, v in enumerate(share))
    return (f"<svg width='{len(share) * w}' height='{h + 14}' role='img'>{bars}<text x='0' y='{h + 12}' "
            f"font-size='10'>offset 0 ... {MAX_OFFSET}, farther, first token</text></svg>")


def _offset_name(i: int) -> str:
    return f"offset {i}" if i <= MAX_OFFSET else "farther" if i == MAX_OFFSET + 1 else "first token"


def write_sites(atlases: list[Any], out: str | Path) -> Path:
    """One model: :func:`write_site` into ``out``. Several: each into ``out/<model>/`` and a cross-model index."""
    from headlens.models.files import write_text

    if len(atlases) == 1:
        return write_site(atlases[0], out)
    root = Path(out)
    folders = []
    for i, atlas in enumerate(atlases):
        folder = f"{i}-" + "".join(c if c.isalnum() or c in "-_." else "_" for c in atlas.model)
        write_site(atlas, root / folder)
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
            dots.append(f"<circle cx='{x:.1f}' cy='{y:.1f}' r='3' fill='{ROLE_COLOURS.get(d.role, '#b279a2')}'>"
                        f"<title>L{d.layer}H{d.head}: {html.escape(d.role)} (r = {d.agreement:.2f})</title></circle>")
        rows.append(f"<tr><td><a href='{folder}/index.html'>{html.escape(atlas.model)}</a></td><td><svg width='{w}' "
                    f"height='{h}' role='img'><rect width='{w}' height='{h}' fill='#f4f4f4'/>{''.join(dots)}</svg>"
                    f"</td></tr>")
    legend = " ".join(f"<span style='color:{c}'>&#9679;</span> {html.escape(r)}" for r, c in ROLE_COLOURS.items()
                      if r not in ("resting", "no clear role"))
    return _page("headlens atlas", (
        f"<h1>Atlas of {len(atlases)} models</h1><p class='meta'>Each model's named heads on relative depth "
        f"(first layer left, last right; heads top to bottom). {legend}</p><table><tr><th>model</th><th>"
        f"relative depth</th></tr>{''.join(rows)}</table>"))
