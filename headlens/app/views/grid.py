"""The head grid (layers x heads, clickable) and the selected heads' scores next to it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import streamlit as st

from headlens import viz
from headlens.app import helpers as hd
from headlens.app.ui import html_download

if TYPE_CHECKING:
    import pandas as pd


def default_heads(scores: pd.DataFrame, detector: str) -> list[str]:
    rows = scores[scores["detector"] == detector] if not scores.empty else scores
    if rows.empty:
        return ["L0H0"]
    best = rows.sort_values("score", ascending=False).iloc[0]
    return [hd.format_head(best["layer"], best["head"])]


def grid_layout(ref: str) -> tuple[Any, Any, Any]:
    """The grid's two columns and the slot the grid is drawn in.

    On a session's first run for ``ref`` the slot gets a placeholder figure at once, before the
    model is loaded and scored, so that the browser loads and starts plotly while the server
    works instead of after it (later runs skip it: it would redraw the chart for nothing).
    """
    grid_col, detail_col = st.columns([3, 2], gap="medium")
    with grid_col:
        slot = st.empty()
    if not st.session_state.get(f"drawn::{ref}"):
        slot.plotly_chart(viz.placeholder_figure(f"loading {ref} and scoring every head..."),
                          key="grid_placeholder", config={"displayModeBar": False, "staticPlot": True})
    return grid_col, detail_col, slot


def head_overview(ref: str, model: Any, scores: pd.DataFrame, detector: str, color_by: str,
                  layout: tuple[Any, Any, Any], detail: bool = True) -> list[tuple[int, int]]:
    """The head grid (in ``layout``'s slot) and the mirrored multiselect; returns the selected heads.
    ``detail=False`` (the first paint) leaves out the selected heads' profile and table: their chart and
    table components would load in the browser before the grid is drawn."""
    heads_key, chart_key, last_key = f"heads::{ref}", f"grid::{ref}", f"grid_last::{ref}"
    options = hd.all_heads(model.n_layers, model.n_heads)
    chart = hd.heads_from_selection(st.session_state.get(chart_key))
    if heads_key not in st.session_state:
        chosen = default_heads(scores, detector)
    else:
        chosen = hd.sync_selection(st.session_state[heads_key], chart, st.session_state.get(last_key, []))
    st.session_state[heads_key] = [h for h in chosen if h in options]  # a rewritten checkpoint may shrink
    st.session_state[last_key] = chart

    grid_col, detail_col, slot = layout
    with detail_col:
        chosen = st.multiselect("Selected heads", options, key=heads_key,
                                help="Click squares in the grid (shift-click for several) or pick them here.")
        selected = [hd.parse_head(h) for h in chosen]
        if detail:
            head_detail(scores, selected)
    with grid_col:
        labelled = int(scores["label"].fillna(False).astype(bool).sum()) if not scores.empty else 0
        fig = viz.head_grid_figure(
            scores, detector, model.n_layers, model.n_heads, color_by=color_by, selected=selected,
            title=(f"strongest label per head (colour: type, intensity: strength) · {labelled} labels · click a square"
                   if color_by == "label" else f"{detector} {color_by} per head · {labelled} labels (marked) · "
                                               "click a square"),
        )
        slot.plotly_chart(fig, key=chart_key, on_select="rerun", selection_mode="points",
                          config={"displayModeBar": False})
        st.session_state[f"drawn::{ref}"] = True
        html_download(fig, f"{model.name}-grid-{'labels' if color_by == 'label' else detector}")
        if color_by != "label" and not hd.preference_rows(scores, detector).empty:  # annotated: preference
            tau = scores.attrs.get("thresholds", {}).get(detector, 0.4)
            ranking = viz.ranking_figure(scores, detector, threshold=tau)
            st.plotly_chart(ranking, key=f"ranking::{detector}", config={"displayModeBar": False})
            html_download(ranking, f"{model.name}-ranking-{detector}")
    return selected


def head_detail(scores: pd.DataFrame, selected: list[tuple[int, int]]) -> None:
    """Scores of the selected heads across every detector: a bar chart with CIs, and the numbers."""
    if scores.empty or not selected:
        return
    wanted = set(selected)
    rows = scores[[(int(r.layer), int(r.head)) in wanted for r in scores.itertuples()]]
    if rows.empty:
        return
    fig = viz.head_profile_figure(scores, selected)
    st.plotly_chart(fig, key="profile", config={"displayModeBar": False})
    with st.expander("Scores of the selected heads (table)"):
        table = rows.assign(head=[hd.format_head(r.layer, r.head) for r in rows.itertuples()])
        cols = ["head", "detector", "score", "ci_low", "ci_high", "baseline", "lift", "label"]
        cols += ["rest"] if "rest" in table.columns else []  # attention on the first token, on the row's probe
        cols += [c for c in ("preference", "preference_ci_low", "preference_ci_high") if c in table.columns]
        st.dataframe(table[cols], hide_index=True, key="detail_table")
