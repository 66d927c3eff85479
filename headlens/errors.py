"""One exception family for everything headlens refuses to do.

Callers catch ``HeadlensError``; the subclasses exist where a caller branches
(the CLI maps each one to its own exit code). Messages quote the bad value and
say what was expected, einops-style.
"""

from __future__ import annotations


class HeadlensError(Exception):
    """Base class of every error headlens raises on purpose."""

    exit_code = 1


class ConfigError(HeadlensError, ValueError):
    """A model or run configuration is inconsistent (e.g. d_model % n_heads != 0)."""

    exit_code = 2


class CheckpointError(HeadlensError):
    """A checkpoint is missing, corrupt, or does not match the configuration asked for."""

    exit_code = 3


class ModelReferenceError(HeadlensError):
    """A model reference (zoo name, path, ``hf:<dir>``, ``minilm``) cannot be resolved."""

    exit_code = 4


class ProbeError(HeadlensError, ValueError):
    """Probe inputs are unusable: empty prompts, untokenizable text, no target positions."""

    exit_code = 5


class DetectorError(HeadlensError, KeyError):
    """An unknown detector name, or a detector the model cannot support."""

    exit_code = 6

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


class OutputError(HeadlensError):
    """An output path cannot be written (unwritable folder, unknown suffix)."""

    exit_code = 7


def did_you_mean(value: object, choices: object) -> str:
    """``"; did you mean 'x'?"`` naming the valid names closest to a mistyped ``value``, or ``""``.

    Every "unknown name" message ends with it (detectors, models, methods, metrics, options' choices).

    >>> did_you_mean("inducton", ["induction", "previous_token"])
    "; did you mean 'induction'?"
    >>> did_you_mean("zzz", ["induction"])
    ''
    """
    import difflib

    names = [str(c) for c in choices]  # type: ignore[attr-defined]
    text = str(value)
    close = difflib.get_close_matches(text, names, n=3, cutoff=0.6)
    if not close:  # case and separators: 'Induction-2L', 'previous-token'
        folded = {n.lower().replace("-", "_"): n for n in names}
        close = [folded[m] for m in difflib.get_close_matches(text.lower().replace("-", "_"), list(folded), n=3,
                                                              cutoff=0.6)]
    if not close:
        return ""
    return "; did you mean " + " or ".join(repr(c) for c in close) + "?"


class MemoryLimitError(HeadlensError):
    """The model will not fit in the memory available (said before any weight is read)."""

    exit_code = 10


def user_stacklevel() -> int:
    """The ``stacklevel`` that points a warning raised by the caller at the first frame outside headlens: the
    user's notebook cell or script, not ``models/loading.py`` (Python 3.12's ``skip_file_prefixes``, by hand).

    >>> import warnings
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     warnings.warn("x", stacklevel=user_stacklevel())
    >>> caught[0].filename.startswith("<doctest")  # this line, not errors.py
    True
    """
    import os
    import sys

    package = os.path.dirname(os.path.abspath(__file__)) + os.sep
    frame, level = sys._getframe(1), 1
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(package):
        frame, level = frame.f_back, level + 1
    return level
