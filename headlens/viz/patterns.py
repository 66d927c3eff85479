"""Attention patterns as heatmaps with every token labelled: one head, or several side by side.

Pure plotly builders (re-exported by :mod:`headlens.viz`). Why windows: a tick label needs about
11 px, so a heatmap labels every token of a window sized to fit, and the dashboard moves the
window over longer texts (``token_window``); several panels wrap onto rows (``panels_per_row``).
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np
    import plotly.graph_objects as go

BYTE_ESCAPES = {"\\x0a": "\n", "\\x09": "\t", "\\x0d": "\r"}  # byte tokenizers spell these as escapes
PATTERN_WINDOW = 64  # tokens one pattern shows with every token labelled; longer texts get a window


def display_token(token: str) -> str:
    """A token made readable and safe as a plotly label (whitespace shown, HTML escaped).

    A word's spaces are light dots (`` Paris`` is ``·Paris``); a token that is only a space is ``␣``.

    >>> display_token("<bos>"), display_token(" "), display_token("\\n"), display_token(" Paris")
    ('&lt;bos&gt;', '␣', '⏎', '·Paris')
    """
    token = BYTE_ESCAPES.get(token, token)
    space = "␣" if not token.strip(" ") else "·"
    shown = token.replace(" ", space).replace("\n", "⏎").replace("\t", "⇥").replace("\r", "␍")
    return html.escape(shown or "∅", quote=False)


def token_window(n_tokens: int, start: int = 0, width: int = PATTERN_WINDOW) -> range:
    """The positions a pattern figure shows: all of them when they fit, else ``width`` from ``start``.

    >>> token_window(10), token_window(100, start=90, width=64)
    (range(0, 10), range(36, 100))
    """
    width = max(1, int(width))
    if n_tokens <= width:
        return range(n_tokens)
    start = min(max(0, int(start)), n_tokens - width)
    return range(start, start + width)


def _pattern_axes(str_tokens: Sequence[str], window: range) -> tuple[list[str], list[str]]:
    """Categories (``"#3 a"``: one per position, so repeated tokens stay apart) and their tick labels."""
    labels = [display_token(str_tokens[i]) for i in window]
    return [f"#{i} {label}" for i, label in zip(window, labels, strict=True)], labels


def _heatmap(z: np.ndarray, cats: list[str], causal: bool, window: range, **kwargs: Any) -> go.Heatmap:
    import numpy as np
    import plotly.graph_objects as go

    z = np.asarray(z, dtype=float)[window.start:window.stop, window.start:window.stop]  # (Q, K) in the window
    if causal:
        z = np.where(np.triu(np.ones(z.shape, dtype=bool), k=1), np.nan, z)
    # hover names query and key through the categories, without a (Q, K) customdata array
    return go.Heatmap(z=z.astype(np.float32), x=cats, y=cats, colorscale="Blues", zmin=0.0, zmax=1.0,
                      hovertemplate="query %{y}<br>key %{x}<br>weight %{z:.3f}<extra></extra>",
                      hoverongaps=False, **kwargs)


def _label_every_token(fig: go.Figure, cats: list[str], labels: list[str], **axis: Any) -> None:
    """Tick labels at every position on both axes (the window is sized so that they fit)."""
    font = dict(size=10 if len(cats) > 24 else 12)
    fig.update_xaxes(type="category", tickmode="array", tickvals=cats, ticktext=labels, tickfont=font,
                     tickangle=-90 if len(cats) > 16 else 0, **axis)
    fig.update_yaxes(type="category", tickmode="array", tickvals=cats, ticktext=labels, tickfont=font,
                     autorange="reversed", **axis)


def pattern_figure(
    pattern: np.ndarray,
    str_tokens: Sequence[str],
    title: str = "",
    causal: bool = True,
    window: range | None = None,
) -> go.Figure:
    """One head's attention pattern as a heatmap, every token labelled on both axes.

    Args:
        pattern: ``(query_pos, key_pos)`` attention weights, rows summing to 1.
        str_tokens: the token strings, one per position.
        title: figure title, e.g. ``"L1H2"``.
        causal: blank out the cells above the diagonal (keys a causal query cannot see).
        window: the positions shown on both axes (default: all; see :func:`token_window` for
            texts longer than fit with every token labelled).

    Returns:
        A heatmap whose hover names the query token, the key token and the weight.
    """
    import numpy as np
    import plotly.graph_objects as go

    n_k = np.asarray(pattern).shape[-1]
    if len(str_tokens) != n_k:
        raise ValueError(f"{len(str_tokens)} token labels for a pattern with {n_k} key positions")
    window = range(n_k) if window is None else window
    cats, labels = _pattern_axes(str_tokens, window)
    fig = go.Figure(_heatmap(pattern, cats, causal, window, colorbar=dict(title=dict(text="weight"), thickness=12)))
    fig.update_layout(title=dict(text=title), height=max(300, 13 * len(cats) + 170),
                      margin=dict(l=60, r=20, t=50, b=60))
    _label_every_token(fig, cats, labels)
    fig.update_xaxes(title="key token")
    fig.update_yaxes(title="query token")
    return fig


def panels_per_row(n_panels: int, n_tokens: int, width_px: int = 1200, px_per_token: int = 11) -> int:
    """How many pattern panels fit side by side with every one of ``n_tokens`` tick labels legible.

    >>> panels_per_row(4, 28), panels_per_row(4, 64), panels_per_row(2, 10)
    (3, 1, 2)
    """
    fit = width_px // (n_tokens * px_per_token + 60)
    return max(1, min(n_panels, fit))


def patterns_figure(
    patterns: Sequence[np.ndarray],
    names: Sequence[str],
    str_tokens: Sequence[str],
    causal: bool = True,
    window: range | None = None,
    title: str = "",
    per_row: int | None = None,
) -> go.Figure:
    """Several heads' patterns side by side on the same tokens (one panel each, shared colour scale).

    Args:
        patterns: ``(query_pos, key_pos)`` arrays, one per panel.
        names: panel titles, e.g. ``["L0H0", "L0H1"]``.
        str_tokens: the token strings, one per position.
        causal: blank out keys after the query.
        window: positions shown (every token in it labelled).
        title: figure title.
        per_row: panels per row (default: as many as fit with legible labels, :func:`panels_per_row`).
    """
    from plotly.subplots import make_subplots

    n = max(1, len(patterns))
    window = range(len(str_tokens)) if window is None else window
    cats, labels = _pattern_axes(str_tokens, window)
    cols = per_row or panels_per_row(n, len(cats))
    rows = math.ceil(n / cols)
    panel_h = max(220, 12 * len(cats) + 90)
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=list(names), horizontal_spacing=0.05 if cols > 1 else 0.1,
                        vertical_spacing=min(0.3, 110 / (rows * panel_h + 100)) if rows > 1 else 0.1)
    for i, pattern in enumerate(patterns):
        if pattern.shape[-1] != len(str_tokens):
            raise ValueError(f"{len(str_tokens)} token labels for a pattern with {pattern.shape[-1]} key positions")
        fig.add_trace(_heatmap(pattern, cats, causal, window, showscale=i == 0, name=str(names[i]),
                               colorbar=dict(title=dict(text="weight"), thickness=10)),
                      row=i // cols + 1, col=i % cols + 1)
    fig.update_layout(title=dict(text=title), height=rows * panel_h + 100, margin=dict(l=60, r=20, t=70, b=60))
    _label_every_token(fig, cats, labels)
    return fig
