"""The head grid (layers x heads, clickable) and the selected heads' scores next to it."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import streamlit as st

from headlens import viz
from headlens.app import helpers as hd
from headlens.app.ui import filled_columns, html_download

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


def colourings(scores: pd.DataFrame) -> tuple[list[str], str]:
    """The sidebar's ways to colour the grid, and the one it opens on: each head's strongest label when some
    head is labelled (then first), else one detector's score (:func:`headlens.app.helpers.default_detector`)."""
    detectors = list(dict.fromkeys(scores["detector"])) if not scores.empty else ["induction"]
    labelled = not scores.empty and bool(scores["label"].fillna(False).astype(bool).any())
    options = [hd.LABELS_CHOICE, *detectors] if labelled else detectors
    return options, options[0] if labelled else hd.default_detector(scores)


def _selection(ref: str, options: list[str], default: list[str]) -> list[str]:
    """The heads selected this run: ``default`` at first, then the multiselect and the grid's clicks, mirrored."""
    heads_key, chart_key, last_key = f"heads::{ref}", f"grid::{ref}", f"grid_last::{ref}"
    if heads_key not in st.session_state:
        chosen = default
    else:
        chart = hd.heads_from_selection(st.session_state.get(chart_key))
        chosen = hd.sync_selection(st.session_state[heads_key], chart, st.session_state.get(last_key, []))
    return [h for h in chosen if h in options]  # a rewritten checkpoint may shrink


def _select(ref: str, chosen: list[str], options: list[str], detail_col: Any) -> list[tuple[int, int]]:
    """Commit this run's selection and draw the multiselect that mirrors the grid."""
    heads_key = f"heads::{ref}"
    st.session_state[heads_key] = chosen
    st.session_state[f"grid_last::{ref}"] = hd.heads_from_selection(st.session_state.get(f"grid::{ref}"))
    with detail_col:
        chosen = st.multiselect("Selected heads", options, key=heads_key,
                                help="Click squares in the grid (shift-click for several) or pick them here.")
    return [hd.parse_head(h) for h in chosen]


def _draw_grid(ref: str, slot: Any, fig: Any) -> None:
    slot.plotly_chart(fig, key=f"grid::{ref}", on_select="rerun", selection_mode="points",
                      config={"displayModeBar": False})
    st.session_state[f"drawn::{ref}"] = True


def grid_title(color_by: str, detector: str, labelled: int) -> str:
    """Two short lines (a plotly title does not wrap: one long line was cut at the grid's edge): what the grid
    shows, then how to read and use it, smaller.

    >>> grid_title("label", "induction", 221)
    'strongest label per head · 221 labels<br><sup>colour: type, intensity: strength · click a square</sup>'
    """
    if color_by == "label":
        return f"strongest label per head · {labelled} labels<br><sup>colour: type, intensity: strength · click a square</sup>"
    return f"{detector} {color_by} per head · {labelled} labels<br><sup>labelled heads marked · click a square</sup>"


def head_overview(ref: str, model: Any, scores: pd.DataFrame, detector: str, color_by: str,
                  layout: tuple[Any, Any, Any], detail: bool = True,
                  keep: Callable[[dict[str, Any]], Any] | None = None) -> list[tuple[int, int]]:
    """The head grid (in ``layout``'s slot) and the mirrored multiselect; returns the selected heads.
    ``detail=False`` (the first paint) leaves out the selected heads' profile and table: their chart and
    table components would load in the browser before the grid is drawn. ``keep`` hears the grid as
    :mod:`headlens.app.grid_store` keeps it, when it is the one a page opens on (the default colouring, the
    strongest head selected, no ranking under it)."""
    options = hd.all_heads(model.n_layers, model.n_heads)
    default = default_heads(scores, detector)
    chosen = _selection(ref, options, default)
    grid_col, detail_col, slot = layout
    selected = _select(ref, chosen, options, detail_col)
    if detail:
        with detail_col:
            head_detail(scores, selected)
    with grid_col:
        labelled = int(scores["label"].fillna(False).astype(bool).sum()) if not scores.empty else 0
        fig = viz.head_grid_figure(scores, detector, model.n_layers, model.n_heads, color_by=color_by,
                                   selected=selected, title=grid_title(color_by, detector, labelled))
        _draw_grid(ref, slot, fig)
        download = f"{model.name}-grid-{'labels' if color_by == 'label' else detector}"
        html_download(fig, download)
        ranked = color_by != "label" and not hd.preference_rows(scores, detector).empty  # annotated: preference
        if ranked:
            tau = scores.attrs.get("thresholds", {}).get(detector, 0.4)
            ranking = viz.ranking_figure(scores, detector, threshold=tau)
            st.plotly_chart(ranking, key=f"ranking::{detector}", config={"displayModeBar": False})
            html_download(ranking, f"{model.name}-ranking-{detector}")
    if keep is not None and chosen == default and not ranked:  # only the grid a page opens on is kept
        colours, choice = colourings(scores)
        if (detector, color_by) == (hd.default_detector(scores), "label" if choice == hd.LABELS_CHOICE else "score"):
            keep({"name": model.name, "n_layers": model.n_layers, "n_heads": model.n_heads, "options": colours,
                  "choice": choice, "color_by": color_by, "heads": default, "download": download,
                  "figure": json.loads(fig.to_json())})
    return selected


def stored_fits(ref: str, record: dict[str, Any]) -> bool:
    """Whether this session's choices (colouring, selected heads) are those of the stored grid ``record``."""
    current = st.session_state.get("detector")
    if (current if current in record["options"] else record["choice"]) != record["choice"]:
        return False
    if record["color_by"] != "label" and st.session_state.get("color_by", "score") != record["color_by"]:
        return False
    return _selection(ref, hd.all_heads(record["n_layers"], record["n_heads"]), record["heads"]) == record["heads"]


def stored_overview(ref: str, record: dict[str, Any], layout: tuple[Any, Any, Any]) -> None:
    """The first paint from a stored grid (:func:`stored_fits`): the same multiselect, grid and download as
    :func:`head_overview` draws, from the stored figure, without pandas or building the figure."""
    grid_col, detail_col, slot = layout
    _select(ref, record["heads"], hd.all_heads(record["n_layers"], record["n_heads"]), detail_col)
    with grid_col:
        _draw_grid(ref, slot, record["figure"])
        html_download(record["figure"], record["download"])


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
        cols = filled_columns(table, ["head", "detector", "score", "ci_low", "ci_high", "baseline", "lift", "label",
                                      "rest",  # attention on the first token, on the row's probe
                                      "preference", "preference_ci_low", "preference_ci_high"])
        st.dataframe(table[cols], hide_index=True, key="detail_table")
