"""Progress for every long command (train, classify, ablate, attribute, circuit, trajectory), on a terminal
and in a log: the fraction done and an estimate of the time left.

On a terminal: a rich bar that redraws itself. Elsewhere (``> log 2>&1``, CI, a job scheduler) a bar
would print nothing useful, so :class:`LineProgress` writes one plain line to stderr whenever ~10 s have
passed or another 10 % is done, and one at the end; work that ends within 2 s prints none::

    headlens: train induction-2l: 500/2500 (20 %) loss 2.1034 31,204 tok/s, 42 s, ~2 min 48 s left

The time left is the elapsed time scaled by the fraction still to do (a straight line through the work so
far); a stage whose total is not known yet prints its count and elapsed time only.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TextIO

EVERY_S = 10.0  # a line at least this often while work goes on ...
EVERY_FRACTION = 0.1  # ... and whenever another 10 % is done
QUIET_START_S = 2.0  # work done sooner than this prints no progress at all (a short run's log stays clean)


class LineProgress:
    """Plain progress lines for a stream that is not a terminal.

    Args:
        description: what is running (``"train induction-2l"``).
        stream: where the lines go (stderr).
        clock: seconds, monotonic (injected by tests).
        fields: how to show extra values, ``{"loss": "loss {:.4f}"}``.
    """

    def __init__(self, description: str, stream: TextIO | None = None, clock: Callable[[], float] = time.monotonic,
                 fields: dict[str, str] | None = None) -> None:
        self.description, self.stream, self.clock = description, stream or sys.stderr, clock
        self.fields = fields or {}
        self.start = self.last_time = self.stage_start = self.last_update = clock()
        self.last_fraction = 0.0
        self.done, self.total, self.values = 0, None, {}
        self.lines = 0

    def update(self, done: int, total: int | None = None, description: str | None = None, **values: Any) -> None:
        """Record progress; write a line when ~10 s or another 10 % have passed since the last one. A count that
        goes back or a new total starts a new stage (its own 10 % grid and time left)."""
        now = self.clock()
        if done < self.done or (total is not None and self.total is not None and total != self.total):
            # the stage began when it said so (done 0), else when the last one was last heard of
            self.stage_start, self.last_fraction = (now if done == 0 else self.last_update), 0.0
        self.last_update = now
        self.done, self.total = done, total if total is not None else self.total
        self.values.update(values)
        if description:
            self.description = description
        fraction = done / self.total if self.total else 0.0
        if now - self.start < QUIET_START_S:
            return
        if now - self.last_time >= EVERY_S or (self.total and fraction - self.last_fraction >= EVERY_FRACTION - 1e-9):
            self._line(now)
            self.last_fraction = math.floor(fraction / EVERY_FRACTION + 1e-9) * EVERY_FRACTION  # on the 10 % grid

    def finish(self) -> None:
        """The final line (unless the last one already said 100 %, or the work took under ``QUIET_START_S``)."""
        now = self.clock()
        if self.done and now - self.start >= QUIET_START_S and not (self.total and self.last_fraction >= 1 - 1e-9):
            self._line(now)

    def _line(self, now: float) -> None:
        count = f"{self.done}/{self.total} ({100 * self.done / self.total:.0f} %)" if self.total else f"{self.done}"
        extra = "".join(f" {fmt.format(self.values[k])}" for k, fmt in self.fields.items()
                        if self.values.get(k) == self.values.get(k) and k in self.values)  # NaN: not yet
        left = time_left(now - self.stage_start, self.done, self.total)
        self.stream.write(f"headlens: {self.description}: {count}{extra}, {now - self.start:.0f} s"
                          f"{'' if left is None else f', ~{duration(left)} left'}\n")
        self.stream.flush()
        self.last_time = now
        self.lines += 1


def time_left(elapsed: float, done: int, total: int | None) -> float | None:
    """Seconds still to go at the pace so far; None before any work is done, when it is all done, or without a
    total.

    >>> time_left(30.0, 25, 100), time_left(30.0, 0, 100), time_left(30.0, 5, None)
    (90.0, None, None)
    """
    if not total or done <= 0 or done >= total:
        return None
    return elapsed * (total - done) / done


def duration(seconds: float) -> str:
    """``42 s``, ``2 min 48 s``, ``1 h 05 min``: a time left, as precise as it deserves.

    >>> duration(0.2), duration(42.4), duration(168), duration(3900)
    ('<1 s', '42 s', '2 min 48 s', '1 h 05 min')
    """
    s = round(seconds)
    if s < 1:
        return "<1 s"
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


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


@contextmanager
def progress(description: str, total: int | None = None, quiet: bool = False,
             fields: dict[str, str] | None = None, columns: tuple[Any, ...] = ()) -> Iterator[Any]:
    """Yield an object with ``update(done, total=None, description=None, **values)``.

    A rich bar on a terminal (``columns``: its rich columns; ``values`` are its task fields), plain
    lines every ~10 s or 10 % elsewhere (``fields``: how each value is printed), nothing when ``quiet``.
    """
    if quiet:
        yield _Silent()
        return
    if not is_terminal():
        line = LineProgress(description, fields=fields)
        line.total = total
        yield line  # on an error, no final line: the error is the last word
        line.finish()
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    columns = columns or (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                          TextColumn("left"), TimeRemainingColumn())
    with Progress(*columns, console=Console(stderr=True), transient=True) as bar:
        start = {k: float("nan") for k in (fields or {})}
        yield _Bar(bar, bar.add_task(description, total=total, **start))
