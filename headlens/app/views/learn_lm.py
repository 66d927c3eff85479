"""Learn on a real language model (SmolLM2, or any Hugging Face causal LM): the split with grouped-query attention,
silent bugs in the attention code, the wrong head count, each with the model's own continuation of a prompt.

The tensors come from :mod:`headlens.app.lesson_lm` (imported when a step runs: it needs torch, which the page's first
paint does not) through the cached loaders; steps 1-3 of
:mod:`headlens.app.views.learn` call these on a bridged causal LM with a Hugging Face directory.
"""

from __future__ import annotations

import html
from typing import Any

import streamlit as st

from headlens import viz
from headlens.app import cache_lm
from headlens.app import helpers as hd
from headlens.app.ui import attempt, current_placement, html_download, md
from headlens.app.views.lesson_parts import bug_losses, bug_patterns, chosen_bugs, window_for
from headlens.viz import lesson as viz_lesson

BUG_TOGGLES = {  # toggle label -> bug name in headlens.doctor.hf_bugs.LM_BUGS
    "Missing transpose before the split": "missing_transpose_split",
    "Merge without transpose": "missing_transpose_merge",
}


def _code(H: int, H_kv: int, d: int, rope: bool) -> str:
    """The attention code of this layout, with the real sizes and each line's shape (comments aligned)."""
    group = H // H_kv
    lines = [(f"q = q_proj(x).view(B, T, {H}, {d}).transpose(1, 2)", f"(B, {H}, T, {d}): {H} query heads"),
             (f"k = k_proj(x).view(B, T, {H_kv}, {d}).transpose(1, 2)", f"(B, {H_kv}, T, {d}): {H_kv} key heads, v alike")]
    if rope:
        lines.append(("q, k = apply_rotary_pos_emb(q, k, cos, sin)", "RoPE: pairs of dimensions rotated by position"))
    if group > 1:
        lines.append((f"k = repeat_kv(k, {group})", f"(B, {H}, T, {d}): k[:, h] is key head h // {group}"))
    lines.append((f"att = softmax(q @ k.transpose(-2, -1) / sqrt({d}) + mask)", f"(B, {H}, T, T)"))
    width = max(len(code) for code, _ in lines) + 2
    return "\n".join(f"{code:<{width}}# {shape}" for code, shape in lines)


def split_step(ref: str, model: Any, text: str, layer: int) -> None:
    cfg = model.cfg
    H, H_kv, d = model.n_heads, int(getattr(cfg, "n_kv_heads", model.n_heads)), int(cfg.d_head)
    gqa = (f" {md(model.name)} uses **grouped-query attention**: its keys and values have only `n_kv_heads = {H_kv}` "
           f"heads of {d}, and each is shared by {H // H_kv} query heads." if H_kv < H else "")
    st.markdown(
        f"Multi-head attention does not give each head its own copy of the residual stream: it **splits** the "
        f"`{H * d}` columns of the queries into `n_heads = {H}` slices of `d_head = {d}`. Head *h* reads columns "
        f"`h·{d}` to `h·{d}+{d - 1}`, and only those.{gqa} Below: layer {layer}'s real queries and keys on your text.")
    with st.spinner("Splitting the heads..."):
        split = attempt("Could not compute the split", cache_lm.get_lm_split, ref, text, layer, current_placement())
    if split is None:
        return
    st.code(_code(H, split.n_kv_heads, d, split.rope), language="python")
    T = len(split.tokens)
    window = window_for(T, 8, "learn_window")
    fig = viz_lesson.residual_split_figure(
        split.q, H, split.tokens, window, title=f"① q = q_proj(x): (B, T, {H * d}) = (1, {T}, {H * d}); the coloured "
                                                f"bands are the {H} query heads' slices")
    st.plotly_chart(fig, key="learn_residual", config={"displayModeBar": False})
    if split.k is not None and split.n_kv_heads < H:
        fig = viz_lesson.residual_split_figure(
            split.k, split.n_kv_heads, split.tokens, window, name="k", head="kv ",
            title=f"② k = k_proj(x): (B, T, {split.k.shape[1]}) = (1, {T}, {split.k.shape[1]}): only "
                  f"{split.n_kv_heads} key heads")
        st.plotly_chart(fig, key="learn_keys", config={"displayModeBar": False})
        group = H // split.n_kv_heads
        st.markdown(f"`repeat_kv(k, {group})` copies each key head {group} times, `(1, {split.n_kv_heads}, {T}, {d})` "
                    f"→ `(1, {H}, {T}, {d})`, so that `q @ k.transpose(-2, -1)` pairs every query head with the key "
                    f"head of its group; the values are shared the same way. The weights stay small: `k_proj` is "
                    f"`{split.k.shape[1]} x {cfg.d_model}`, not `{H * d} x {cfg.d_model}`.")
        fig = viz_lesson.kv_sharing_figure(H, split.n_kv_heads, title=f"③ repeat_kv: query head h reads key/value "
                                                                     f"head h // {group}")
        st.plotly_chart(fig, key="learn_sharing", config={"displayModeBar": False})
    reads = [h // (H // split.n_kv_heads) for h in range(H)]
    fig = viz_lesson.head_slices_figure(split.q_heads, split.tokens, window, reads=reads if H_kv < H else None,
                                        title=f"④ after view + transpose: q (B, H, T, d_head) = (1, {H}, {T}, {d})")
    st.plotly_chart(fig, key="learn_slices", config={"displayModeBar": False})
    st.markdown("Each query head scores its own queries against the keys of its group, so each gets its own pattern: "
                "the same tokens, a different job. Hover a cell to read the query, the key and the weight.")
    shown = list(range(min(H, 12)))
    fig = viz.patterns_figure([split.patterns[h] for h in shown],
                              [f"{hd.format_head(layer, h)} · kv {reads[h]}" if H_kv < H else hd.format_head(layer, h)
                               for h in shown], split.tokens, causal=model.is_causal, window=window,
                              title=f"⑤ each head's pattern, layer {layer}: (H, T, T) = ({H}, {T}, {T})")
    st.plotly_chart(fig, key="learn_patterns", config={"displayModeBar": False})
    html_download(fig, f"{model.name}-learn-split-L{layer}")


def prompt_box() -> str:
    """The prompt the model continues, shared by the bug and head-count steps."""
    from headlens.app.lesson_lm import EIFFEL, N_NEW  # torch: not before the first paint

    if "learn_prompt" not in st.session_state:
        st.session_state.learn_prompt = EIFFEL
    return st.text_input("Prompt the model continues", key="learn_prompt",
                         help=f"the model adds {N_NEW} tokens, greedily, clean and broken").strip() or EIFFEL


def continuation_html(label: str, c: Any, good: bool) -> str:
    """``label: prompt`` followed by the continuation, highlighted (green: the clean model, red: broken)."""
    colour = "#e6f4ea" if good else "#fde8e8"
    shown = html.escape(c.text).replace("\n", "⏎")
    return (f'<div class="headlens-continuation" style="margin: 0.2em 0; font-size: 1.05em;"><b>{html.escape(label)}'
            f'</b> {html.escape(c.prompt)}<span style="background: {colour}; padding: 0.1em 0.25em; '
            f'white-space: pre;">{shown}</span></div>')


def bugs_step(ref: str, model: Any, text: str, layer: int) -> None:
    st.markdown(
        f"The classic multi-head bugs crash nothing: the shapes still work out, the model still runs and answers, only "
        f"wrongly. Plant one in the attention code of a copy of {md(model.name)} (the same weights in plain "
        f"`transformers`; the model above is untouched): its loss on your text and its continuation of your prompt, "
        f"before and after, then `headlens doctor` on the broken layer.")
    prompt = prompt_box()
    for bug in chosen_bugs(BUG_TOGGLES):
        with st.spinner(f"Planting {bug}, continuing your prompt and running the doctor..."):
            result = attempt(f"Could not plant {bug}", cache_lm.get_lm_bug, ref, text, prompt, bug, layer)
        if result is not None:
            show_bug(model, result, layer)


def show_bug(model: Any, b: Any, layer: int) -> None:
    with bug_losses(b):
        st.html(continuation_html("clean:", b.clean, True) + continuation_html("with the bug:", b.bugged, False))
    (st.error if b.diagnosis else st.warning)(
        f"**headlens doctor on the broken layer {layer}:** {b.verdict} (its attention function, next to "
        f"{md(model.name)}'s own on random queries, keys and values)")
    with st.expander("The doctor's full report"):
        st.code(b.report, language=None)
    bug_patterns(model, b, layer)


def head_count_step(ref: str, model: Any, text: str, layer: int) -> None:
    cfg = model.cfg
    H, H_kv, d = model.n_heads, int(getattr(cfg, "n_kv_heads", model.n_heads)), int(cfg.d_head)
    st.markdown(
        f"A head layout is invisible in the weights' shapes: `q_proj` is `{H * d} x {cfg.d_model}` and `k_proj` "
        f"`{H_kv * d} x {cfg.d_model}` for {H} query heads of {d} sharing {H_kv} key/value heads, and just the same "
        f"for {H // H_kv} query heads of {H_kv * d} sharing 1. So a config with the wrong head count "
        f"loads without a word. Load {md(model.name)}'s weights with another layout and ask it to continue your prompt.")
    prompt = prompt_box()
    found = attempt("Cannot rebuild the model", cache_lm.get_layouts, ref, _show=st.info)
    if found is None:
        return
    config, layouts = found
    options = [lay for lay in layouts if lay.n_heads <= 4 * H]
    default = next((lay for lay in options if lay.n_kv_heads == 1 and lay != config), options[0])
    if st.session_state.get("learn_layout") not in [str(o) for o in options]:
        st.session_state.learn_layout = str(default)
    pick = st.select_slider("Load the weights as (slide: every layout the weight shapes allow, fewest heads first)",
                            [str(o) for o in options], key="learn_layout")
    wrong = options[[str(o) for o in options].index(pick)]
    with st.spinner(f"Loading the weights as {wrong} and continuing your prompt..."):
        right_row = attempt("Could not run the model", cache_lm.get_layout_row, ref, text, prompt, config, layer)
        row = attempt(f"Could not load the weights as {wrong}", cache_lm.get_layout_row, ref, text, prompt, wrong, layer)
    if right_row is None or row is None:
        return
    said = row.loaded or "nothing: no missing, unexpected or mismatched weight, no warning"
    (st.success if wrong == config else st.warning)(f"**transformers, loading the weights as {wrong}, said:** {said}")
    c1, c2, c3 = st.columns([1, 1, 3])
    c1.metric(f"loss, {config.n_heads} heads (config)", f"{right_row.loss:.3f} nats")
    c2.metric(f"loss, {wrong.n_heads} heads", f"{row.loss:.3f} nats", delta=f"{row.loss - right_row.loss:+.3f}",
              delta_color="inverse")
    with c3:
        st.html(continuation_html(f"{config.n_heads} heads:", right_row.continuation, True)
                + continuation_html(f"{wrong.n_heads} heads:", row.continuation, wrong == config))
    doctor(ref, wrong, config)
    shown = list(range(min(wrong.n_heads, 8)))
    window = window_for(len(row.tokens), len(shown), "learn_count_window")
    fig = viz.patterns_figure([row.patterns[h] for h in shown], [f"H{h}" for h in shown], row.tokens,
                              causal=model.is_causal, window=window,
                              title=f"layer {layer} loaded as {wrong}: loss {row.loss:.3f} nats"
                                    + (f" (first {len(shown)} of {wrong.n_heads} heads)" if wrong.n_heads > len(shown)
                                       else ""))
    st.plotly_chart(fig, key="learn_count_patterns", config={"displayModeBar": False})


def doctor(ref: str, wrong: Any, config: Any) -> None:
    """``headlens doctor`` on the directory as if its config said ``wrong.n_heads`` (behind a button: seconds)."""
    from headlens.app.lesson_lm import DOCTOR_ROWS, DOCTOR_SEQ_LEN
    key = f"learn_doctor::{ref}::{wrong.n_heads}"
    st.markdown(f"`headlens doctor` rebuilds the model with each layout the weight shapes allow and compares their "
                f"losses: the layout the weights were trained with predicts text, the others do not. Here it tries "
                f"only {wrong.n_heads} and {config.n_heads} query heads on {DOCTOR_ROWS} rows of {DOCTOR_SEQ_LEN} tokens "
                f"of each evaluation source; the command line tries every layout on more text, which takes minutes on "
                f"two cores.")
    if st.button(f"Ask headlens doctor about a config that says {wrong.n_heads} heads", key=f"run_{key}"):
        st.session_state[key] = True
    if not st.session_state.get(key):
        return
    with st.spinner("headlens doctor is loading the weights with both layouts..."):
        result = attempt("The doctor could not check this model", cache_lm.get_lm_doctor, ref, wrong.n_heads,
                         config.n_heads, _show=st.warning)
    if result is None:
        return
    text_report, f = result
    if f.get("verdict") == "inconclusive":
        st.warning(f"**headlens doctor:** INCONCLUSIVE: no evaluation source separates {wrong.n_heads} from "
                   f"{config.n_heads} heads ({f['seconds']:.0f} s).")
    else:
        (st.success if f["passed"] else st.error)(
            f"**headlens doctor:** {'PASSED' if f['passed'] else 'FAILED'}: the weights were trained with "
            f"**{f['inferred_n_heads']}** query heads and {f.get('inferred_n_kv_heads')} key/value heads; the config "
            f"says {f['claimed_n_heads']} (loss measured on {f['evaluation']}; {f['seconds']:.0f} s).")
    with st.expander("The doctor's full report"):
        st.code(text_report, language=None)
