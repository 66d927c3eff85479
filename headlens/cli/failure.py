"""How a command ends on a ``HeadlensError``: one line on stderr, then its class's exit code.

Under torchrun every rank shares stderr and the launcher ends the other workers as soon as one
exits, so the line goes out in one write (two ranks' lines never interleave) and a rank waits
briefly for its peers before exiting (each prints the shared error).
"""

from __future__ import annotations

import os
import sys

import typer

from headlens.errors import HeadlensError


def say(line: str) -> None:
    """Write ``line`` and its newline to stderr in one ``write``."""
    sys.stderr.flush()
    try:
        os.write(sys.stderr.fileno(), f"{line}\n".encode(errors="replace"))
    except (AttributeError, OSError, ValueError):  # a captured stream (tests) has no file descriptor
        print(line, file=sys.stderr, flush=True)


def fail(err: HeadlensError) -> typer.Exit:
    """Report ``err`` as ``headlens: error: ...`` and return the ``typer.Exit`` to raise."""
    from headlens.scoring.distributed import settle_before_exit

    say(f"headlens: error: {err}")
    settle_before_exit()
    return typer.Exit(err.exit_code)
