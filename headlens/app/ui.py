"""Widgets every view shares: a guard that turns failures into messages, figure downloads, the
token-window slider of pattern heatmaps, and a progress bar for long scans."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import Any

import streamlit as st

from headlens import viz
from headlens.errors import HeadlensError
from headlens.progress import Pace, status

HALF_WINDOW = 40  # tokens a half-width heatmap (several side by side) labels legibly; full width: viz.PATTERN_WINDOW


def md(text: object) -> str:
    r"""``text`` as literal Markdown inside a line: the characters Streamlit's Markdown reads as syntax there
    (emphasis, code, links, HTML, ``$`` maths, ``:red[...]`` colours, tables, entities) backslash-escaped, so a
    token string or a model's name shows as typed (``-`` and ``#`` mean something only at a line's start).

    >>> print(md("**a** [x](y) <b>"))
    \*\*a\*\* \[x\](y) \<b\>
    """
    return re.sub(r"([\\`*_\[\]<>$|~&])", r"\\\1", str(text))


def window_slider(n_tokens: int, width: int, key: str) -> range:
    """All tokens when they fit a figure of ``width`` labelled tokens, else a slider-chosen window of ``width``."""
    if n_tokens <= width:
        return range(n_tokens)
    start = st.slider(f"Tokens shown ({width} of {n_tokens}, every one labelled): first position", 0,
                      n_tokens - width, 0, key=f"{key}::{n_tokens}::{width}")
    return viz.token_window(n_tokens, start, width)


def attempt(what: str, fn: Callable[..., Any], *args: Any, _show: Callable[[str], Any] = st.error,
            **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)``, or ``None`` after showing why it failed (never an exception box)."""
    try:
        return fn(*args, **kwargs)
    except HeadlensError as err:
        _show(f"{what}: {err}")
    except Exception as err:  # a readable line instead of a traceback; the page keeps working
        _show(f"{what}: unexpected {type(err).__name__}: {err}")
    return None


def run_button(label: str, key: str, params: tuple, disabled: bool, what: str) -> tuple | None:
    """A primary button that runs a view's computation; the parameters of its last run (``params[0]``: the
    model reference) stay in ``st.session_state[f"{key}_params"]`` across reruns. Returns them, or None
    (with a caption saying what to choose) until it has run for this model."""
    if st.button(label, type="primary", disabled=disabled, key=f"run_{key}"):
        st.session_state[f"{key}_params"] = params
    last = st.session_state.get(f"{key}_params")
    if not last or last[0] != params[0]:
        st.caption(f"Choose {what}, then press {label}.")
        return None
    if last != params:
        st.caption(f"Settings changed since the last run; press {label} to update.")
    return last


def current_placement() -> tuple[str, str]:
    """The (dtype, device) chosen in the sidebar's *Precision and device* this run."""
    return str(st.session_state.get("dtype", "float32")), str(st.session_state.get("device", "cpu"))


def html_download(fig: Any, name: str) -> None:
    """A button that saves ``fig`` as a standalone HTML page (generated only when clicked)."""
    st.download_button(
        "Download figure (HTML)", data=lambda fig=fig: viz.figure_html(fig), file_name=f"{name}.html",
        mime="text/html", on_click="ignore", key=f"download::{name}", type="tertiary", icon=":material/download:",
    )


class ScanProgress:
    """A ``progress(done, total, stage)`` callback that draws a bar in ``container`` once the work reports
    (nothing when the result needed no computing), at most every ``every`` seconds, in the words of every
    progress display (:func:`headlens.progress.status`): the phase, the count, the time elapsed and the time
    left, labelled. A new total or a count that goes back is a new phase, with its own pace. (``eta`` is kept
    for callers that passed it: the time left is always shown once there is a pace to tell it from.)"""

    def __init__(self, container: Any, what: str, every: float = 0.25, eta: bool = True) -> None:
        self.container, self.what, self.every = container, what, every
        self.bar: Any = None
        self.last = 0.0
        self.start = time.monotonic()
        self.pace = Pace()  # the current phase's, for its time left

    def __call__(self, done: int, total: int, stage: str) -> None:
        now = time.monotonic()
        self.pace.update(now, done, total)
        if self.bar is not None and now - self.last < self.every and done < total:
            return
        self.last = now
        text = f"{self.what}: {status(stage, done, total, now - self.start, self.pace.left(now))}"
        fraction = min(1.0, done / total) if total else 0.0
        if self.bar is None:
            self.bar = self.container.progress(fraction, text=text)
        else:
            self.bar.progress(fraction, text=text)

    def done(self) -> None:
        if self.bar is not None:
            self.bar.empty()


def filled_columns(frame: Any, columns: list[str]) -> list[str]:
    """Those of ``columns`` that ``frame`` has and that hold a value in at least one row: a table never shows a
    column that is empty for every row (preference columns on heads without distractors, say).

    >>> import pandas as pd
    >>> filled_columns(pd.DataFrame({"score": [0.5], "preference": [None]}), ["score", "preference", "rest"])
    ['score']
    """
    return [c for c in columns if c in frame.columns and bool(frame[c].notna().any())]
