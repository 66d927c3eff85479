"""Patterns: the selected heads' attention on the user's text."""

from __future__ import annotations

from typing import Any

import streamlit as st

from headlens import viz
from headlens.app import cache
from headlens.app import helpers as hd
from headlens.app.ui import attempt, html_download

MAX_PATTERNS = 6  # patterns drawn at once; more selected heads are listed, not drawn


def patterns_view(ref: str, model: Any, text: str, selected: list[tuple[int, int]]) -> None:
    if not selected:
        st.info("Select heads in the grid or in the list above to see their attention patterns.")
        return
    shown = selected[:MAX_PATTERNS]
    if len(selected) > len(shown):
        st.caption(f"Showing the first {MAX_PATTERNS} of {len(selected)} selected heads.")
    result = attempt("Could not compute the attention patterns", cache.get_patterns, ref, text, shown)
    if result is None:
        return
    tokens, patterns = result
    cols = st.columns(min(2, len(shown)))
    for i, (layer, head) in enumerate(shown):
        name = hd.format_head(layer, head)
        with cols[i % len(cols)]:
            fig = viz.pattern_figure(patterns[(layer, head)], tokens, title=f"{name} attention on your text",
                                     causal=model.is_causal)
            st.plotly_chart(fig, key=f"pattern::{name}", config={"displayModeBar": False})
            html_download(fig, f"{model.name}-pattern-{name}")
