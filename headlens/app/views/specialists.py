"""Learn, step 4: the model's labelled heads, the strongest of each type, each where it does its job best in the text."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import streamlit as st

from headlens.app import cache
from headlens.app import helpers as hd
from headlens.app.ui import attempt, current_placement
from headlens.viz.tokenview import attention_row_html

if TYPE_CHECKING:
    import pandas as pd


def specialise_step(ref: str, model: Any, text: str, scores: pd.DataFrame, n_prompts: int, seed: int,
                    corpus: str | None) -> None:
    from headlens.app.lesson import specialists

    st.markdown("Trained heads specialise: one attends to the previous token, another to the token after an "
                "earlier copy of the current one (induction), another to an earlier copy of the current token "
                "(duplicate-token). These are this model's labelled heads, the strongest of each type, each with the "
                "place in your text where it does its job best (query outlined, target underlined, blue = attention).")
    kinds = list(specialists(scores, per_type=1)) if not scores.empty else []
    if not kinds:
        st.info("No head of this model passes the labelling rule (see the All heads view for every score)."
                if not scores.empty else "No scores for this model, so no labelled heads to show.")
        return
    key = f"learn_types::{ref}"
    if not set(st.session_state.get(key) or []) <= set(kinds):
        del st.session_state[key]
    types = st.multiselect("Head types", kinds, default=kinds[:4], key=key,
                           help="the labelled head types, strongest first; each type's three strongest heads")
    with st.spinner("Finding an example for each labelled head..."):
        result = attempt("Could not find examples", cache.get_examples, ref, text, n_prompts, seed, corpus,
                         current_placement(), types)
    if result is None:
        return
    tokens, examples = result
    for kind in types:
        group = [e for e in examples if e.detector == kind]
        st.markdown(f"#### {kind}" + (f": {describe(kind)}" if describe(kind) else ""))
        for e in group:
            show_example(ref, model, tokens, e)
    if model.is_causal:
        attribution_link(ref, tokens, examples)


def describe(detector: str) -> str:
    from headlens.detectors import get_detector
    from headlens.errors import DetectorError

    try:
        return str(get_detector(detector).description or "")
    except DetectorError:  # an annotated head type of the user's own
        return ""


def show_example(ref: str, model: Any, tokens: list[str], e: Any) -> None:
    """One labelled head: its score, and its attention row at the query of the text where it does its job best."""
    name = hd.format_head(e.layer, e.head)
    c1, c2 = st.columns([5, 1])
    head_line = f"**{name}** · `{e.detector}` {e.score:.2f} [{e.ci_low:.2f}, {e.ci_high:.2f}]"
    if e.query is None:
        c1.markdown(head_line + ": your text has no position where this head type has a target "
                    "(e.g. repeat a segment for induction, nest brackets for bracket heads).")
    else:
        targets = ", ".join(f"{tokens[k]!r} (#{k})" for k in e.keys[:4]) + (" ..." if len(e.keys) > 4 else "")
        c1.markdown(head_line + f": at {tokens[e.query]!r} (#{e.query}) it puts **{e.weight:.2f}** of its "
                    f"attention on {targets}.")
        start = max(0, e.query - CONTEXT + 1)  # the query and the context before it
        stop = e.query + 1 if model.is_causal else min(len(tokens), e.query + CONTEXT // 4)
        with c1:
            st.html(attention_row_html(tokens[start:stop], list(e.row[start:stop]), e.query - start,
                                       [k - start for k in e.keys if start <= k < stop]))
    if c2.button("Show in grid", key=f"learn_show::{name}", on_click=show_in_grid, args=(ref, name, e.detector),
                 help="select this head in the grid above, coloured by this detector"):
        st.rerun()  # the whole page: the grid is outside this view's fragment


def attribution_link(ref: str, tokens: list[str], examples: list[Any]) -> None:
    """A button to the Attribution view ("which heads wrote the next word"), on the token after the strongest
    induction head's example (the word it helps predict), else the text's last token."""
    after = [e.query + 1 for e in examples if e.detector == "induction" and e.query is not None
             and e.query + 1 < len(tokens)]
    position = after[0] if after else len(tokens) - 1
    if position < 1:
        return
    st.divider()
    st.button(f"Which heads wrote {tokens[position]!r} (#{position})? Open the Attribution view",
              key="learn_attribution", on_click=_to_attribution, args=(ref, position), type="primary",
              help="the logit of that token split into what each head, MLP and the embedding wrote")


def _to_attribution(ref: str, position: int) -> None:
    """Before the rerun: the Attribution view opens on ``position`` (the page pops ``goto_view``)."""
    st.session_state[f"attr_pos::{ref}"] = position
    st.session_state["goto_view"] = "Attribution"


CONTEXT = 48  # tokens of context shown up to an example's query


def show_in_grid(ref: str, head: str, detector: str) -> None:
    """Select ``head`` in the grid and colour the grid by ``detector`` (a button callback)."""
    st.session_state[f"heads::{ref}"] = [head]
    st.session_state["detector"] = detector
    st.session_state["color_by"] = "score"
