"""Pieces the Learn view's steps share, on headlens' own GPT and on a real language model alike: the token window
of side-by-side patterns, the bug toggles, a bug's losses, and its patterns with the per-token loss change."""

from __future__ import annotations

from typing import Any

import streamlit as st

from headlens import viz
from headlens.app import helpers as hd
from headlens.app.ui import HALF_WINDOW, window_slider
from headlens.viz import lesson as viz_lesson


def window_for(n_tokens: int, n_panels: int, key: str) -> range:
    """The token window every panel shows with all its tokens labelled; a slider when the text is longer.
    Several panels wrap onto rows (``viz.panels_per_row``), so each keeps legible labels."""
    return window_slider(n_tokens, viz.PATTERN_WINDOW if n_panels == 1 else HALF_WINDOW, key)


def chosen_bugs(toggles: dict[str, str]) -> list[str]:
    """One toggle per bug (``label -> bug``), the missing transpose on at first; the bugs switched on."""
    cols = st.columns(len(toggles))
    chosen = [bug for col, (label, bug) in zip(cols, toggles.items(), strict=True)
              if col.toggle(label, value=bug == "missing_transpose_split", key=f"learn_bug::{bug}")]
    if not chosen:
        st.caption("Switch a bug on to plant it.")
    return chosen


def bug_losses(b: Any) -> Any:
    """A bug's name, its line of code and the loss with and without it; returns the column beside them."""
    st.subheader(b.bug.replace("_", " "))
    st.code(b.looks_like, language="python")
    c1, c2, c3 = st.columns([1, 1, 3])
    c1.metric("loss, clean model", f"{b.clean_loss:.3f} nats")
    c2.metric("loss, with the bug", f"{b.bugged_loss:.3f} nats", delta=f"{b.bugged_loss - b.clean_loss:+.3f}",
              delta_color="inverse")
    return c3


def bug_patterns(model: Any, b: Any, layer: int) -> None:
    """A bug step's clean and bugged patterns at ``layer`` and the per-token loss change on the text."""
    T, H = len(b.tokens), b.clean_patterns.shape[0]
    window = window_for(T, min(H, 4), f"learn_bug_window::{b.bug}")
    shown = list(range(min(H, 4)))
    fig = viz.patterns_figure([b.clean_patterns[h] for h in shown], [hd.format_head(layer, h) for h in shown],
                              b.tokens, causal=model.is_causal, window=window, title=f"clean: layer {layer}, (H, T, T)")
    st.plotly_chart(fig, key=f"learn_clean::{b.bug}", config={"displayModeBar": False})
    fig = viz_lesson.bugged_pattern_figure(b.bugged_patterns, b.tokens, window,
                                           title=f"with the bug: layer {layer}, {tuple(b.bugged_patterns.shape)}")
    st.plotly_chart(fig, key=f"learn_bugged::{b.bug}", config={"displayModeBar": False})
    st.caption(f"With the bug the pattern is {b.pattern_axes}."
               + (" The split is right, so the first layer's patterns are unchanged; the scrambled output "
                  "reaches the layers above." if b.bug == "missing_transpose_merge" else ""))
    st.markdown("Per-token loss change on your text (red: worse with the bug):")
    st.html(hd.loss_diff_html(b.tokens[1:], b.token_diff))
