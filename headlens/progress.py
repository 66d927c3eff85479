"""Progress: how long work says how far it is, and the one way it is put into words.

Work reports ``(done, total, what)``. Loops that take a ``progress`` callback (``classify``, the atlas pass,
circuit discovery) call it; work deeper down, behind a signature that has no room for one (a weight
detector ranking the vocabulary layer by layer, a gate's forward passes, loading a model), calls
:func:`report`, which reaches the callback the caller installed with :func:`reporting` and does nothing
without one. Whoever shows progress words it with :func:`status`, so a terminal, a log, the dashboard and a
notebook all say the same thing::

    scanning coreference: 64/320 (20 %), 32 s elapsed, about 1 min 15 s left

Why it looks like this:

* **Phases have names.** A stage that is not a count of prompts (ranking the vocabulary, a gate's forward
  passes) reports under its own name and its own total, so a bar never sits at "320/320" while other work
  runs; a new name or total starts a new phase, with its own time left.
* **Elapsed and left are labelled.** "0:00:32 left 0:01:15" reads as "32 s left"; the words say which is which.
* **The time left is a straight line** through the phase so far (:func:`time_left`), in words
  (:func:`duration`): crude, but never a promise the pace so far does not support.
* **A context variable, not a global**: a sink installed by one thread (a dashboard session) is not heard
  by another, and it is removed when its ``with`` block ends, also on an error.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

Sink = Callable[[int, int, str], None]  # (done, total, what is running)

_SINK: ContextVar[Sink | None] = ContextVar("headlens_progress_sink", default=None)
_PHASE: ContextVar[str] = ContextVar("headlens_progress_phase", default="")


@contextmanager
def reporting(sink: Sink | None) -> Iterator[None]:
    """Send what :func:`report` hears inside the block to ``sink(done, total, what)`` (None: keep the current one).

    >>> heard = []
    >>> with reporting(lambda *a: heard.append(a)), phase("weights copying"):
    ...     report(3, 30, "ranking the vocabulary")
    >>> heard
    [(3, 30, 'weights copying: ranking the vocabulary')]
    """
    if sink is None:
        yield
        return
    token = _SINK.set(sink)
    try:
        yield
    finally:
        _SINK.reset(token)


@contextmanager
def phase(name: str) -> Iterator[None]:
    """Name the work inside the block: what :func:`report` says is prefixed with ``name`` (nested names join)."""
    outer = _PHASE.get()
    token = _PHASE.set(f"{outer}: {name}" if outer else name)
    try:
        yield
    finally:
        _PHASE.reset(token)


def report(done: int, total: int, what: str = "") -> None:
    """Tell the installed sink (if any) that ``done`` of ``total`` units of ``what`` are done."""
    sink = _SINK.get()
    if sink is None:
        return
    name = _PHASE.get()
    sink(int(done), int(total), f"{name}: {what}" if name and what else (name or what))


def listening() -> bool:
    """Whether a sink is installed (work may skip counting what nobody hears)."""
    return _SINK.get() is not None


class Pace:
    """The current phase's pace, for its time left: measured from the phase's start (a count that goes back, to 0:
    then; above 0: the last report before it), from the last report when the count goes on to a new total, and
    from the first report of all (loading before it is no measure of the pace).

    >>> pace = Pace()
    >>> pace.update(10.0, 32, 320), pace.update(20.0, 64, 320), pace.left(20.0)
    (False, False, 80.0)
    >>> pace.update(30.0, 0, 30), pace.update(33.0, 3, 30), pace.left(33.0)
    (True, False, 27.0)
    """

    def __init__(self) -> None:
        self.origin: tuple[float, int] | None = None  # (time, done) the pace is measured from
        self.seen: tuple[int, int | None] | None = None  # (done, total) of the last report
        self.last = 0.0  # when the last report came

    def update(self, now: float, done: int, total: int | None) -> bool:
        """Record a report; True when it starts a new phase (its count went back)."""
        new = self.seen is not None and done < self.seen[0]
        if self.seen is None:
            self.origin = (now, done)
        elif new:
            self.origin = (now if done == 0 else self.last, 0)
        elif total is not None and self.seen[1] is not None and total != self.seen[1]:
            self.origin = (self.last, self.seen[0])
        self.seen, self.last = (done, total if total is not None else self.seen and self.seen[1]), now
        return new

    def left(self, now: float) -> float | None:
        """Seconds still to go at the phase's pace (:func:`time_left`); None when unknown."""
        if self.origin is None or self.seen is None:
            return None
        (t0, d0), (done, total) = self.origin, self.seen
        return time_left(now - t0, done - d0, None if not total else total - d0)


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
    """``42 s``, ``2 min 48 s``, ``1 h 05 min``: a time, as precise as it deserves.

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


def times(elapsed: float, left: float | None, at_most: bool = False) -> str:
    """``32 s elapsed, about 1 min 15 s left``: both times, each labelled (the second only when known);
    ``at_most`` when the total is an upper bound (the doctor's layouts stop early), so the time left is one too.

    >>> times(32, 75), times(4, None), times(3, 30, at_most=True)
    ('32 s elapsed, about 1 min 15 s left', '4 s elapsed', '3 s elapsed, at most 30 s left')
    """
    return f"{duration(elapsed)} elapsed" + ("" if left is None else
                                             f", {'at most' if at_most else 'about'} {duration(left)} left")


def status(what: str, done: int, total: int | None, elapsed: float, left: float | None = None, extra: str = "",
           at_most: bool = False) -> str:
    """One progress line: the phase, the count and fraction done, the time elapsed and the time left.

    ``elapsed`` is the whole run's, ``left`` the current phase's estimate (:func:`time_left`; None: unknown, not
    shown; ``at_most``: an upper bound); ``extra`` goes after the count (``loss 2.1034``).

    >>> status("scanning coreference", 64, 320, 32.0, time_left(18.75, 64, 320))
    'scanning coreference: 64/320 (20 %), 32 s elapsed, about 1 min 15 s left'
    >>> status("loading smollm2", 0, None, 12.0)
    'loading smollm2: 12 s elapsed'
    """
    count = f"{done}/{total} ({100 * done / total:.0f} %)" if total else (f"{done}" if done else "")
    said = f"{count}{extra}".strip()
    return f"{what}: {said + ', ' if said else ''}{times(elapsed, left, at_most)}"


class TextSink:
    """A sink that prints :func:`status` lines (to stderr) at most every ``every`` seconds, none for work that ends
    within ``quiet`` seconds, and one when a phase ends: progress in a notebook or a script that passed none.

    >>> import io
    >>> now, out = [0.0], io.StringIO()
    >>> sink = TextSink(stream=out, clock=lambda: now[0])
    >>> for i in range(1, 11):
    ...     now[0] += 1.0
    ...     sink(i, 10, "scanning induction")
    >>> print(out.getvalue().strip())
    headlens: scanning induction: 5/10 (50 %), 5 s elapsed, about 5 s left
    headlens: scanning induction: 10/10 (100 %), 10 s elapsed
    """

    def __init__(self, stream: object = None, clock: Callable[[], float] | None = None, every: float = 5.0,
                 quiet: float = 2.0) -> None:
        import time

        self.stream, self.clock = stream, clock or time.monotonic
        self.every, self.quiet = every, quiet
        self.start = self.last = self.clock()
        self.pace = Pace()

    def __call__(self, done: int, total: int, what: str) -> None:
        import sys

        now = self.clock()
        self.pace.update(now, done, total)
        ends = bool(total) and done >= total
        if now - self.start < self.quiet or (now - self.last < self.every and not ends):
            return
        left = self.pace.left(now)
        print(f"headlens: {status(what, done, total, now - self.start, left)}", file=self.stream or sys.stderr,
              flush=True)
        self.last = now


def in_notebook() -> bool:
    """Whether this runs in a Jupyter kernel (where a library call shows its progress by itself)."""
    import sys

    shell = getattr(sys.modules.get("IPython"), "get_ipython", lambda: None)()
    return type(shell).__name__ == "ZMQInteractiveShell"


def default_sink() -> Sink | None:
    """The progress a library call shows when given none: text lines in a notebook, nothing elsewhere (a script
    or a test stays quiet; the command line brings its own bar)."""
    return TextSink() if in_notebook() else None
