"""Training: the loss and every head's score over training snapshots (the induction phase change)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import streamlit as st

from headlens import viz
from headlens.app import cache, history
from headlens.app import helpers as hd
from headlens.app.ui import attempt, html_download

if TYPE_CHECKING:
    import pandas as pd


def training_view(ref: str, model: Any, scores: pd.DataFrame, detector: str,
                  selected: list[tuple[int, int]]) -> None:
    path = st.text_input("Trajectory table", key="trajectory_table", placeholder="runs/x/trajectory.csv",
                         help="a table written by `headlens trajectory --out` (any model, any number of "
                              "checkpoints); empty: this model's own snapshots")
    if path.strip():
        series = attempt("Could not read the trajectory table", history.read_trajectory, path.strip())
        if series is not None:
            series_view(series, detector, selected, name=str(series.attrs.get("model", model.name)))
        return
    snapshots = history.find_snapshots(ref)
    if not snapshots:
        st.info("No training snapshots for this model. Zoo models that ship snapshots (induction-2l) and "
                "checkpoints written by `headlens train` (snapshots/ next to the checkpoint) have this view; "
                "for any other series, give a table written by `headlens trajectory --out` above.")
        return
    available = set(scores["detector"]) if not scores.empty else set()
    detectors = [d for d in hd.TRAINING_DETECTORS if d in available] or list(hd.TRAINING_DETECTORS[:2])
    st.caption(f"{len(snapshots)} snapshots; each is scored with {', '.join(detectors)}.")
    with st.spinner(f"Scoring {len(snapshots)} training snapshots..."):
        result = attempt("Could not score the training snapshots", cache.get_training, ref, tuple(detectors))
    if result is None:
        return
    losses, snapshot_scores = result
    shown = st.selectbox("Detector over training", detectors, key="training_detector",
                         index=detectors.index(detector) if detector in detectors else 0)
    fig = viz.training_figure(losses, snapshot_scores, shown, highlight=selected)
    st.plotly_chart(fig, key="training", config={"displayModeBar": False})
    html_download(fig, f"{model.name}-training-{shown}")


def series_view(series: pd.DataFrame, detector: str, selected: list[tuple[int, int]], name: str) -> None:
    """A ``headlens trajectory`` table: the loss and every head's score over its checkpoints."""
    detectors = list(dict.fromkeys(series["detector"]))
    st.caption(f"{series['step'].nunique()} checkpoints of {name}; detectors: {', '.join(detectors)}.")
    shown = st.selectbox("Detector over training", detectors, key="trajectory_detector",
                         index=detectors.index(detector) if detector in detectors else 0)
    fig = viz.training_figure(viz.trajectory_losses(series), series, shown, highlight=selected)
    st.plotly_chart(fig, key="trajectory", config={"displayModeBar": False})
    html_download(fig, f"{name}-trajectory-{shown}")
