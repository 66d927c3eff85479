"""Progress for every long command (train, classify, ablate, attribute, circuit, trajectory, doctor, atlas), on a
terminal and in a log: the phase, the fraction done, the time elapsed and the time left, each labelled.

On a terminal: a rich bar that redraws itself. Elsewhere (``> log 2>&1``, CI, a job scheduler, a notebook's
stderr) a bar would print nothing useful, so :class:`LineProgress` writes one plain line to stderr whenever
~8 s have passed or another 10 % is done, and one at the end; work that ends within 2 s prints none::

    headlens: train induction-2l: 500/2500 (20 %) loss 2.1034 31,204 tok/s, 42 s elapsed, about 2 min 48 s left

A heartbeat repeats the last line when the work has been silent for ~8 s (a model loading, one long step),
so a log never goes quiet for more than ~10 s while a command runs. The words are :func:`headlens.progress.status`'s,
the same the dashboard shows; the time left is a straight line through the current phase so far.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TextIO

from headlens.progress import Pace, duration, status, time_left, times

__all__ = ["LineProgress", "default_columns", "duration", "is_terminal", "progress", "time_left", "times_column"]

EVERY_S = 8.0  # a line at least this often while work goes on (the heartbeat keeps it when the work is silent) ...
EVERY_FRACTION = 0.1  # ... and whenever another 10 % is done
QUIET_START_S = 2.0  # work done sooner than this prints no progress at all (a short run's log stays clean)
FIRST_S = 4.0  # the heartbeat's first line comes this soon: with the Python start-up before it, a model that is
#                still loading says so within 10 s
BEAT_S = 0.5  # how often the heartbeat looks at the clock


class LineProgress:
    """Plain progress lines for a stream that is not a terminal.

    Args:
        description: what is running (``"train induction-2l"``).
        stream: where the lines go (stderr).
        clock: seconds, monotonic (injected by tests).
        fields: how to show extra values, ``{"loss": "loss {:.4f}"}``.
        at_most: the totals are upper bounds, so is the time left ("at most 30 s left").
    """

    def __init__(self, description: str, stream: TextIO | None = None, clock: Callable[[], float] = time.monotonic,
                 fields: dict[str, str] | None = None, at_most: bool = False) -> None:
        self.description, self.stream, self.clock = description, stream or sys.stderr, clock
        self.at_most = at_most
        self.fields = fields or {}
        self.start = self.last_time = clock()
        self.pace = Pace()  # the current phase's, for its time left
        self.last_fraction = 0.0
        self.done, self.total, self.values = 0, None, {}
        self.lines = 0
        self.lock = threading.RLock()
        self._stop: threading.Event | None = None

    def update(self, done: int, total: int | None = None, description: str | None = None, **values: Any) -> None:
        """Record progress; write a line when ~8 s or another 10 % have passed since the last one. A count that
        goes back or a new total starts a new phase (its own 10 % grid and time left)."""
        with self.lock:
            now = self.clock()
            if self.pace.update(now, done, total) or (total is not None and self.total is not None
                                                      and total != self.total):
                self.last_fraction = 0.0  # a new phase, or a new total: its own 10 % grid
            self.done, self.total = done, total if total is not None else self.total
            self.values.update(values)
            if description:
                self.description = description
            fraction = done / self.total if self.total else 0.0
            if now - self.start < QUIET_START_S:
                return
            if now - self.last_time >= EVERY_S or (self.total and fraction - self.last_fraction >= EVERY_FRACTION - 1e-9):
                self._line(now)
                self.last_fraction = int(fraction / EVERY_FRACTION + 1e-9) * EVERY_FRACTION  # on the 10 % grid

    def beat(self) -> None:
        """The heartbeat: repeat the state when nothing was written for ``EVERY_S`` (past the quiet start)."""
        with self.lock:
            now = self.clock()
            if now - self.start >= max(QUIET_START_S, FIRST_S if not self.lines else 0) and (
                    self.lines == 0 or now - self.last_time >= EVERY_S):
                self._line(now)

    def start_heartbeat(self) -> None:
        """Call :meth:`beat` every ``BEAT_S`` seconds from a daemon thread until :meth:`finish`."""
        self._stop = threading.Event()

        def loop(stop: threading.Event) -> None:
            while not stop.wait(BEAT_S):
                self.beat()

        threading.Thread(target=loop, args=(self._stop,), daemon=True, name="headlens-progress").start()

    def stop_heartbeat(self) -> None:
        if self._stop is not None:
            self._stop.set()

    def finish(self) -> None:
        """The final line (unless the last one already said 100 %, or the work took under ``QUIET_START_S``)."""
        self.stop_heartbeat()
        with self.lock:
            now = self.clock()
            if self.done and now - self.start >= QUIET_START_S and not (self.total and self.last_fraction >= 1 - 1e-9):
                self._line(now)

    def _line(self, now: float) -> None:
        extra = "".join(f" {fmt.format(self.values[k])}" for k, fmt in self.fields.items()
                        if self.values.get(k) == self.values.get(k) and k in self.values)  # NaN: not yet
        said = status(self.description, self.done, self.total, now - self.start, self.pace.left(now), extra, self.at_most)
        self.stream.write(f"headlens: {said}\n")
        self.stream.flush()
        self.last_time = now
        self.lines += 1


class _Bar:
    """A rich bar behind the same ``update`` as :class:`LineProgress`."""

    def __init__(self, progress: Any, task: Any) -> None:
        self.progress, self.task = progress, task
        self.done, self.total = 0, None

    def update(self, done: int, total: int | None = None, description: str | None = None, **values: Any) -> None:
        if done < self.done or (total is not None and self.total is not None and total != self.total):
            self.progress.reset(self.task)  # a new stage: its own bar and time left
        self.done, self.total = done, total if total is not None else self.total
        kw: dict[str, Any] = {"completed": done, **values}
        if total is not None:
            kw["total"] = total
        if description:
            kw["description"] = description
        self.progress.update(self.task, **kw)


class _Silent:
    def update(self, *args: Any, **kwargs: Any) -> None:
        pass


def is_terminal(stream: TextIO | None = None) -> bool:
    """Whether ``stream`` (stderr) is an interactive terminal."""
    stream = stream or sys.stderr
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


def times_column(at_most: bool = False) -> Any:
    """A rich column: ``32 s elapsed, about 1 min 15 s left`` for the current phase (:func:`headlens.progress.times`)."""
    from rich.progress import ProgressColumn
    from rich.text import Text

    class TimesColumn(ProgressColumn):
        max_refresh = 0.5

        def render(self, task: Any) -> Any:
            elapsed = (task.finished_time if task.finished else task.elapsed) or 0.0
            left = time_left(elapsed, int(task.completed), task.total)
            return Text(times(elapsed, left, at_most), style="progress.elapsed")

    return TimesColumn()


def default_columns(at_most: bool = False) -> tuple[Any, ...]:
    """The bar's columns: the phase, the bar, ``done/total``, the labelled times (:func:`times_column`)."""
    from rich.progress import BarColumn, MofNCompleteColumn, TextColumn

    return TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), times_column(at_most)


@contextmanager
def progress(description: str, total: int | None = None, quiet: bool = False,
             fields: dict[str, str] | None = None, columns: tuple[Any, ...] = (),
             heartbeat: bool = True, at_most: bool = False) -> Iterator[Any]:
    """Yield an object with ``update(done, total=None, description=None, **values)``.

    A rich bar on a terminal (``columns``: its rich columns, default :func:`default_columns`; ``values`` are its
    task fields), plain lines every ~8 s or 10 % elsewhere (``fields``: how each value is printed; ``heartbeat``:
    repeat the last line when the work is silent for ~8 s; ``at_most``: totals are upper bounds), nothing when
    ``quiet``. Inside the block,
    :func:`headlens.progress.report` from any depth reaches the same ``update``.
    """
    from headlens.progress import reporting

    if quiet:
        yield _Silent()
        return
    if not is_terminal():
        line = LineProgress(description, fields=fields, at_most=at_most)
        line.total = total
        if heartbeat:
            line.start_heartbeat()
        try:
            with reporting(lambda done, total, what: line.update(done, total, what)):
                yield line  # on an error, no final line: the error is the last word
        finally:
            line.stop_heartbeat()
        line.finish()
        return
    from rich.console import Console
    from rich.progress import Progress

    with Progress(*(columns or default_columns(at_most)), console=Console(stderr=True), transient=True) as bar:
        start = {k: float("nan") for k in (fields or {})}
        handle = _Bar(bar, bar.add_task(description, total=total, **start))
        with reporting(lambda done, total, what: handle.update(done, total, what)):
            yield handle
