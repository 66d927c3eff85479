"""Attribution: click a token of your text, see which heads wrote it, jump to their attention patterns.

The token's logit at the position before it is split into each head's, MLP's and the embedding's direct
write (:func:`headlens.attribute`, the final norm's scale frozen): the strongest writers and suppressors
as bars. A click on a token square (or the token list it mirrors into) picks the token; a click on a bar
(or the head list) picks a head, and the button hands it to the Patterns view as the grid's selection.
Chart clicks cannot be injected in tests, so every chart mirrors into a widget (TESTING.md).
"""

from __future__ import annotations

import re
from typing import Any

import streamlit as st

from headlens import viz
from headlens.app import cache
from headlens.app.ui import attempt, current_placement, html_download

OWN, PREDICTED = "the token that is there", "the model's own top prediction there"
_HEAD = re.compile(r"^L\d+H\d+$")


def picked(state: Any, key: int = 0) -> list[int]:
    """The ``customdata[key]`` of every point a chart selection holds (``[]`` when none).

    >>> picked({"selection": {"points": [{"customdata": [3]}, {"customdata": [5]}]}})
    [3, 5]
    >>> picked(None)
    []
    """
    points = ((state or {}).get("selection") or {}).get("points") or []
    return [int(p["customdata"][key]) for p in points if p.get("customdata")]


def attribution_view(ref: str, model: Any, text: str) -> None:
    tokens = attempt("Could not read your text", lambda: model.to_str_tokens(model.to_tokens(text)))
    if tokens is None:
        return
    if len(tokens) < 2:
        st.info("Type a text: the view splits the logit of one of its tokens into what each head wrote.")
        return
    position = pick_token(ref, tokens)
    what = st.radio("Decompose the logit of", (OWN, PREDICTED), horizontal=True, key="attr_target",
                    help="the token at that position (which heads wrote it), or the token the model itself "
                         "ranks first after the text before it")
    result = attempt("Could not attribute the logit", cache.get_writers, ref, text, position, what == OWN,
                     placement=current_placement())
    if result is None:
        return
    _, summary = result
    c1, c2 = st.columns([3, 1])
    top = c1.slider("Writers and suppressors shown (each)", 3, 20, 8, key="attr_top")
    heads_only = c2.checkbox("Heads only", key="attr_heads_only", help="leave out the MLPs and the embedding")
    fig = viz.writers_figure(summary, top, heads_only, title=f"who wrote {summary.target.iloc[0]} at position "
                             f"{position} (logit {summary.attrs['total']['mean']:+.2f})")
    st.plotly_chart(fig, key="attr_bars", on_select="rerun", selection_mode="points",
                    config={"displayModeBar": False})
    html_download(fig, f"{model.name}-writers-{position}")
    jump_to_patterns(ref, fig)
    with st.expander("Every component (table)"):
        st.dataframe(summary[["component", "attribution", "share"]], hide_index=True, key="attr_table")


def pick_token(ref: str, tokens: list[str]) -> int:
    """The position whose token is decomposed: a token square clicked, or the list it mirrors into."""
    key, chart_key, last_key = f"attr_pos::{ref}", "attr_strip", "attr_strip_last"
    options = list(range(1, len(tokens)))  # BOS is predicted by nothing
    chart = [p for p in picked(st.session_state.get(chart_key)) if p in options]
    if chart and chart != st.session_state.get(last_key):
        st.session_state[key] = chart[-1]  # a new click on the strip wins over the list
    st.session_state[last_key] = chart
    if st.session_state.get(key) not in options:
        st.session_state[key] = options[-1]
    position = st.selectbox("Token", options, key=key, format_func=lambda i: f"{i}: {viz.display_token(tokens[i])}",
                            help="click a token below, or pick it here")
    st.plotly_chart(viz.token_strip_figure(tokens, position), key=chart_key, on_select="rerun",
                    selection_mode="points", config={"displayModeBar": False})
    return int(position)


def jump_to_patterns(ref: str, fig: Any) -> None:
    """A head of the bars (clicked, or picked from the list) and a button that shows its attention pattern."""
    heads = [y for y in fig.data[0].y if _HEAD.match(str(y))]
    if not heads:
        return
    bars = st.session_state.get("attr_bars")
    clicked = [f"L{layer}H{head}" for layer, head in zip(picked(bars), picked(bars, 1), strict=True) if head >= 0]
    if clicked and clicked != st.session_state.get("attr_bars_last") and clicked[-1] in heads:
        st.session_state["attr_head"] = clicked[-1]  # a new click on a bar wins over the list
    st.session_state["attr_bars_last"] = clicked
    if st.session_state.get("attr_head") not in heads:
        st.session_state["attr_head"] = heads[-1]  # the strongest writer (drawn on top)
    c1, c2 = st.columns([2, 1], vertical_alignment="bottom")
    head = c1.selectbox("Head", heads[::-1], key="attr_head", help="click a bar, or pick the head here")
    if c2.button("Show its attention pattern", key="attr_jump", on_click=_hand_over, args=(ref, head)):
        st.rerun(scope="app")  # the grid's selection and the view live outside this fragment


def _hand_over(ref: str, head: str) -> None:
    """Before the rerun: the head becomes the grid's selection and the page switches to Patterns."""
    st.session_state[f"heads::{ref}"] = [head]
    st.session_state["patterns_mode"] = "selected heads"
    st.session_state["goto_view"] = "Patterns"
