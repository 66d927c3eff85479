"""The dashboard's cached loaders: one model object per process, scores, patterns, ablations.

Why models are cached with ``st.cache_resource`` but never kept hooked: every session of
the app shares the one cached model object, and hooks are global state on it. Every use
goes through context managers, and :func:`get_model` resets any hook that leaked anyway.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import streamlit as st

from headlens.app import dashboard_script, history
from headlens.app import helpers as hd
from headlens.app.helpers import Head

if TYPE_CHECKING:
    import pandas as pd

_LOCKS: dict[int, threading.Lock] = {}
_LOCKS_GUARD = threading.Lock()


@contextmanager
def exclusive(model: Any) -> Iterator[Any]:
    """Use the shared model alone: hooks are global state, so two sessions (or the start-up warm-up
    and a first page) running hooked passes at once would see each other's hooks."""
    with _lock(model):
        try:
            yield model
        finally:
            hd.release_hooks(model)


Placement = tuple[str, str]  # (dtype, device) the model runs in: the sidebar's "Precision and device"
DEFAULT_PLACEMENT: Placement = ("float32", "cpu")


_LOADED: set[tuple[str, str, Placement]] = set()  # (ref, fingerprint, placement) loaded in this process


@st.cache_resource(max_entries=4, show_spinner=False)
def _load_model(ref: str, key: str, placement: Placement = DEFAULT_PLACEMENT) -> Any:
    from headlens.models.loading import load

    dtype, device = placement
    model = load(ref, dtype=dtype, device=device)
    _LOADED.add((ref, key, tuple(placement)))
    return model


_BACKGROUND: dict[tuple[str, str, Placement], threading.Thread] = {}
_BACKGROUND_ERRORS: dict[tuple[str, str, Placement], Exception] = {}


def load_in_background(ref: str, placement: Placement = DEFAULT_PLACEMENT) -> None:
    """Start loading ``ref`` into the model cache on a thread (once per model file and placement), so the
    page run that drew the first paint can end and let its messages go out while torch imports."""
    key = (ref, hd.fingerprint(ref), tuple(placement))
    with _LOCKS_GUARD:
        if key in _LOADED or key in _BACKGROUND:  # loaded, loading, or failed (a changed file is another key)
            return

        def work() -> None:
            try:
                get_model(ref, placement)
            except Exception as err:  # the page shows it on its next run
                _BACKGROUND_ERRORS[key] = err

        _BACKGROUND[key] = threading.Thread(target=work, name="headlens-model-load", daemon=True)
        _BACKGROUND[key].start()


def wait_for_load(ref: str, placement: Placement = DEFAULT_PLACEMENT, timeout: float = 1.0) -> None:
    """Wait up to ``timeout`` seconds for the background load of ``ref`` (at once when none runs)."""
    thread = _BACKGROUND.get((ref, hd.fingerprint(ref), tuple(placement)))
    if thread is not None:
        thread.join(timeout)


def background_error(ref: str, placement: Placement = DEFAULT_PLACEMENT) -> Exception | None:
    """Why the background load of ``ref`` failed (None while it runs or when it succeeded)."""
    return _BACKGROUND_ERRORS.get((ref, hd.fingerprint(ref), tuple(placement)))


def ready_model(ref: str, placement: Placement = DEFAULT_PLACEMENT) -> Any | None:
    """The model behind ``ref`` when this process has loaded it already, else None (without loading it or
    importing torch: the page draws what it can before that)."""
    if (ref, hd.fingerprint(ref), tuple(placement)) not in _LOADED:
        return None
    return get_model(ref, placement)  # cached (or, evicted since, loaded again)


def get_model(ref: str, placement: Placement = DEFAULT_PLACEMENT) -> Any:
    """The model behind ``ref``, loaded once per process and placement and shared; never returned with hooks."""
    model = _load_model(ref, hd.fingerprint(ref), tuple(placement))
    lock = _lock(model)
    if lock.acquire(blocking=False):  # else a pass in another session legitimately holds hooks now
        try:
            hd.release_hooks(model)
        finally:
            lock.release()
    return model


def _lock(model: Any) -> threading.Lock:
    with _LOCKS_GUARD:
        return _LOCKS.setdefault(id(model), threading.Lock())


@st.cache_data(max_entries=16, show_spinner=False)
def _stored(ref: str, key: str, n_prompts: int, seed: int, corpus: str | None, placement: Placement,
            stamp: int, detectors: tuple[str, ...]) -> pd.DataFrame | None:
    from headlens.app import score_store
    from headlens.zoo import scores as shipped

    if not corpus and placement[0] == "float32":  # zoo models ship their default (float32) scan
        table = shipped.read(ref, n_prompts, seed, detectors)
        if table is not None:
            return table
    return score_store.read(ref, n_prompts, seed, corpus, placement, detectors) if stamp else None


def get_stored_scores(ref: str, n_prompts: int = hd.DEFAULT_N_PROMPTS, seed: int = 0, corpus: str | None = None,
                      placement: Placement = DEFAULT_PLACEMENT, detectors: Sequence[str] = ()) -> pd.DataFrame | None:
    """The scores of this scan when they need no computing: a zoo model's shipped table, or one this dashboard
    stored on disk (:mod:`headlens.app.score_store`); read without torch. None when there is none, or when it
    lacks one of ``detectors`` (a plugin's: :func:`get_scores` then scans afresh)."""
    from headlens.app import score_store

    placement = tuple(placement)
    stamp = score_store.stamp(ref, int(n_prompts), int(seed), corpus, placement)
    return _stored(ref, hd.fingerprint(ref), int(n_prompts), int(seed), corpus, placement, stamp, tuple(detectors))


_SCANS: dict[tuple, threading.Lock] = {}  # one scan at a time per model and settings, whoever asks
_PROGRESS: dict[tuple, tuple[int, int, str]] = {}  # (done, total, stage) of the scan in flight


def get_scores(ref: str, n_prompts: int = hd.DEFAULT_N_PROMPTS, seed: int = 0, corpus: str | None = None,
               placement: Placement = DEFAULT_PLACEMENT, progress: Any = None) -> pd.DataFrame:
    """The scores table of ``ref`` for this scan: stored (shipped or on disk), else computed once and stored.

    ``progress(done, total, stage)`` hears how the scan goes, also one that another session or the start-up
    warm-up is running for the same settings (this call then waits for it instead of scanning twice).
    """
    from headlens.app import score_store
    from headlens.detectors import all_detectors

    placement = tuple(placement)
    defaults = [n for n, d in all_detectors().items() if d.default]  # a plugin's detector the table lacks: rescan
    args = (ref, int(n_prompts), int(seed), corpus, placement)
    scan = (hd.fingerprint(ref), *args[1:])
    table = get_stored_scores(*args, detectors=defaults)
    if table is not None:
        return table
    with _LOCKS_GUARD:
        lock = _SCANS.setdefault(scan, threading.Lock())
    while not lock.acquire(timeout=0.2):
        if progress is not None and scan in _PROGRESS:
            progress(*_PROGRESS[scan])
    try:
        table = get_stored_scores(*args, detectors=defaults)  # the scan that held the lock has stored it
        if table is not None:
            return table

        def heard(done: int, total: int, stage: str) -> None:
            _PROGRESS[scan] = (done, total, stage)
            if progress is not None:
                progress(done, total, stage)

        with exclusive(get_model(ref, placement)) as model:
            table = hd.compute_scores(model, n_prompts=int(n_prompts), seed=int(seed), corpus=corpus, progress=heard)
        score_store.write(ref, table, *args[1:])
        return table
    finally:
        _PROGRESS.pop(scan, None)
        lock.release()


@st.cache_data(max_entries=64, show_spinner=False)
def _patterns(ref: str, key: str, text: str, heads: tuple[Head, ...],
              placement: Placement = DEFAULT_PLACEMENT) -> tuple[list[str], dict[Head, Any]]:
    with exclusive(get_model(ref, placement)) as model:
        return hd.head_patterns(model, text, heads)


def get_patterns(ref: str, text: str, heads: Sequence[Head],
                 placement: Placement = DEFAULT_PLACEMENT) -> tuple[list[str], dict[Head, Any]]:
    """Tokens of ``text`` and the patterns of ``heads`` on it (cached)."""
    return _patterns(ref, hd.fingerprint(ref), text, tuple(heads), tuple(placement))


@st.cache_data(max_entries=32, show_spinner=False)
def _ablation(ref: str, key: str, heads: tuple[str, ...], method: str, metric: str, text: str,
              n_prompts: int, seed: int, placement: Placement = DEFAULT_PLACEMENT) -> dict[str, Any]:
    with exclusive(get_model(ref, placement)) as model:
        return hd.run_ablation(model, heads, method, metric, text, n_prompts, seed)


def get_ablation(ref: str, heads: Sequence[str], method: str, metric: str, text: str,
                 n_prompts: int = hd.DEFAULT_N_PROMPTS, seed: int = 0,
                 placement: Placement = DEFAULT_PLACEMENT) -> dict[str, Any]:
    """:func:`headlens.app.helpers.run_ablation` on the cached model (results cached too)."""
    return _ablation(ref, hd.fingerprint(ref), tuple(heads), method, metric, text, int(n_prompts), int(seed),
                     tuple(placement))


@st.cache_data(max_entries=8, show_spinner=False)
def _training(ref: str, key: str, detectors: tuple[str, ...], n_prompts: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    snaps = history.find_snapshots(ref)
    return history.training_losses(snaps), history.snapshot_scores(snaps, detectors, n_prompts=n_prompts)


def get_training(ref: str, detectors: Sequence[str] = hd.TRAINING_DETECTORS,
                 n_prompts: int = 10) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Loss curve and per-snapshot scores for a model with training snapshots (cached)."""
    return _training(ref, hd.fingerprint(ref), tuple(detectors), int(n_prompts))


def app_script() -> Path:
    """The Streamlit script shipped inside the package (what ``headlens dashboard`` serves)."""
    return dashboard_script()


# -- the Learn view ---------------------------------------------------------------------------
@st.cache_data(max_entries=16, show_spinner=False)
def _split(ref: str, key: str, text: str, layer: int, placement: Placement = DEFAULT_PLACEMENT) -> Any:
    from headlens.app import lesson

    with exclusive(get_model(ref, placement)) as model:
        return lesson.split_step(model, text, layer)


def get_split(ref: str, text: str, layer: int, placement: Placement = DEFAULT_PLACEMENT) -> Any:
    """:func:`headlens.app.lesson.split_step` on the cached model (cached)."""
    return _split(ref, hd.fingerprint(ref), text, int(layer), tuple(placement))


@st.cache_data(max_entries=16, show_spinner=False)
def _bug(ref: str, key: str, text: str, bug: str, layer: int, placement: Placement = DEFAULT_PLACEMENT) -> Any:
    from headlens.app import lesson

    with exclusive(get_model(ref, placement)) as model:
        return lesson.bug_step(model, text, bug, layer)


def get_bug(ref: str, text: str, bug: str, layer: int, placement: Placement = DEFAULT_PLACEMENT) -> Any:
    """:func:`headlens.app.lesson.bug_step`: ``bug`` planted in a copy of the cached model (cached)."""
    return _bug(ref, hd.fingerprint(ref), text, bug, int(layer), tuple(placement))


def _source(ref: str) -> Path:
    from headlens.app import lesson
    from headlens.errors import ConfigError

    source = lesson.checkpoint_source(ref)
    if source is None:
        raise ConfigError(f"{ref} has no checkpoint file the doctor can read back with other head counts")
    return source


@st.cache_data(max_entries=8, show_spinner=False)
def _head_count(ref: str, key: str, text: str, layer: int, placement: Placement = DEFAULT_PLACEMENT) -> Any:
    from headlens.app import lesson

    source = _source(ref)  # the weights are read back in float32 on the CPU; the model only tokenizes
    return lesson.head_count_step(source, text, layer, model=get_model(ref, placement))


def get_head_count(ref: str, text: str, layer: int, placement: Placement = DEFAULT_PLACEMENT) -> Any:
    """:func:`headlens.app.lesson.head_count_step` on ``ref``'s checkpoint (cached)."""
    return _head_count(ref, hd.fingerprint(ref), text, int(layer), tuple(placement))


@st.cache_data(max_entries=8, show_spinner=False)
def _checkpoint_report(ref: str, key: str) -> tuple[str, dict[str, Any]]:
    from headlens.doctor import check_checkpoint

    report = check_checkpoint(_source(ref))
    return str(report), report.to_dict()


def get_checkpoint_report(ref: str) -> tuple[str, dict[str, Any]]:
    """What ``headlens doctor`` says about ``ref``'s checkpoint: its text and its fields (cached)."""
    return _checkpoint_report(ref, hd.fingerprint(ref))


@st.cache_data(max_entries=16, show_spinner=False)
def _examples(ref: str, key: str, text: str, n_prompts: int, seed: int, corpus: str | None,
              placement: Placement = DEFAULT_PLACEMENT, types: tuple[str, ...] | None = None) -> Any:
    from headlens.app import lesson

    scores = get_scores(ref, n_prompts, seed, corpus, placement)
    with exclusive(get_model(ref, placement)) as model:
        return lesson.head_examples(model, text, scores, types=types)


def get_examples(ref: str, text: str, n_prompts: int = hd.DEFAULT_N_PROMPTS, seed: int = 0,
                 corpus: str | None = None, placement: Placement = DEFAULT_PLACEMENT,
                 types: Sequence[str] | None = None) -> Any:
    """:func:`headlens.app.lesson.head_examples` with the scores the grid shows, for head ``types`` (cached)."""
    return _examples(ref, hd.fingerprint(ref), text, int(n_prompts), int(seed), corpus, tuple(placement),
                     None if types is None else tuple(types))


@st.cache_data(max_entries=16, show_spinner=False)
def _circuit(ref: str, key: str, receivers: tuple[str, ...], method: str, metric: str, n_prompts: int, seed: int,
             labels: tuple[tuple[str, str], ...], placement: Placement = DEFAULT_PLACEMENT, prompts: str | None = None,
             positions: tuple[str, ...] = (), sender_positions: tuple[str, ...] = ()) -> pd.DataFrame:
    from headlens.circuits.api import circuit

    with exclusive(get_model(ref, placement)) as model:
        return circuit(model, receivers=list(receivers) or None, method=method, metric=metric, n_prompts=n_prompts,
                       seed=seed, labels=dict(labels), prompts=prompts, positions=list(positions) or None,
                       sender_positions=list(sender_positions) or None)


def get_circuit(ref: str, receivers: Sequence[str], method: str, metric: str, n_prompts: int = 16, seed: int = 0,
                labels: dict[str, str] | None = None, placement: Placement = DEFAULT_PLACEMENT, prompts: str | None = None,
                positions: Sequence[str] = (), sender_positions: Sequence[str] = ()) -> pd.DataFrame:
    """``headlens.circuit`` edges into ``receivers`` (none: the circuit discovered) on the cached model, on the
    metric's probe or ``prompts="ioi"``, at ``positions`` (results cached too)."""
    return _circuit(ref, hd.fingerprint(ref), tuple(receivers), method, metric, int(n_prompts), int(seed),
                    tuple(sorted((labels or {}).items())), tuple(placement), prompts, tuple(positions),
                    tuple(sender_positions))


@st.cache_data(max_entries=32, show_spinner=False)
def _writers(ref: str, key: str, text: str, position: int, own_token: bool,
             placement: Placement = DEFAULT_PLACEMENT) -> tuple[list[str], pd.DataFrame]:
    from headlens.models.token_text import readable_tokens
    from headlens.readout.dla import attribute
    from headlens.scoring.writers import attribution_summary

    with exclusive(get_model(ref, placement)) as model:
        ids = model.to_tokens(text)[0]
        table = attribute(model, [text], target=int(ids[position]) if own_token else None, position=position - 1)
        return readable_tokens(model, ids), attribution_summary(table, n_boot=10)


def get_writers(ref: str, text: str, position: int, own_token: bool = True,
                placement: Placement = DEFAULT_PLACEMENT) -> tuple[list[str], pd.DataFrame]:
    """Which heads wrote the token at ``position`` of ``text`` (``own_token=False``: the model's own top
    prediction there instead): the tokens and :func:`headlens.attribution_summary` (cached)."""
    return _writers(ref, hd.fingerprint(ref), text, int(position), bool(own_token), tuple(placement))


# -- the head page's atlas --------------------------------------------------------------------
_ATLAS_PROGRESS: dict[tuple, tuple[int, int]] = {}  # (windows done, total) of the atlas pass in flight


@st.cache_resource(max_entries=4, show_spinner=False)
def _stored_atlas(path: str, stamp: int, ref: str, placement: Placement, config: Any) -> Any:
    from headlens.app import atlas_store

    return atlas_store.read(ref, placement, config)


def get_atlas(ref: str, placement: Placement = DEFAULT_PLACEMENT, progress: Any = None) -> Any:
    """The head page's atlas of ``ref`` (:mod:`headlens.app.atlas_store`): stored on disk, else built once with
    ``progress(done, total)`` over the pass's windows (also hearing one another session builds) and stored. The
    prose corpus, or the ``repeats`` corpus for a model that cannot read prose."""
    from headlens.app import atlas_store
    from headlens.atlas.build import build_atlas
    from headlens.errors import ProbeError

    placement = tuple(placement)
    build = (hd.fingerprint(ref), placement)

    def stored() -> Any:
        for config in atlas_store.CONFIGS:
            target = atlas_store.path(ref, placement, config)
            stamp = target.stat().st_mtime_ns if target.exists() else 0
            if stamp and (atlas := _stored_atlas(str(target), stamp, ref, placement, config)) is not None:
                return atlas
        return None

    if (atlas := stored()) is not None:
        return atlas
    with _LOCKS_GUARD:
        lock = _SCANS.setdefault(("atlas", *build), threading.Lock())
    while not lock.acquire(timeout=0.2):
        if progress is not None and build in _ATLAS_PROGRESS:
            progress(*_ATLAS_PROGRESS[build])
    try:
        if (atlas := stored()) is not None:  # the build that held the lock has stored it
            return atlas

        def heard(done: int, total: int) -> None:
            _ATLAS_PROGRESS[build] = (done, total)
            if progress is not None:
                progress(done, total)

        with exclusive(get_model(ref, placement)) as model:
            try:
                atlas = build_atlas(model, atlas_store.CONFIGS[0], progress=heard, subst_windows=0)  # the substitution: headlens atlas
            except ProbeError:  # its tokenizer cannot read English prose
                atlas = build_atlas(model, atlas_store.CONFIGS[1], progress=heard, subst_windows=0)
        atlas_store.write(ref, atlas, placement)
        return atlas
    finally:
        _ATLAS_PROGRESS.pop(build, None)
        lock.release()
