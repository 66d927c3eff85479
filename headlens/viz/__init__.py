"""Figures: pure plotly builders from tables and arrays to ``go.Figure``, the token view, the HTML report.

Nothing here calls Streamlit or runs a model, so every figure the dashboard shows can also be built in
a notebook or an analysis script and saved with :func:`figure_html`. The builders are re-exported
here, the one place figures come from (``from headlens import viz; viz.head_grid_figure(...)``);
the token view (:mod:`headlens.viz.tokenview`), the Learn view's figures (:mod:`headlens.viz.lesson`),
the comparison (:mod:`headlens.viz.compare`) and the report (:mod:`headlens.viz.report`) are imported
from their modules.
"""

from headlens.viz.attribution import token_strip_figure, writers_figure
from headlens.viz.circuit import circuit_figure, selected_edge
from headlens.viz.figures import (
    ablation_figure,
    figure_html,
    head_profile_figure,
    induction_distance_figure,
    token_loss_figure,
    training_figure,
)
from headlens.viz.grid import (
    LABEL_COLORS,
    LABEL_MARKS,
    SELECTED_COLOR,
    UNLABELLED_COLOR,
    head_grid_figure,
    head_name,
    label_mark,
    placeholder_figure,
)
from headlens.viz.patterns import (
    BYTE_ESCAPES,
    PATTERN_WINDOW,
    display_token,
    panels_per_row,
    pattern_figure,
    patterns_figure,
    token_window,
)
from headlens.viz.positions import positional_figure
from headlens.viz.ranking import ranking_figure
from headlens.viz.training import trajectory_figure, trajectory_losses

__all__ = [
    "BYTE_ESCAPES",
    "LABEL_COLORS",
    "LABEL_MARKS",
    "PATTERN_WINDOW",
    "SELECTED_COLOR",
    "UNLABELLED_COLOR",
    "ablation_figure",
    "circuit_figure",
    "display_token",
    "figure_html",
    "head_grid_figure",
    "head_name",
    "head_profile_figure",
    "induction_distance_figure",
    "label_mark",
    "panels_per_row",
    "pattern_figure",
    "patterns_figure",
    "placeholder_figure",
    "positional_figure",
    "ranking_figure",
    "selected_edge",
    "token_loss_figure",
    "token_strip_figure",
    "token_window",
    "training_figure",
    "trajectory_figure",
    "trajectory_losses",
    "writers_figure",
]
