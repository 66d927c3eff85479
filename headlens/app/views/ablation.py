"""Ablation: knock the selected heads out and see the task metric and per-token losses change."""

from __future__ import annotations

from typing import Any

import streamlit as st

from headlens import viz
from headlens.app import cache
from headlens.app import helpers as hd
from headlens.app.ui import attempt, current_placement, html_download, run_button


def ablation_view(ref: str, model: Any, text: str, selected: list[tuple[int, int]],
                  n_prompts: int, seed: int) -> None:
    metrics = attempt("Could not list ablation metrics", hd.ablation_metrics, model)
    if not metrics:
        st.info("Ablation metrics score next-token predictions; this model has no output head to score.")
        return
    from headlens.interventions.ablation import (
        METHODS,  # torch is loaded by now: this view follows a loaded model
    )

    heads = [hd.format_head(layer, head) for layer, head in selected]
    st.markdown(f"**Heads to ablate:** {', '.join(heads) or 'none'} (the selection above)")
    c1, c2 = st.columns(2)
    method = c1.selectbox("Method", METHODS, key="ablation_method",
                          help="zero: remove the head's output; mean: its mean output over probe prompts; "
                               "resample: its output on another prompt; uniform: it attends uniformly over its "
                               "window (Wu et al. 2024's masking of retrieval heads)")
    metric = c2.selectbox("Metric", metrics, key="ablation_metric")
    params = (ref, tuple(heads), method, metric, text, n_prompts, seed)
    last = run_button("Run ablation", "ablation", params, not heads, "heads, a method and a metric")
    if last is None:
        return
    with st.spinner("Ablating..."):
        result = attempt("Ablation failed", cache.get_ablation, *last,
                         placement=current_placement())
    if result is None:
        return
    show_ablation(model, result, last)


def show_ablation(model: Any, result: dict[str, Any], params: tuple) -> None:
    _, heads, method, metric, *_ = params
    row = result["sweep"]
    where = ("random heads of the same layers" if result.get("control", "layer") == "layer"
             else "random heads anywhere else in the model (the selection fills its layers)")
    c1, c2, c3 = st.columns(3)
    c1.metric(f"{metric} change, {', '.join(heads)} ({method})", f"{row['delta']:+.4f}",
              help=f"clean {row['clean']:.4f} -> ablated {row['ablated']:.4f}")
    c2.metric("95% CI", f"[{row['ci_low']:+.4f}, {row['ci_high']:+.4f}]")
    c3.metric("random heads (control)", f"{row['control_delta']:+.4f}",
              help=f"as many {where}")
    effects = result["effects"]
    left, right = st.columns([2, 3])
    left.dataframe(effects, hide_index=True, key="ablation_table")
    left.caption(f"{row['n_prompts']} probe prompts; the control ablates {where}. "
                 f"Beats the control: {'yes' if row.get('beats_control') else 'no'}.")
    with right:
        fig = viz.ablation_figure(effects)
        st.plotly_chart(fig, key="ablation_bars", config={"displayModeBar": False})
        html_download(fig, f"{model.name}-ablation")
    st.markdown("**Per-token loss change on your text** (red: harder to predict after ablation, blue: easier)")
    if "diff" not in result:
        st.info(result.get("token_note", "no per-token losses for this model"))
        return
    st.html(hd.loss_diff_html(result["tokens"], result["diff"]))
    fig = viz.token_loss_figure(result["tokens"], result["diff"])
    st.plotly_chart(fig, key="token_loss", config={"displayModeBar": False})
    html_download(fig, f"{model.name}-token-loss")
