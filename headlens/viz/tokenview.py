"""Attention as coloured text: hover a query token, every key token takes the colour of its weight.

The token view of CircuitsVis, as one self-contained HTML fragment (no external script): the
dashboard shows it with ``st.html(..., unsafe_allow_javascript=True)`` and the HTML report
inlines it. Several heads are shown as one line of text each, on the same tokens, so hovering
a token shows every head's attention row for that query at once.

Why the first query is coloured in the HTML itself: the fragment reads correctly before (or
without) its script, e.g. in a test that only sees the markup, or a mail client. Weights travel as whole
percents: a colour needs no finer steps, and a layer of a language model on a few hundred tokens stays a
page of a megabyte or two.
"""

from __future__ import annotations

import html
import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

COLOR = "31,119,180"  # key tokens: this colour at alpha = attention weight
QUERY_OUTLINE = "#ff2d55"

_SCRIPT = """
<script>
(() => {
  const root = document.getElementById(%(uid)s);
  if (!root) return;
  const w = JSON.parse(root.querySelector("script[type='application/json']").textContent);
  const paint = (q) => {
    root.querySelectorAll(".hl-head").forEach((line) => {
      const row = w[line.dataset.head][q];
      line.querySelectorAll(".hl-tok").forEach((el) => {
        const k = +el.dataset.pos;
        const a = k < row.length ? row[k] / 100 : 0;
        el.style.background = `rgba(%(color)s,${a})`;
        el.style.outline = k === q ? "2px solid %(outline)s" : "none";
      });
    });
    const label = root.querySelector(".hl-query");
    if (label) label.textContent = root.querySelector(`.hl-tok[data-pos='${q}']`).title.split(":")[0];
  };
  root.addEventListener("mouseover", (e) => {
    const el = e.target.closest(".hl-tok");
    if (el) paint(+el.dataset.pos);
  });
})();
</script>
"""


def _shown(token: str) -> str:
    from headlens.viz.patterns import BYTE_ESCAPES

    token = BYTE_ESCAPES.get(token, token)
    return html.escape(token or "∅").replace("\n", "⏎<br>").replace("\t", "⇥")


def token_view_html(
    str_tokens: Sequence[str],
    patterns: Mapping[str, np.ndarray],
    uid: str = "headlens-tokens",
    query: int | None = None,
) -> str:
    """HTML for attention as coloured text; hovering a token shows its attention row in every head.

    Args:
        str_tokens: the token strings, one per position.
        patterns: head name -> ``(query_pos, key_pos)`` pattern on those tokens.
        uid: a DOM id unique on the page (several views may share one page).
        query: the query coloured before any hover (default: the last position).

    Returns:
        A ``<div>`` with one line of tokens per head and a small inline script.

    >>> import numpy as np
    >>> page = token_view_html(["a", "b"], {"L0H0": np.array([[1.0, 0.0], [0.25, 0.75]])})
    >>> page.count('class="hl-tok"'), "rgba(31,119,180,0.25)" in page
    (2, True)
    """
    import numpy as np

    T = len(str_tokens)
    query = T - 1 if query is None else int(query)
    weights = {}
    for name, pattern in patterns.items():
        z = np.nan_to_num(np.asarray(pattern, dtype=float))  # (Q, K)
        if z.shape != (T, T):
            raise ValueError(f"pattern of {name} has shape {z.shape}; expected ({T}, {T}) for {T} tokens")
        weights[name] = np.rint(np.clip(z, 0.0, 1.0) * 100).astype(int).tolist()  # percent: 9 heads x 300 tokens ~1.6 MB
    lines = []
    for name, rows in weights.items():
        spans = []
        for k, token in enumerate(str_tokens):
            a = rows[query][k] / 100
            outline = f"outline: 2px solid {QUERY_OUTLINE};" if k == query else ""
            spans.append(f'<span class="hl-tok" data-pos="{k}" title="#{k} {html.escape(repr(token))}: query" '
                         f'style="background: rgba({COLOR},{a:g}); {outline} white-space: pre; '
                         f'font-family: monospace; cursor: pointer;">{_shown(token)}</span>')
        lines.append(f'<div class="hl-head" data-head="{html.escape(name)}" style="margin: 0.2em 0;">'
                     f'<b style="display: inline-block; min-width: 4.5em;">{html.escape(name)}</b>'
                     f'{"".join(spans)}</div>')
    data = json.dumps(weights).replace("</", "<\\/")
    first = f"#{query} {html.escape(repr(str_tokens[query]))}" if T else ""
    return (f'<div id="{html.escape(uid)}" class="headlens-token-view" style="line-height: 1.9;">'
            f'<div style="color: #666; font-size: 0.85em;">hover a token: every head\'s attention from that '
            f'query (outlined) to each token, darker = more. Query: <span class="hl-query">{first}</span></div>'
            f'{"".join(lines)}<script type="application/json">{data}</script></div>'
            + _SCRIPT % {"uid": json.dumps(uid), "color": COLOR, "outline": QUERY_OUTLINE})


def attention_row_html(str_tokens: Sequence[str], row: Sequence[float], query: int,
                       targets: Sequence[int] = ()) -> str:
    """One query's attention row as coloured text (static): the query outlined, targets underlined.

    >>> attention_row_html(["a", "b"], [0.5, 0.5], query=1, targets=[0]).count("rgba(31,119,180,0.5)")
    2
    """
    spans = []
    for k, token in enumerate(str_tokens):
        a = float(row[k]) if k < len(row) else 0.0
        style = f"background: rgba({COLOR},{round(a, 3):g}); white-space: pre; font-family: monospace;"
        if k == query:
            style += f" outline: 2px solid {QUERY_OUTLINE};"
        if k in targets:
            style += " text-decoration: underline 2px;"
        spans.append(f'<span title="#{k} {html.escape(repr(token))}: {a:.3f}" style="{style}">{_shown(token)}</span>')
    return f'<div class="headlens-attention-row" style="line-height: 1.9;">{"".join(spans)}</div>'
