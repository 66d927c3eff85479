"""Learn: the lesson behind headlens, step by step, on the loaded model and the user's own text.

Each step is a figure and two or three sentences; the tensors come from ``headlens.app.lesson``
(through the cached loaders) and the figures from ``headlens.viz`` / ``headlens.viz.lesson``.
On a bridged language model with a Hugging Face directory (SmolLM2) steps 1-3 run on its real tensors and on
plain ``transformers`` copies of its weights (:mod:`headlens.app.views.learn_lm`); on other bridged models (an
encoder) the bug steps say what they need. Step 4 is :mod:`headlens.app.views.specialists`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import streamlit as st

from headlens import viz
from headlens.app import cache
from headlens.app import helpers as hd
from headlens.app.ui import attempt, current_placement, html_download
from headlens.app.views import learn_lm
from headlens.app.views.lesson_parts import bug_losses, bug_patterns, chosen_bugs, window_for
from headlens.app.views.specialists import specialise_step
from headlens.viz import lesson as viz_lesson

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
        (learn_lm.split_step(ref, model, text, layer) if not native else split_step(ref, model, text, layer))
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


def split_step(ref: str, model: Any, text: str, layer: int) -> None:
    """The split on headlens' own GPT (a bridged model's is :func:`headlens.app.views.learn_lm.split_step`)."""
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


def show_bug(model: Any, b: Any, layer: int) -> None:
    c3 = bug_losses(b)
    (c3.error if b.diagnosis else c3.warning)(f"**headlens doctor on the broken layer {layer}:** {b.verdict}")
    with c3.expander("The doctor's full report"):
        st.code(b.report, language=None)
    bug_patterns(model, b, layer)


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


