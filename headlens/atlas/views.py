"""The pieces of a head's page that the static atlas and the dashboard's head view both draw: the head card,
the offset chart, token lists and (query, key) pairs, and the index's scatter of every head.

Plain HTML and inline SVG, no script: the atlas opens from disk (``file://``), and the dashboard shows the same
strings (``st.html``; an SVG as an image). Every model or corpus string is escaped (``html.escape``) before it
enters the page.
"""

from __future__ import annotations

import html
import math
from collections import Counter
from typing import Any

from headlens.atlas.reads import MAX_OFFSET

CARD_STYLE = """.card{border:1px solid #bbb;border-radius:4px;padding:.4em .8em;margin:.6em 0;background:#fafafa}
.card p{margin:.3em 0}.disagree{color:#9a3412;font-weight:bold}.frag{color:#777;font-style:italic}
.meta{color:#555;font-size:.85em}"""
# roles the fixed palette knows; any other role (a new rule's name) gets a colour of PALETTE by its name
ROLE_COLOURS = {"resting": "#d9d9d9", "no clear role": "#ffffff", "previous_token": "#4c78a8", "induction": "#e45756",
                "duplicate_token": "#f58518", "offset_2": "#72b7b2", "offset_3": "#54a24b", "predicted_token": "#eeca3b",
                "copy_suppression": "#9d755d"}
PALETTE = ("#b279a2", "#ff9da6", "#9c755f", "#bab0ac", "#17becf", "#bcbd22", "#8c564b", "#e377c2", "#7f7f7f",
           "#aec7e8", "#98df8a", "#c5b0d5")


def role_colour(role: str) -> str:
    """The colour of ``role``: the fixed one where there is one, else one of :data:`PALETTE` chosen by its name
    (stable across runs and models: a sum of its characters, not Python's salted ``hash``)."""
    return ROLE_COLOURS.get(role) or PALETTE[sum(map(ord, role)) % len(PALETTE)]


def share_colour(share: float | None) -> str:
    """A cell colour for the share of a head's effect its description keeps: red 0 .. green 1, grey unknown."""
    if share is None or share != share:
        return "#eeeeee"
    s = min(max(share, 0.0), 1.0)
    return f"rgb({int(230 - 150 * s)},{int(90 + 120 * s)},{int(90 + 30 * s)})"


def _num(x: float | None, fmt: str = ".2f") -> str:
    return "n/a" if x is None or x != x else format(x, fmt)


def _ci(ci: tuple[float, float] | None) -> str:
    return "" if ci is None or ci[0] != ci[0] else f" [{ci[0]:.2f}, {ci[1]:.2f}]"


def card_html(card: Any, scores_hint: str = "") -> str:
    """A :class:`headlens.scoring.card.HeadCard` as HTML: the probes' labels, the atlas' role and numbers, the
    measured effects, the disagreement sentence where there is one, and which windows the numbers come from."""
    e = html.escape
    if card.labels:
        probes = ", ".join(f"{e(v.detector)} {v.score:.2f}{_ci(v.ci)}" + (f" on {e(v.probe)}" if v.probe else "")
                           for v in card.labels)
    elif card.probes:
        probes = "no detector labels it"
    else:
        probes = "no probe scores" + (f" ({e(scores_hint)})" if scores_hint else "")
    parts = [f"<p><b>Probes:</b> {probes}.</p>"]
    if card.role is not None:
        atlas = (f"<b>On {e(card.corpus)}:</b> {e(card.role.replace('_', ' '))}; its rule '{e(str(card.rule))}' "
                 f"agrees with the real attention at r = {_num(card.agreement)}{_ci(card.agreement_ci)} on held-out "
                 f"text")
        if card.coverage is not None:
            atlas += f", scored on the {100 * card.coverage:.0f} % of query rows where the rule has a target"
        if len(card.mixture) > 1:
            atlas += "; a mixture: " + " + ".join(f"{w:.2f} {e(r)}" for r, w in card.mixture.items())
        if card.share_how == "estimated":
            atlas += ("; the substitution test put a sample of heads back into the model, not this one (`--subst "
                      "exact` runs every head), so its share kept is not measured"
                      + ("" if card.share_estimate is None else
                         f" (a first-order estimate from the loss's gradient, a rough hint only: about "
                         f"{_num(card.share_estimate)})"))
        elif card.share_how == "no_effect":
            atlas += ("; its mean ablation does not move the loss beyond its interval on the substitution test's "
                      "windows, so there is no effect for its description to keep, and it was not put back")
        elif card.share_kept is not None:
            atlas += (f"; put back into the model in place of its real pattern, the description keeps "
                      f"{_num(card.share_kept)}{_ci(card.share_ci)} of the head's effect on the loss")
        parts.append(f"<p>{atlas}.</p>")
    effects = []
    if card.ablation is not None:
        effects.append(f"ablating it changes the loss by {card.ablation:+.4f}" +
                       ("" if card.ablation_ci is None else f" [{card.ablation_ci[0]:+.4f}, {card.ablation_ci[1]:+.4f}]")
                       + (" (a first-order estimate)" if card.ablation_estimated else ""))
    if card.dla is not None:
        effects.append(f"its direct logit attribution is {card.dla:+.3f}")
    if effects:
        parts.append(f"<p><b>Measured:</b> {'; '.join(effects)}.</p>")
    why = card.share_reading()
    if why:
        parts.append(f"<p>{e(why)}</p>")
    said = card.disagreement()
    if said:
        parts.append(f"<p class='disagree'>{e(said)}</p>")
    if card.windows:
        parts.append(f"<p class='meta'>{e(card.windows)}</p>")
    return f"<div class='card'>{''.join(parts)}</div>"


def windows_text(atlas: Any) -> str:
    """Which text an atlas' numbers come from: two views of one head with other windows say so."""
    from headlens.atlas.corpus import heldout_rows

    c = atlas.config
    n_held = len(heldout_rows(c.n_windows))
    n_seen = len(atlas.seen) if atlas.seen is not None else c.n_windows - n_held
    return (f"Atlas numbers from the {c.corpus} corpus, seed {c.seed}: {n_seen} windows of {c.seq_len} tokens "
            f"read for exemplars ({atlas.exemplars.n_tokens} tokens), {n_held} held-out windows for the agreement. "
            f"Other settings give other windows, and so other numbers; `headlens atlas --corpus {c.corpus} "
            f"--n-windows {c.n_windows} --seq-len {c.seq_len} --k {c.k} --seed {c.seed}` reads these.")


def token_html(s: str) -> str:
    """One token read as text: a whole word as itself, a piece of a word (no leading space, starting with a
    letter) marked as a fragment, a newline as ⏎."""
    shown = html.escape(s.replace("\n", "⏎"))
    if s[:1].isalpha() and len(s) > 0:
        return f"<span class='frag' title='a piece of a word'>-{shown}</span>"
    return shown.strip() or shown


def tokens_html(ids: list[int], strings: list[str]) -> str:
    """Tokens as :func:`token_html`, whole words first."""
    ranked = sorted(ids, key=lambda t: strings[t][:1].isalpha())
    return " ".join(token_html(strings[t]) for t in ranked) or "-"


def token_class(s: str) -> str:
    """A token's class for grouping pairs: newline, digits, punctuation, capitalised word, word, fragment."""
    t = s.strip()
    if "\n" in s:
        return "newline"
    if not t:
        return "space"
    if t.isdigit():
        return "digits"
    if not any(c.isalnum() for c in t):
        return "punctuation"
    if not s[:1].isspace() and s[:1].isalpha():
        return "fragment"
    return "capitalised word" if t[:1].isupper() else "word"


def pairs_html(atlas: Any, layer: int, head: int, n: int = 6) -> str:
    """The head's most frequent (query token, key token) pairs among its attention exemplars; where no pair
    recurs, the pairs grouped by token class (and whether the key is the query's own token)."""
    kept = atlas.exemplars.top["attention"][layer * atlas.exemplars.n_heads + head]
    strings = atlas.strings
    pairs = [(e.tokens[e.query], e.tokens[e.key]) for e in kept if 0 <= e.key < len(e.tokens)]
    exact = Counter((strings[q], strings[k]) for q, k in pairs).most_common(n)
    if exact and exact[0][1] > 1:
        rows = "".join(f"<tr><td>{_tok(q)}</td><td>{_tok(k)}</td><td>{c}</td></tr>" for (q, k), c in exact)
        return f"<table class='pairs'><tr><th>query</th><th>key</th><th>n</th></tr>{rows}</table>"
    groups: dict[tuple[str, str], list[tuple[int, int]]] = {}
    for q, k in pairs:
        kc = "the same token" if q == k else token_class(strings[k])
        groups.setdefault((token_class(strings[q]), kc), []).append((q, k))
    rows = "".join(f"<tr><td>{html.escape(qc)}</td><td>{html.escape(kc)}</td><td>{len(got)}</td><td>"
                   + ", ".join(f"{_tok(strings[q])} → {_tok(strings[k])}" for q, k in got[:3]) + "</td></tr>"
                   for (qc, kc), got in sorted(groups.items(), key=lambda kv: -len(kv[1]))[:n])
    return (f"<p class='meta'>No (query, key) pair recurs among its {len(pairs)} exemplars; grouped by token "
            f"class:</p><table class='pairs'><tr><th>query</th><th>key</th><th>n</th><th>examples</th></tr>"
            f"{rows}</table>")


def _tok(s: str) -> str:
    return html.escape(s.replace("\n", "⏎"))


BAR, OFFSET_WIDTH = 6, 58 + 6 * (MAX_OFFSET + 1) + 190  # a bar's width; the chart's: axis, bars, the numbers


def offset_svg(profile: Any, layer: int, head: int) -> str:
    """The head's mean attention per query row by offset ``q - k`` (1 .. MAX_OFFSET, then farther) as bars on
    axes, log-scaled where the largest bar dwarfs the rest; the first token and the query itself as numbers."""
    share = profile.share(layer, head).tolist()  # offsets 0 .. MAX_OFFSET, farther
    first = float(profile.first[layer, head]) / max(profile.rows, 1)
    bars = share[1:]  # offsets 1 .. MAX_OFFSET, farther
    nonzero = sorted(v for v in bars if v > 0)
    log = len(nonzero) > 2 and nonzero[-1] > 20 * nonzero[len(nonzero) // 2]
    top = max(max(bars, default=0.0), 1e-9)
    # the decade below the smallest bar shown (at most 4 decades under the largest): every bar has a height
    lo = 10.0 ** math.floor(math.log10(0.999 * max(min(nonzero, default=1e-4), top * 1e-4))) if log else 0.0
    w, h, left, bottom = BAR, 120, 58, 26
    width = OFFSET_WIDTH

    def y(v: float) -> float:  # the bar's top, in pixels from the top
        if log:
            f = 0.0 if v <= lo else (math.log10(v) - math.log10(lo)) / max(math.log10(top) - math.log10(lo), 1e-9)
        else:
            f = v / top
        return 8 + (h - 8) * (1 - f)

    out = [f"<line x1='{left}' y1='{h}' x2='{left + len(bars) * w}' y2='{h}' stroke='#333'/>",
           f"<line x1='{left}' y1='8' x2='{left}' y2='{h}' stroke='#333'/>"]
    ticks = [10 ** p for p in range(math.floor(math.log10(lo)), 1) if lo <= 10 ** p <= top * 1.0001] if log \
        else [top * f for f in (0, 0.5, 1)]
    for t in ticks:
        out.append(f"<line x1='{left - 4}' y1='{y(t):.1f}' x2='{left}' y2='{y(t):.1f}' stroke='#333'/><text "
                   f"x='{left - 6}' y='{y(t) + 3:.1f}' font-size='9' text-anchor='end'>{t:.2g}</text>")
    for i, v in enumerate(bars):
        x = left + i * w
        name = f"offset {i + 1}" if i < MAX_OFFSET else f"farther than {MAX_OFFSET}"
        out.append(f"<rect x='{x}' y='{y(v):.1f}' width='{w - 1}' height='{h - y(v):.1f}' "
                   f"fill='{'#9d9d9d' if i == MAX_OFFSET else '#4c78a8'}'><title>{name}: {v:.4f}</title></rect>")
    for d in (1, 8, 16, 32, 48):
        out.append(f"<text x='{left + (d - 1) * w + w / 2:.1f}' y='{h + 11}' font-size='9' text-anchor='middle'>{d}</text>")
    out.append(f"<text x='{left + MAX_OFFSET * w + w / 2:.1f}' y='{h + 11}' font-size='9' text-anchor='middle'>far</text>")
    out.append(f"<text x='{left + len(bars) * w / 2:.1f}' y='{h + 23}' font-size='10' text-anchor='middle'>"
               f"offset q - k (tokens back)</text>")
    out.append(f"<text x='10' y='{h / 2 + 8:.0f}' font-size='10' transform='rotate(-90 10 {h / 2 + 8:.0f})' "
               f"text-anchor='middle'>attention per row{' (log)' if log else ''}</text>")
    tx = left + len(bars) * w + 14
    out.append(f"<text x='{tx}' y='30' font-size='11'>first token: {first:.3f}</text>"
               f"<text x='{tx}' y='48' font-size='11'>itself (offset 0): {share[0]:.3f}</text>"
               f"<text x='{tx}' y='66' font-size='11'>all other keys: {sum(bars):.3f}</text>")
    return (f"<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{h + bottom + 4}' role='img' "
            f"class='offsets'>{''.join(out)}</svg>")


def scatter_svg(descriptions: list[Any], href: str = "heads/L{layer}H{head}.html") -> str:
    """Every head as a point: its best rule's held-out agreement (x) against the share of its attention off the
    first token and itself (y), coloured by role; each point a link to its page (works from ``file://``)."""
    w, h, pad = 520, 360, 40
    out = [f"<rect x='{pad}' y='10' width='{w - pad - 10}' height='{h - pad - 10}' fill='#fbfbfb' stroke='#333'/>"]
    for t in (0.0, 0.5, 1.0):
        x, y = pad + t * (w - pad - 10), 10 + (1 - t) * (h - pad - 10)
        out.append(f"<text x='{x:.0f}' y='{h - pad + 14}' font-size='10' text-anchor='middle'>{t:.1f}</text>"
                   f"<text x='{pad - 4}' y='{y + 3:.0f}' font-size='10' text-anchor='end'>{t:.1f}</text>")
    out.append(f"<text x='{(w + pad) / 2:.0f}' y='{h - 6}' font-size='11' text-anchor='middle'>held-out agreement of "
               f"its best rule (r)</text><text x='12' y='{h / 2:.0f}' font-size='11' text-anchor='middle' "
               f"transform='rotate(-90 12 {h / 2:.0f})'>attention off the first token and itself</text>")
    for d in descriptions:
        ev = getattr(d, "evidence", {}) or {}
        r, off = max(min(float(d.agreement), 1.0), 0.0), max(min(float(ev.get("off_rest", 0.0)), 1.0), 0.0)
        x, y = pad + r * (w - pad - 10), 10 + (1 - off) * (h - pad - 10)
        tip = html.escape(f"L{d.layer}H{d.head}: {d.role} (r = {d.agreement:.2f}, off-rest {off:.2f})")
        out.append(f"<a href='{href.format(layer=d.layer, head=d.head)}' class='pt'><circle cx='{x:.1f}' "
                   f"cy='{y:.1f}' r='5' fill='{role_colour(d.role)}' stroke='#333' stroke-width='.6'>"
                   f"<title>{tip}</title></circle></a>")
    return (f"<svg xmlns='http://www.w3.org/2000/svg' width='{w}' height='{h}' role='img' class='scatter'>"
            f"{''.join(out)}</svg>")
