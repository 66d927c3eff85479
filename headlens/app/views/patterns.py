"""Patterns: the selected heads' attention on the user's text, or every head of one layer side by side.

Every token is labelled on both axes: a text longer than fits gets a token window (a slider).
Under the heatmaps the same heads as coloured text: hover a query token to see its row.
"""

from __future__ import annotations

from typing import Any

import streamlit as st

from headlens import viz
from headlens.app import cache
from headlens.app import helpers as hd
from headlens.app.ui import HALF_WINDOW, attempt, current_placement, html_download, window_slider
from headlens.viz.tokenview import token_view_html

MAX_PATTERNS = 6  # patterns drawn at once; more selected heads are listed, not drawn
SELECTED = "selected heads"
WIDE_WINDOW = viz.PATTERN_WINDOW  # tokens a full-width heatmap labels legibly (half width: ui.HALF_WINDOW)


def patterns_view(ref: str, model: Any, text: str, selected: list[tuple[int, int]]) -> None:
    layers = [f"all heads of layer {layer}" for layer in range(model.n_layers)]
    mode = st.selectbox("Show", [SELECTED, *layers], key="patterns_mode",
                        help="the heads selected in the grid, or every head of one layer side by side on the "
                             "same tokens")
    if mode != SELECTED:
        layer_side_by_side(ref, model, text, layers.index(mode))
        return
    if not selected:
        st.info("Select heads in the grid or in the list above to see their attention patterns.")
        return
    shown = selected[:MAX_PATTERNS]
    if len(selected) > len(shown):
        st.caption(f"Showing the first {MAX_PATTERNS} of {len(selected)} selected heads.")
    result = attempt("Could not compute the attention patterns", cache.get_patterns, ref, text, shown,
                     placement=current_placement())
    if result is None:
        return
    tokens, patterns = result
    n_cols = min(2, len(shown))
    window = token_window(len(tokens), WIDE_WINDOW if n_cols == 1 else HALF_WINDOW)
    cols = st.columns(n_cols)
    for i, (layer, head) in enumerate(shown):
        name = hd.format_head(layer, head)
        with cols[i % len(cols)]:
            fig = viz.pattern_figure(patterns[(layer, head)], tokens, title=f"{name} attention on your text",
                                     causal=model.is_causal, window=window)
            st.plotly_chart(fig, key=f"pattern::{name}", config={"displayModeBar": False})
            html_download(fig, f"{model.name}-pattern-{name}")
    token_view(tokens, {hd.format_head(*h): patterns[h] for h in shown})


def layer_side_by_side(ref: str, model: Any, text: str, layer: int) -> None:
    heads = [(layer, h) for h in range(model.n_heads)]
    result = attempt("Could not compute the attention patterns", cache.get_patterns, ref, text, heads,
                     placement=current_placement())
    if result is None:
        return
    tokens, patterns = result
    window = token_window(len(tokens), WIDE_WINDOW if len(heads) == 1 else HALF_WINDOW)
    per_figure = model.n_heads if model.n_heads <= 12 else 8  # heads per figure; panels wrap onto rows inside it
    for start in range(0, len(heads), per_figure):
        row = heads[start:start + per_figure]
        fig = viz.patterns_figure([patterns[h] for h in row], [hd.format_head(*h) for h in row], tokens,
                                  causal=model.is_causal, window=window,
                                  title=f"layer {layer}, heads {row[0][1]}-{row[-1][1]} on the same tokens")
        st.plotly_chart(fig, key=f"layer_patterns::{layer}::{start}", config={"displayModeBar": False})
        html_download(fig, f"{model.name}-layer{layer}-heads{start}")
    token_view(tokens, {hd.format_head(*h): patterns[h] for h in heads})


def token_window(n_tokens: int, width: int) -> range:
    """All tokens when they fit the figure with every one labelled, else a slider-chosen window."""
    return window_slider(n_tokens, width, "pattern_window")


def token_view(tokens: list[str], patterns: dict[str, Any]) -> None:
    st.markdown("**As text**: hover a token to colour every token by the attention it receives from it.")
    st.html(token_view_html(tokens, patterns, uid="headlens-token-view"), unsafe_allow_javascript=True)
