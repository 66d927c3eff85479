"""Circuit: which heads feed the chosen receivers, through q, k or v, measured by exact edge patching.

The graph's edge markers are selectable; the selection is mirrored into a select box (which tests
drive, since chart clicks cannot be injected) and the chosen edge's sender and receiver patterns
are drawn side by side on the user's text. On the IOI probe (metric ``logit_diff``) edges take named
positions (END, S2, ...) and the graph is drawn by layer and position; with no receivers, the circuit is
discovered (minutes on a real LM).
"""

from __future__ import annotations

from typing import Any

import streamlit as st

from headlens import viz
from headlens.app import cache
from headlens.app import helpers as hd
from headlens.app.ui import attempt, current_placement, html_download, run_button


def receiver_choices(model: Any) -> list[str]:
    """Heads past layer 0 (they have senders) and the logits."""
    return [f"L{layer}H{h}" for layer in range(1, model.n_layers) for h in range(model.n_heads)] + ["logits"]


def circuit_view(ref: str, model: Any, text: str, scores: Any, selected: list[tuple[int, int]],
                 n_prompts: int, seed: int) -> None:
    metrics = attempt("Could not list metrics", hd.ablation_metrics, model)
    if not metrics:
        st.info("Circuit metrics score next-token predictions; this model has no output head to score.")
        return
    from headlens.circuits.api import head_labels
    from headlens.circuits.senders import METHODS

    choices = receiver_choices(model)
    picked = [hd.format_head(layer, head) for layer, head in selected if layer > 0]
    if "circuit_receivers" not in st.session_state:
        st.session_state.circuit_receivers = picked or choices[-1 - model.n_heads:-1]
    c1, c2, c3 = st.columns([3, 1, 1])
    receivers = c1.multiselect("Receivers", choices, key="circuit_receivers",
                               help="heads (or the logits) whose q, k and v inputs are patched, one sender at a time")
    method = c2.selectbox("Method", METHODS, key="circuit_method",
                          help="what the sender becomes on the edge: its mean, another prompt's output, zero, "
                               "or a corrupted run's")
    metric = c3.selectbox("Metric", metrics, key="circuit_metric")
    ioi = metric == "logit_diff"
    positions, senders_at = ioi_positions() if ioi else ((), ())
    labels = head_labels(scores) if scores is not None and not scores.empty else {}
    params = (ref, tuple(receivers), method, metric, n_prompts, seed, positions, senders_at)
    what = "receivers (or none, to discover the IOI circuit)" if ioi else "receivers, a method and a metric"
    last = run_button("Find edges", "circuit", params, not receivers and not ioi, what)
    if last is None:
        return
    with st.spinner("Discovering the circuit (minutes on a real LM)..." if ioi and not receivers else "Patching edges..."):
        df = attempt("Circuit failed", cache.get_circuit, last[0], list(last[1]), last[2], last[3], last[4],
                     last[5], labels, placement=current_placement(), prompts="ioi" if ioi else None,
                     positions=last[6], sender_positions=last[7])
    if df is None:
        return
    st.session_state[f"circuit_result::{ref}"] = df  # the Head view lists the edges touching its head
    show_circuit(ref, model, text, df, labels)


def edge_name(r: Any) -> str:
    """``L0H1 -> L1H2.k``, with positions where restricted: ``L0H1@S2 -> L1H2.k@END``."""
    sp, rp = getattr(r, "sender_pos", "all"), getattr(r, "receiver_pos", "all")
    return (f"{r.sender}{'' if sp == 'all' else '@' + sp} -> {r.receiver}.{r.input}"
            f"{'' if rp == 'all' else '@' + rp}")


def ioi_positions() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The IOI probe's named positions to patch at: the receiver's, and the sender's for keys and values."""
    from headlens.probes.ioi import POSITION_NAMES

    c1, c2 = st.columns(2)
    at = c1.multiselect("Receiver positions", POSITION_NAMES, default=["END"], key="circuit_positions",
                        help="the receiver's output is patched at these query positions only (one row each)")
    senders = c2.multiselect("Sender positions", POSITION_NAMES, key="circuit_sender_positions",
                             help="where the sender's write enters a key or value (a query reads its own position)")
    return tuple(at), tuple(senders)


def show_circuit(ref: str, model: Any, text: str, df: Any, labels: dict[str, str]) -> None:
    from headlens.circuits.edges import significant_mask

    sig = df[significant_mask(df)]
    st.caption(f"{len(sig)} of {len(df)} edges beat their control; clean {df.attrs['metric']} "
               f"{df.attrs['clean']:.4f}, {df.attrs['n_prompts']} prompts.")
    if "receiver_pos" in df and bool(((df.receiver_pos != "all") | (df.sender_pos != "all")).any()):
        fig = viz.positional_figure(sig, model.n_layers, df.attrs.get("roles"),
                                    title=f"{model.name}: significant edges by layer and position")
        for line in _summary(df):
            st.caption(line)
    else:
        fig = viz.circuit_figure(sig, model.n_layers, model.n_heads, labels, title=f"{model.name}: significant edges")
    event = st.plotly_chart(fig, key="circuit_graph", on_select="rerun", selection_mode="points",
                            config={"displayModeBar": False})
    html_download(fig, f"{model.name}-circuit")
    names = [edge_name(r) for r in df.itertuples()]
    chosen = viz.selected_edge(event) if event else None
    if chosen is not None and f"{chosen[0]} -> {chosen[1]}.{chosen[2]}" in names:
        st.session_state.circuit_edge = f"{chosen[0]} -> {chosen[1]}.{chosen[2]}"
    edge = st.selectbox("Edge", names, key="circuit_edge", help="or click an edge's diamond in the graph")
    st.dataframe(df, hide_index=True, key="circuit_table")
    sender, rest = edge.split(" -> ")
    sender, receiver = sender.split("@")[0], rest.split(".")[0]
    heads = [hd.parse_head(n) for n in (sender, receiver) if n.startswith("L")]
    if not heads or not text:
        return
    tokens, patterns = attempt("Could not draw the patterns", cache.get_patterns, ref, text, heads,
                               placement=current_placement()) or ([], {})
    cols = st.columns(len(heads))
    for col, head in zip(cols, heads, strict=True):
        if head in patterns:
            name = hd.format_head(*head)
            col.plotly_chart(viz.pattern_figure(patterns[head], tokens, title=f"{name}: {labels.get(name, '')}",
                                                causal=model.is_causal),
                             key=f"circuit_pattern_{name}", config={"displayModeBar": False})


def _summary(df: Any) -> list[str]:
    from headlens.circuits.faithfulness import describe

    return describe(df.attrs) if "faithfulness" in df.attrs else []
