"""Head: one head's page. Its labels and scores, what it does across real text (the atlas: a tested description,
exemplars, what it reads and writes), what ablating it costs, and the circuits it sits in.

Wiring only. The atlas is :func:`headlens.atlas.build.build_atlas` on a sample of the prose corpus, built once
per model and kept on disk (:mod:`headlens.app.atlas_store`); its exemplars, offset profile and token pairs are
drawn by the static atlas' own renderers (:mod:`headlens.atlas.site`), the OV readout is
:func:`headlens.atlas.reads.ov_on_keys`, the ablation is the Ablation view's (:func:`headlens.app.helpers.run_ablation`)
and the edges are those the Circuit view found this session.
"""

from __future__ import annotations

import html
from typing import Any

import streamlit as st

from headlens.app import cache
from headlens.app import helpers as hd
from headlens.app.ui import ScanProgress, attempt, current_placement, filled_columns, md

SCORE_COLUMNS = ["detector", "score", "ci_low", "ci_high", "baseline", "lift", "label", "rest",
                 "preference", "preference_ci_low", "preference_ci_high"]
HEADERS = {"ci_low": "95% CI low", "ci_high": "95% CI high", "preference_ci_low": "preference CI low",
           "preference_ci_high": "preference CI high"}


def head_view(ref: str, model: Any, text: str, scores: Any, selected: list[tuple[int, int]],
              n_prompts: int, seed: int) -> None:
    """The page of the head picked in the box (it follows the grid: the head clicked last)."""
    layer, head = pick_head(ref, model, selected)
    name = hd.format_head(layer, head)
    atlas = atlas_of(ref)
    role = next((d.role for d in atlas.descriptions if (d.layer, d.head) == (layer, head)), None) if atlas else None
    st.subheader(f"{name} of {md(model.name)}" + (f": {role.replace('_', ' ')}" if role else ""))
    card_section(scores, atlas, layer, head)
    scores_section(scores, layer, head)
    if atlas is not None:
        atlas_sections(model, atlas, layer, head)
    ablation_section(ref, model, name, text, n_prompts, seed)
    circuit_section(ref, model, name)


def pick_head(ref: str, model: Any, selected: list[tuple[int, int]]) -> tuple[int, int]:
    """The head box, set to the head clicked last in the grid (the one new to the selection) when it changes."""
    options = hd.all_heads(model.n_layers, model.n_heads)
    box, seen, kept = f"head_page::{ref}", f"head_page_seen::{ref}", f"head_page_kept::{ref}"
    if box not in st.session_state and kept in st.session_state:  # a box not drawn in a run (another view) is dropped
        st.session_state[box] = st.session_state[kept]
    chosen = [hd.format_head(*h) for h in selected]
    if chosen != st.session_state.get(seen):
        new = [h for h in chosen if h not in (st.session_state.get(seen) or [])]
        if new or chosen:
            st.session_state[box] = (new or chosen)[-1]
        st.session_state[seen] = chosen
    if st.session_state.get(box) not in options:
        st.session_state[box] = options[0]
    st.session_state[kept] = st.selectbox("Head", options, key=box,
                                          help="the head this page is about: the one you clicked last in the grid")
    return hd.parse_head(st.session_state[kept])


def card_section(scores: Any, atlas: Any | None, layer: int, head: int) -> None:
    """The head's card, drawn by the atlas' own renderer: its probe labels and its atlas role, side by side, with a
    sentence where they disagree and which windows the atlas numbers come from."""
    from headlens.atlas import site, views
    from headlens.scoring.card import head_card

    d = next((x for x in atlas.descriptions if (x.layer, x.head) == (layer, head)), None) if atlas else None
    card = head_card(layer, head, scores, d, corpus=str(atlas.config.corpus) if atlas else "prose",
                     windows=views.windows_text(atlas) if atlas else "")
    st.html(f"<style>{site.STYLE}</style>{views.card_html(card)}")


def scores_section(scores: Any, layer: int, head: int) -> None:
    """Its labels, then its score on every detector with the 95 % CI, the baseline and the lift."""
    if scores is None or scores.empty:
        st.caption("No scores for this model.")
        return
    rows = scores[(scores["layer"] == layer) & (scores["head"] == head)]
    labels = [str(d) for d in rows.loc[rows["label"].fillna(False).astype(bool), "detector"]]
    st.markdown("**Labels:** " + (", ".join(labels) if labels else "none (no detector's score passes its threshold)"))
    cols = filled_columns(rows, SCORE_COLUMNS)  # no column that is empty for every row
    st.dataframe(rows[cols].sort_values("score", ascending=False), hide_index=True, key="head_scores",
                 column_config={c: st.column_config.NumberColumn(HEADERS.get(c, c), format="%.4f")
                                for c in cols if c not in ("detector", "label")})


def atlas_of(ref: str) -> Any | None:
    """The model's atlas, built with a progress bar the first time (or None, with why, when it cannot be)."""
    where = st.container()
    bar = ScanProgress(where, "Reading the prose corpus for every head's exemplars and description (once per model: "
                              "kept on disk)", eta=True)

    def heard(done: int, total: int) -> None:
        bar(done, total, "exemplar pass, windows" if done < total else "describing every head on held-out text")

    with where, st.spinner("Building the atlas of this model..."):
        atlas = attempt("The atlas (exemplars and description) cannot be built for this model", cache.get_atlas,
                        ref, current_placement(), progress=heard, _show=st.warning)
    bar.done()
    return atlas


def atlas_sections(model: Any, atlas: Any, layer: int, head: int) -> None:
    """The tested description, what the head reads and writes, and its exemplars under a chosen ranking."""
    from headlens.atlas import site, views
    from headlens.atlas.describe import AGREEMENT
    from headlens.atlas.exemplars import SAMPLED

    d = next(x for x in atlas.descriptions if (x.layer, x.head) == (layer, head))
    ex, flat = atlas.exemplars, layer * atlas.exemplars.n_heads + head
    st.markdown("#### What it does across real text")
    st.html(f"<p class='headlens-description'>{html.escape(d.text)}</p>")
    c1, c2, c3 = st.columns(3)
    c1.metric("role", d.role.replace("_", " "), help=f"the best rule names the role when its agreement is at "
                                                     f"least {AGREEMENT}")
    c2.metric(f"held-out agreement of '{d.rule}'", f"{d.agreement:.2f}", help="Pearson r of the rule's simulated "
              "off-rest attention and the head's real one on held-out windows")
    c3.metric("95% CI", f"[{d.ci[0]:.2f}, {d.ci[1]:.2f}]")
    st.dataframe([{"rule": n, "agreement": v} for n, v in sorted(d.candidates.items(), key=lambda kv: -kv[1])],
                 hide_index=True, key="head_candidates")
    st.caption(md(views.windows_text(atlas)) + " `headlens atlas` reads more.")
    st.markdown("#### What it reads and writes")
    st.image(views.offset_svg(ex.profile, layer, head),  # an <img>: st.html would strip the SVG
             caption="Attention by offset: mean per query row at each offset q - k (1 ... 64, farther); the first "
                     "token and the query itself as numbers beside it")
    left, right = st.columns(2)
    with left:
        st.caption("Frequent (query, key) token pairs among its attention exemplars")
        st.html(f"<style>{site.STYLE}</style>{views.pairs_html(atlas, layer, head)}")
    with right:
        writes_section(model, atlas, d, flat)
    st.markdown("#### Exemplars")
    ranking = st.segmented_control("Ranking", list(ex.top), default="attention", required=True, key="head_ranking",
                                   format_func=lambda r: site.RANKING_TITLES.get(r, r))
    kept = ex.top[ranking][flat]
    order = ("drawn at random, one shown per decile of its off-rest attention" if ranking == SAMPLED else "best first")
    st.caption(f"{len(kept)} exemplars, {order}: the query underlined, the key it attends to most outlined, "
               f"each token shaded by the head's attention from the query.")
    st.html(f"<style>{site.EXEMPLAR_STYLE}</style><div class='headlens-exemplars'>"
            f"{site.ranking_html(atlas, ranking, kept)}</div>")


def writes_section(model: Any, atlas: Any, d: Any, flat: int) -> None:
    """The OV circuit at its exemplars' keys: the share it copies and suppresses, and the tokens it pushes most."""
    from headlens.atlas.reads import TOP_RANK, ov_on_keys

    ev = d.evidence
    n = int(ev.get("n_keys", 0))
    if not n or ev["copies"] != ev["copies"]:
        st.caption("Its OV circuit cannot be read through the unembedding for this model.")
        return
    st.caption(f"Its OV circuit read through the unembedding at the {n} keys its attention exemplars attend to")
    c1, c2 = st.columns(2)
    c1.metric("copies the key", f"{ev['copies']:.2f}", help=f"share of keys in its own top {TOP_RANK}")
    c2.metric("suppresses the key", f"{ev['suppresses']:.2f}", help=f"share of keys in its own bottom {TOP_RANK}")
    with cache.exclusive(model):
        ov = attempt("Could not read its OV circuit", ov_on_keys, model, d.layer, d.head,
                     atlas.exemplars.top["attention"][flat])
    if ov:
        from headlens.atlas.site import STYLE
        from headlens.atlas.views import tokens_html

        st.html(f"<style>{STYLE}</style><p>Promotes most: {tokens_html(ov['promoted'], atlas.strings)}<br>"
                f"Suppresses most: {tokens_html(ov['suppressed'], atlas.strings)}</p><p class='meta'>a word as "
                f"itself; a piece of a word in grey, marked -</p>")


def ablation_metric(model: Any) -> str | None:
    """The loss the page ablates on: next-token loss for a causal LM, else the first metric the model has."""
    metrics = hd.ablation_metrics(model)
    return "lm_loss" if "lm_loss" in metrics else (metrics[0] if metrics else None)


def ablation_section(ref: str, model: Any, name: str, text: str, n_prompts: int, seed: int) -> None:
    """Zero-ablate this head alone: the metric's change with its CI next to random heads, per token on the text."""
    st.markdown("#### Ablating it")
    metric = attempt("Could not list ablation metrics", ablation_metric, model)
    if metric is None:
        st.caption("This model has no output head to score, so no ablation.")
        return
    with st.spinner(f"Ablating {name}..."):
        result = attempt("Ablation failed", cache.get_ablation, ref, [name], "zero", metric, text, n_prompts, seed,
                         placement=current_placement())
    if result is None:
        return
    row = result["sweep"]
    c1, c2, c3 = st.columns(3)
    c1.metric(f"{metric} change, {name} zeroed", f"{row['delta']:+.4f}",
              help=f"clean {row['clean']:.4f} -> ablated {row['ablated']:.4f}")
    one = row["ci_low"] != row["ci_low"]  # one text: nothing to resample
    c2.metric("95% CI", "one text: none" if one else f"[{row['ci_low']:+.4f}, {row['ci_high']:+.4f}]",
              help="a bootstrap over prompts; the Ablation view's probe metrics (repeated_loss ...) have one")
    c3.metric("random heads (control)", f"{row['control_delta']:+.4f}")
    text_used = metric in ("lm_loss", "kl") and getattr(model.tokenizer, "kind", None) != "byte"  # as run_ablation
    on = "your text" if text_used else f"{row['n_prompts']} probe prompts of {metric}"
    st.caption(f"On {on}; the Ablation view zeroes, means or resamples any set of heads.")
    if "diff" in result:
        st.html(hd.loss_diff_html(result["tokens"], result["diff"]))


def circuit_section(ref: str, model: Any, name: str) -> None:
    """The edges into or out of this head among those the Circuit view found this session, or how to find some."""
    from headlens.circuits.edges import significant_mask

    st.markdown("#### Circuits it sits in")
    df = st.session_state.get(f"circuit_result::{ref}")
    if df is None and not model.is_causal:
        st.caption("None: circuits are refused for an encoder (its post-norm blocks make the residual stream no sum "
                   "of writes).")
        return
    if df is None:
        layer, _ = hd.parse_head(name)
        receivers = name if layer > 0 else ",".join(f"L1H{h}" for h in range(model.n_heads))
        st.caption(f"No circuit has been computed for this model in this session: the Circuit view's *Find edges*, "
                   f"or `headlens circuit --model {ref} --receivers {receivers}`.")
        return
    touching = df[(df["sender"] == name) | (df["receiver"] == name)].copy()
    touching.insert(0, "beats control", significant_mask(touching))
    st.caption(f"{int(touching['beats control'].sum())} of {len(touching)} edges touching {name} in the circuit "
               f"found this session (receivers {', '.join(sorted(set(df['receiver'])))}) beat their control.")
    if not touching.empty:
        st.dataframe(touching, hide_index=True, key="head_edges")
