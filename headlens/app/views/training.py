"""Training: the loss and every head's score over training snapshots (the induction phase change)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import streamlit as st

from headlens import viz
from headlens.app import cache
from headlens.app import helpers as hd
from headlens.app.ui import attempt, html_download

if TYPE_CHECKING:
    import pandas as pd


def training_view(ref: str, model: Any, scores: pd.DataFrame, detector: str,
                  selected: list[tuple[int, int]]) -> None:
    snapshots = hd.find_snapshots(ref)
    if not snapshots:
        st.info("No training snapshots for this model. Zoo models that ship snapshots (induction-2l) and "
                "checkpoints written by `headlens train` (snapshots/ next to the checkpoint) have this view.")
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
