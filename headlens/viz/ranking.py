"""The ranking figure of annotated head types: score and preference accuracy side by side.

One figure module of :mod:`headlens.viz` (which re-exports its builders).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas as pd
    import plotly.graph_objects as go


def ranking_figure(scores: pd.DataFrame, detector: str, top: int = 12, threshold: float | None = 0.4
                   ) -> go.Figure:
    """The ``top`` heads of ``detector`` by its primary statistic (preference accuracy when the table has
    it, Clark et al. 2019; else the score): score and preference accuracy side by side, each with its 95 %
    CI, the label bars (without distractors the score that puts the strength at κ, ``chance + κ (1 - chance)``;
    with them, the preference bar ``chance + ½ (1 - chance)`` and the uniform baseline of the mass) and the
    chance level.

    Args:
        scores: a scores table (``headlens.classify``), with ``preference`` columns for
            annotated head types that have distractors.
        detector: which detector's heads to rank.
        top: how many heads to show.
        threshold: κ of the label rule without distractors, on the strength scale (drawn on the score panel at
            ``chance + κ (1 - chance)``, dashed).
    """
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    from headlens.scoring.primary import preference_chance, ranked
    from headlens.scoring.stats import PREFERENCE_MARGIN
    from headlens.viz.grid import head_name

    rows = ranked(scores, detector).head(top).iloc[::-1]
    names = [head_name(r.layer, r.head) + (" ✓" if r.label else "") for r in rows.itertuples()]
    has_pref = "preference" in rows and rows["preference"].notna().any()
    fig = make_subplots(rows=1, cols=2 if has_pref else 1, shared_yaxes=True, horizontal_spacing=0.04,
                        subplot_titles=("attention mass query → target", "preference accuracy")[:1 + has_pref])

    def bars(col: str, lo: str, hi: str, color: str, c: int) -> None:
        fig.add_trace(go.Bar(
            x=rows[col], y=names, orientation="h", marker_color=color, showlegend=False,
            error_x=dict(type="data", symmetric=False, array=rows[hi] - rows[col], arrayminus=rows[col] - rows[lo]),
            hovertemplate="%{y}: %{x:.3f}<extra>" + col + "</extra>"), row=1, col=c)

    bars("score", "ci_low", "ci_high", "#3b6fb6", 1)
    base = float(rows["baseline"].iloc[0]) if len(rows) else float("nan")
    need = base + threshold * (1 - base) if threshold is not None else float("nan")  # the score whose strength is κ
    if not has_pref and need == need:  # None: a gated type, labelled against its null (no bar on the score)
        fig.add_vline(x=need, line_dash="dash", line_color="#c0392b", row=1, col=1)
    fig.add_vline(x=base, line_dash="dot", line_color="#777777", row=1, col=1)
    fig.update_xaxes(range=[0, 1], title_text="score (95% CI)", row=1, col=1)
    bar = f"label: strength CI ≥ {threshold:g}, score CI ≥ {need:.2f}" if need == need else "label: CI > chance"
    if has_pref:
        bars("preference", "preference_ci_low", "preference_ci_high", "#2e8b57", 2)
        chance = preference_chance(scores, detector)
        need = chance + PREFERENCE_MARGIN * (1 - chance)
        fig.add_vline(x=chance, line_dash="dot", line_color="#777777", row=1, col=2)
        fig.add_vline(x=need, line_dash="dash", line_color="#c0392b", row=1, col=2)
        fig.update_xaxes(range=[0, 1], title_text="target beats distractors (95% CI)", row=1, col=2)
        bar = f"label: preference CI ≥ {need:.2f} and mass CI > uniform"
    ranked_by = "preference accuracy" if has_pref else "score"
    fig.update_layout(height=120 + 26 * len(rows), margin=dict(l=70, r=20, t=50, b=50),
                      title=dict(text=f"{detector}: top {len(rows)} heads by {ranked_by} (✓ labelled) · dashed: "
                                      f"{bar}, dotted: uniform / chance", x=0.01, font=dict(size=14)))
    return fig
