"""Learn: the lesson behind headlens, step by step, on the loaded model and the user's own text.

Each step is a figure and two or three sentences; the tensors come from ``headlens.app.lesson``
(through the cached loaders) and the figures from ``headlens.viz`` / ``headlens.viz.lesson``.
Steps that need headlens' native GPT say so on a bridged model and show what they can.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import streamlit as st

from headlens import viz
from headlens.app import cache
from headlens.app import helpers as hd
from headlens.app.ui import HALF_WINDOW, attempt, current_placement, html_download, window_slider
from headlens.app.views import learn_lm
from headlens.viz import lesson as viz_lesson
from headlens.viz.tokenview import attention_row_html

if TYPE_CHECKING:
    import pandas as pd

STEPS = ("1 · The split", "2 · Silent bugs", "3 · How many heads?", "4 · Heads specialise")
BUG_TOGGLES = {  # toggle label -> bug name in headlens.doctor.inject.LESSON_BUGS
    "Missing transpose before the split": "missing_transpose_split",
    "Wrong view order": "wrong_view_order",
    "Merge without transpose": "missing_transpose_merge",
}
NATIVE_NOTE = ("This step runs headlens' own attention code, which a model bridged through TransformerLens "
               "does not have; {what}")


def learn_view(ref: str, model: Any, text: str, scores: pd.DataFrame, n_prompts: int, seed: int,
               corpus: str | None) -> None:
    native = hasattr(getattr(model, "transformer", None), "h")
    c1, c2 = st.columns([4, 1])
    step = c1.radio("Step", STEPS, horizontal=True, key="learn_step", label_visibility="collapsed")
    layer = c2.selectbox("Layer", list(range(model.n_layers)), key="learn_layer",
                         format_func=lambda i: f"layer {i}")
    lm = not native and real_lm(model)  # a bridged language model: the lesson runs on copies of its weights
    if step == STEPS[0]:
        (learn_lm.split_step(ref, model, text, layer) if not native else split_step(ref, model, text, layer, native))
    elif step == STEPS[1]:
        (learn_lm.bugs_step(ref, model, text, layer) if lm else bugs_step(ref, model, text, layer, native))
    elif step == STEPS[2]:
        (learn_lm.head_count_step(ref, model, text, layer) if lm else head_count_step(ref, model, text, layer))
    else:
        specialise_step(ref, model, text, scores, n_prompts, seed, corpus)


def real_lm(model: Any) -> bool:
    """A causal language model with a Hugging Face directory the lesson can rebuild it from (SmolLM2, hf:<dir>)."""
    from headlens.app.lesson_lm import model_directory
    from headlens.errors import ConfigError

    if not model.is_causal or getattr(model, "output_kind", "logits") != "logits":
        return False
    try:
        model_directory(model)
    except ConfigError:
        return False
    return True


def window_for(n_tokens: int, n_panels: int, key: str) -> range:
    """The token window every panel shows with all its tokens labelled; a slider when the text is longer.
    Several panels wrap onto rows (``viz.panels_per_row``), so each keeps legible labels."""
    return window_slider(n_tokens, viz.PATTERN_WINDOW if n_panels == 1 else HALF_WINDOW, key)


def split_step(ref: str, model: Any, text: str, layer: int, native: bool) -> None:
    d_model, H = model.cfg.d_model, model.n_heads
    d_head = d_model // H
    st.markdown(
        f"Multi-head attention does not give each head its own copy of the residual stream: it **splits** "
        f"the `d_model = {d_model}` columns of the queries (and keys, and values) into `n_heads = {H}` slices "
        f"of `d_head = {d_head}`. Head *h* reads columns `h·{d_head}` to `h·{d_head}+{d_head - 1}`, and only "
        f"those. Below: layer {layer}'s real queries on your text.")
    st.code("q = q.view(B, T, n_heads, d_head)   # (B, T, H, d_head): axis 2 is the head\n"
            "q = q.transpose(1, 2)               # (B, H, T, d_head): each head attends on its own",
            language="python")
    if not native:
        st.info(NATIVE_NOTE.format(what="here are the heads' patterns on your text, side by side."))
        heads = [(layer, h) for h in range(H)]
        result = attempt("Could not compute the attention patterns", cache.get_patterns, ref, text, heads,
                         placement=current_placement())
        if result is not None:
            tokens, pats = result
            window = window_for(len(tokens), H, "learn_window")
            fig = viz.patterns_figure([pats[h] for h in heads], [hd.format_head(*h) for h in heads], tokens,
                                      causal=model.is_causal, window=window)
            st.plotly_chart(fig, key="learn_patterns", config={"displayModeBar": False})
        return
    with st.spinner("Splitting the heads..."):
        split = attempt("Could not compute the split", cache.get_split, ref, text, layer, current_placement())
    if split is None:
        return
    T = len(split.tokens)
    window = window_for(T, min(H, 8), "learn_window")
    fig = viz_lesson.residual_split_figure(
        split.q, H, split.tokens, window,
        title=f"① q = c_attn(x)[..., :d_model]: (B, T, d_model) = (1, {T}, {d_model}); the coloured bands "
              f"are the heads' slices")
    st.plotly_chart(fig, key="learn_residual", config={"displayModeBar": False})
    st.markdown(f"`view(B, T, {H}, {d_head})` only re-reads the same numbers as `(1, {T}, {H}, {d_head})`; "
                f"`transpose(1, 2)` then brings the head axis forward, `(1, {H}, {T}, {d_head})`, so that each "
                f"head holds a `({T}, {d_head})` matrix of its own: exactly its band above.")
    fig = viz_lesson.head_slices_figure(split.q_heads, split.tokens, window,
                                        title=f"② after view + transpose: (B, H, T, d_head) = (1, {H}, {T}, {d_head})")
    st.plotly_chart(fig, key="learn_slices", config={"displayModeBar": False})
    st.markdown("Each head scores its own queries against its own keys, so each gets its own pattern: the same "
                "tokens, a different job. Hover a cell to read the query, the key and the weight.")
    shown = list(range(min(H, 8)))
    fig = viz.patterns_figure([split.patterns[h] for h in shown], [hd.format_head(layer, h) for h in shown],
                              split.tokens, causal=model.is_causal, window=window,
                              title=f"③ each head's pattern, layer {layer}: (H, T, T) = ({H}, {T}, {T})")
    st.plotly_chart(fig, key="learn_patterns", config={"displayModeBar": False})
    html_download(fig, f"{model.name}-learn-split-L{layer}")


def bugs_step(ref: str, model: Any, text: str, layer: int, native: bool) -> None:
    st.markdown("The classic multi-head bugs crash nothing: the shapes still work out, the model still runs and "
                "even trains, only worse. Plant one in a **copy** of this model (your model is untouched) and "
                "compare its patterns and its loss on your text, then ask `headlens doctor` about the broken layer.")
    if not native:
        st.info(NATIVE_NOTE.format(what="the bugs are planted in headlens' own GPT, so this step needs a zoo "
                                        "model or a headlens checkpoint."))
        return
    for bug in chosen_bugs(BUG_TOGGLES):
        with st.spinner(f"Planting {bug} and running the doctor..."):
            result = attempt(f"Could not plant {bug}", cache.get_bug, ref, text, bug, layer, current_placement())
        if result is not None:
            show_bug(model, result, layer)


def chosen_bugs(toggles: dict[str, str]) -> list[str]:
    """One toggle per bug (``label -> bug``), the missing transpose on at first; the bugs switched on."""
    cols = st.columns(len(toggles))
    chosen = [bug for col, (label, bug) in zip(cols, toggles.items(), strict=True)
              if col.toggle(label, value=bug == "missing_transpose_split", key=f"learn_bug::{bug}")]
    if not chosen:
        st.caption("Switch a bug on to plant it.")
    return chosen


def bug_losses(b: Any) -> Any:
    """A bug's name, its line of code and the loss with and without it; returns the column beside them."""
    st.subheader(b.bug.replace("_", " "))
    st.code(b.looks_like, language="python")
    c1, c2, c3 = st.columns([1, 1, 3])
    c1.metric("loss, clean model", f"{b.clean_loss:.3f} nats")
    c2.metric("loss, with the bug", f"{b.bugged_loss:.3f} nats", delta=f"{b.bugged_loss - b.clean_loss:+.3f}",
              delta_color="inverse")
    return c3


def show_bug(model: Any, b: Any, layer: int) -> None:
    c3 = bug_losses(b)
    (c3.error if b.diagnosis else c3.warning)(f"**headlens doctor on the broken layer {layer}:** {b.verdict}")
    with c3.expander("The doctor's full report"):
        st.code(b.report, language=None)
    bug_patterns(model, b, layer)


def bug_patterns(model: Any, b: Any, layer: int) -> None:
    """A bug step's clean and bugged patterns at ``layer`` and the per-token loss change on the text."""
    T, H = len(b.tokens), b.clean_patterns.shape[0]
    window = window_for(T, min(H, 4), f"learn_bug_window::{b.bug}")
    shown = list(range(min(H, 4)))
    fig = viz.patterns_figure([b.clean_patterns[h] for h in shown], [hd.format_head(layer, h) for h in shown],
                              b.tokens, causal=model.is_causal, window=window, title=f"clean: layer {layer}, (H, T, T)")
    st.plotly_chart(fig, key=f"learn_clean::{b.bug}", config={"displayModeBar": False})
    fig = viz_lesson.bugged_pattern_figure(b.bugged_patterns, b.tokens, window,
                                           title=f"with the bug: layer {layer}, {tuple(b.bugged_patterns.shape)}")
    st.plotly_chart(fig, key=f"learn_bugged::{b.bug}", config={"displayModeBar": False})
    st.caption(f"With the bug the pattern is {b.pattern_axes}."
               + (" The split is right, so the first layer's patterns are unchanged; the scrambled output "
                  "reaches the layers above." if b.bug == "missing_transpose_merge" else ""))
    st.markdown("Per-token loss change on your text (red: worse with the bug):")
    st.html(hd.loss_diff_html(b.tokens[1:], b.token_diff))


def head_count_step(ref: str, model: Any, text: str, layer: int) -> None:
    d_model, H = model.cfg.d_model, model.n_heads
    st.markdown(
        f"A head layout is invisible in the weights' shapes: a `{d_model} x {d_model}` projection is the same "
        f"tensor for any head count that divides {d_model}. So a config with the wrong `n_heads` loads without "
        f"complaint. Here the checkpoint is read back with **every divisor of d_model** as `n_heads`: only the "
        f"count it was trained with ({H}) predicts your text well.")
    with st.spinner("Reading the checkpoint back with every head count..."):
        result = attempt("Cannot read the checkpoint back", cache.get_head_count, ref, text, layer, current_placement(),
                         _show=st.info)
    if result is None:
        return
    tokens, rows = result
    with st.spinner("Running headlens doctor on the checkpoint..."):
        report = attempt("The doctor could not check this checkpoint", cache.get_checkpoint_report, ref,
                         _show=st.warning)
    inferred = report[1]["inferred_n_heads"] if report and report[1].get("verdict") != "inconclusive" else None
    fig = viz_lesson.head_count_figure([r.n_heads for r in rows], [r.loss for r in rows], H, inferred)
    st.plotly_chart(fig, key="learn_head_count", config={"displayModeBar": False})
    html_download(fig, f"{model.name}-learn-head-count")
    if report:
        text_report, fields = report
        ok = fields["passed"]
        if fields.get("verdict") == "inconclusive":
            st.warning(f"**headlens doctor:** INCONCLUSIVE: no evaluation source separates the head counts; the "
                       f"config says {fields['config_n_heads']}, which nothing here confirms or contradicts.")
        else:
            (st.success if ok else st.error)(
                f"**headlens doctor:** the weights were trained with **{fields['inferred_n_heads']}** heads; the "
                f"config says {fields['config_n_heads']} ({'PASSED' if ok else 'FAILED'}; loss measured on "
                f"{fields['evaluation']}).")
        with st.expander("The doctor's full report"):
            st.code(text_report, language=None)
    counts = [r.n_heads for r in rows]
    pick = st.select_slider("Patterns with the weights split into n_heads =", counts, value=H if H in counts else counts[0],
                            key="learn_n_heads")
    row = next(r for r in rows if r.n_heads == pick)
    shown = list(range(min(pick, 8)))
    window = window_for(len(tokens), len(shown), "learn_count_window")
    fig = viz.patterns_figure([row.patterns[h] for h in shown], [f"H{h}" for h in shown], tokens,
                              causal=model.is_causal, window=window,
                              title=f"layer {layer} split into {pick} heads of d_head {row.d_head}: loss {row.loss:.3f} "
                                    f"nats" + (f" (first {len(shown)} of {pick} heads)" if pick > len(shown) else ""))
    st.plotly_chart(fig, key="learn_count_patterns", config={"displayModeBar": False})


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
    attribution_link(ref)


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


ATTRIBUTION_MODULE = "headlens.app.views.attribution"  # the DLA view ("which heads wrote the next word")


def attribution_link(ref: str) -> None:
    """A button to the DLA view, once it is installed: a hook for ``headlens.app.views.attribution``, which names
    its entry in the page's view switch as ``VIEW``; nothing is shown until then."""
    import importlib
    import importlib.util

    if importlib.util.find_spec(ATTRIBUTION_MODULE) is None:
        return
    view = getattr(importlib.import_module(ATTRIBUTION_MODULE), "VIEW", None)
    if view:
        st.divider()
        st.button("Which heads wrote the next word? Open the attribution view", key="learn_attribution",
                  on_click=lambda: st.session_state.update(view=view), type="primary")


CONTEXT = 48  # tokens of context shown up to an example's query


def show_in_grid(ref: str, head: str, detector: str) -> None:
    """Select ``head`` in the grid and colour the grid by ``detector`` (a button callback)."""
    st.session_state[f"heads::{ref}"] = [head]
    st.session_state["detector"] = detector
    st.session_state["color_by"] = "score"
