"""Compare: the loaded model next to a second one (a training snapshot, another zoo model, a checkpoint):
both grids, and the change of every head's score."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import streamlit as st

from headlens import viz
from headlens.app import cache, history
from headlens.app.ui import attempt, current_placement, html_download
from headlens.viz import compare as viz_compare

if TYPE_CHECKING:
    import pandas as pd

OTHER = "a checkpoint path or hf:<dir> ..."


def compare_view(ref: str, model: Any, scores: pd.DataFrame, detector: str, color_by: str,
                 n_prompts: int, seed: int, corpus: str | None) -> None:
    choices = history.compare_choices(ref)
    label = st.selectbox("Compare with", [*choices, OTHER], key=f"compare::{ref}",
                         help="its own training snapshots (before/after a phase change), another zoo model, or "
                              "any checkpoint (a fine-tune, a retrained model)")
    other = choices.get(label) if label != OTHER else st.text_input(
        "Second model", key="compare_path", placeholder="runs/ind/induction-2l.safetensors").strip()
    if not other:
        st.caption("Type the second model's checkpoint path or hf:<dir>.")
        return
    with st.spinner(f"Loading and scoring {other}..."):
        placed = current_placement()
        second = attempt(f"Could not load {other!r}", cache.get_model, other, placed)
        theirs = attempt(f"Could not score {other!r}", cache.get_scores, other, n_prompts, seed, corpus, placed) \
            if second is not None else None
    if second is None or theirs is None:
        return
    names = (model.name, label if label != OTHER else getattr(second, "name", other))
    left, right = st.columns(2)
    for col, m, table, name, key in ((left, model, scores, names[0], "a"), (right, second, theirs, names[1], "b")):
        with col:
            fig = viz.head_grid_figure(table, detector, m.n_layers, m.n_heads, color_by=color_by,
                                       title=f"{name}: " + ("strongest label" if color_by == "label"
                                                            else f"{detector} {color_by}"))
            st.plotly_chart(fig, key=f"compare_grid::{key}", config={"displayModeBar": False})
    if (model.n_layers, model.n_heads) != (second.n_layers, second.n_heads):
        st.info(f"The two models have different shapes ({model.n_layers}x{model.n_heads} vs "
                f"{second.n_layers}x{second.n_heads} heads): their grids side by side, but no head-by-head difference.")
        return
    diff = history.score_diff(scores, theirs)
    detectors = list(dict.fromkeys(diff["detector"]))
    if not detectors:
        st.info("The two score tables share no detector.")
        return
    shown = st.selectbox("Difference of", detectors, index=detectors.index(detector) if detector in detectors else 0,
                         key="compare_detector")
    fig = viz_compare.score_diff_figure(diff, shown, model.n_layers, model.n_heads,
                                        title=f"{shown} score: {names[1]} − {names[0]}")
    st.plotly_chart(fig, key="compare_diff", config={"displayModeBar": False})
    html_download(fig, f"{model.name}-compare-{shown}")
    st.markdown("**Largest changes** (every detector):")
    st.dataframe(diff.head(12), hide_index=True, key="compare_table",
                 column_config={c: st.column_config.NumberColumn(format="%.3f") for c in ("score_a", "score_b", "diff")})
