"""The Learn view's cached loaders on a real language model (SmolLM2, any bridged causal LM): the plain
``transformers`` copy its bugs are planted in, the split, a bug, a head layout, the doctor's check.

Beside :mod:`headlens.app.cache` (same conventions: keyed by the model file's fingerprint, the shared model used
alone through :func:`headlens.app.cache.exclusive`).
"""

from __future__ import annotations

from typing import Any

import streamlit as st

from headlens.app import helpers as hd
from headlens.app.cache import DEFAULT_PLACEMENT, Placement, exclusive, get_model


@st.cache_resource(max_entries=1, show_spinner=False)
def _plain(ref: str, key: str) -> Any:
    from headlens.app import lesson_lm

    return lesson_lm.build(lesson_lm.model_directory(get_model(ref)))[0]


def get_plain(ref: str) -> Any:
    """A plain ``transformers`` copy of ``ref``'s weights (float32, CPU, eager attention): the lesson plants its bugs
    in it and continues prompts with it (one at a time; never kept with a bug: ``headlens.doctor.hf_bugs.planted``)."""
    return _plain(ref, hd.fingerprint(ref))


@st.cache_data(max_entries=16, show_spinner=False)
def _lm_split(ref: str, key: str, text: str, layer: int, placement: Placement) -> Any:
    from headlens.app import lesson_lm

    with exclusive(get_model(ref, placement)) as model:
        return lesson_lm.split_step(model, text, layer)


def get_lm_split(ref: str, text: str, layer: int, placement: Placement = DEFAULT_PLACEMENT) -> Any:
    """:func:`headlens.app.lesson_lm.split_step` on the cached bridged model (cached)."""
    return _lm_split(ref, hd.fingerprint(ref), text, int(layer), tuple(placement))


@st.cache_data(max_entries=16, show_spinner=False)
def _lm_bug(ref: str, key: str, text: str, prompt: str, bug: str, layer: int) -> Any:
    from headlens.app import lesson_lm

    with exclusive(get_plain(ref)) as hf:
        return lesson_lm.bug_step(hf, get_model(ref), text, prompt, bug, layer)


def get_lm_bug(ref: str, text: str, prompt: str, bug: str, layer: int) -> Any:
    """:func:`headlens.app.lesson_lm.bug_step`: ``bug`` planted in the plain copy for one pass (cached)."""
    return _lm_bug(ref, hd.fingerprint(ref), text, prompt, bug, int(layer))


@st.cache_data(max_entries=4, show_spinner=False)
def _layouts(ref: str, key: str) -> Any:
    from headlens.app import lesson_lm

    return lesson_lm.layouts(lesson_lm.model_directory(get_model(ref)))


def get_layouts(ref: str) -> Any:
    """``(config layout, every layout with the same widths)`` of ``ref``'s Hugging Face directory (cached)."""
    return _layouts(ref, hd.fingerprint(ref))


@st.cache_data(max_entries=16, show_spinner=False)
def _layout_row(ref: str, key: str, text: str, prompt: str, layout: tuple[int, int, int], layer: int) -> Any:
    from headlens.app import lesson_lm
    from headlens.doctor.families import HeadLayout

    model = get_model(ref)
    folder = lesson_lm.model_directory(model)
    config, _ = lesson_lm.layouts(folder)
    wanted = HeadLayout(*layout)
    if wanted == config:  # the copy every step shares
        with exclusive(get_plain(ref)) as hf:
            return lesson_lm.layout_row(folder, model, text, prompt, wanted, layer, hf=hf)
    return lesson_lm.layout_row(folder, model, text, prompt, wanted, layer)  # built for this call, then freed


def get_layout_row(ref: str, text: str, prompt: str, layout: Any, layer: int) -> Any:
    """:func:`headlens.app.lesson_lm.layout_row`: ``ref``'s weights loaded with ``layout`` (cached)."""
    key = (int(layout.n_heads), int(layout.n_kv_heads), int(layout.d_head))
    return _layout_row(ref, hd.fingerprint(ref), text, prompt, key, int(layer))


@st.cache_data(max_entries=8, show_spinner=False)
def _lm_doctor(ref: str, key: str, n_heads: int, config_heads: int) -> tuple[str, dict[str, Any]]:
    from headlens.app import lesson_lm

    return lesson_lm.doctor_check(lesson_lm.model_directory(get_model(ref)), n_heads, config_heads)


def get_lm_doctor(ref: str, n_heads: int, config_heads: int) -> tuple[str, dict[str, Any]]:
    """:func:`headlens.app.lesson_lm.doctor_check` on ``ref``'s directory (cached)."""
    return _lm_doctor(ref, hd.fingerprint(ref), int(n_heads), int(config_heads))
