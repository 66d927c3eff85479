"""All heads: one sortable row per head, a column per detector."""

from __future__ import annotations

from typing import TYPE_CHECKING

import streamlit as st

from headlens.app import helpers as hd

if TYPE_CHECKING:
    import pandas as pd


def all_heads_view(scores: pd.DataFrame) -> None:
    if scores.empty:
        st.info("No scores for this model.")
        return
    table = hd.heads_table(scores)
    detectors = [c for c in table.columns if c not in hd.HEAD_COLUMNS]
    config = {"labels": st.column_config.TextColumn(width="medium"),
              **{d: st.column_config.NumberColumn(format="%.3f") for d in detectors}}
    st.dataframe(table, hide_index=True, key="heads_table", column_config=config,
                 height=min(640, 35 * len(table) + 40))
    st.caption("Click a column header to sort. The full tidy table (with CIs and baselines) is the CSV "
               "download in the sidebar.")
