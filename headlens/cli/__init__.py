"""The ``headlens`` command: a thin typer layer over the library.

Each area registers its commands from its own module in this package so the command
line stays one file of wiring. Every ``HeadlensError`` becomes one line on stderr and
its class's exit code (see ``headlens.errors``), never a traceback.

Exit codes: 0 ok; 1 generic headlens error; 2 bad config or usage; 3 checkpoint;
4 model reference; 5 probe / prompts; 6 detector; 7 output path; 8 doctor found a problem;
9 doctor inconclusive (no evaluation source separates the head layouts; never a pass).
``headlens circuit``: 2 for a bad sender, receiver, input or method, 5 for a metric the model
cannot take (next-token metrics on an encoder).
"""

from __future__ import annotations

import importlib
import os
import sys
import warnings

import typer

from headlens.errors import HeadlensError

app = typer.Typer(
    name="headlens",
    help="Find out what every attention head of a transformer does.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)



@app.callback()
def _root() -> None:
    """Find out what every attention head of a transformer does.

    Exit codes: 0 ok; 1 generic headlens error; 2 bad config or usage; 3 checkpoint; 4 model reference;
    5 probe / prompts; 6 detector; 7 output path; 8 doctor found a problem; 9 doctor inconclusive
    (no evaluation source separates the head layouts; never a pass).
    """


# modules that each define register(app); missing ones are skipped so areas can land independently
_COMMAND_MODULES = [
    "headlens.cli.models",
    "headlens.cli.train",
    "headlens.cli.classify",
    "headlens.cli.ablate",
    "headlens.cli.circuit",
    "headlens.cli.dashboard",
    "headlens.cli.doctor",
    "headlens.cli.export",
    "headlens.cli.trajectory",
]

for _name in _COMMAND_MODULES:
    try:
        _module = importlib.import_module(_name)
    except ModuleNotFoundError as _err:
        if _err.name != _name:
            raise
        continue
    _module.register(app)


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    if os.environ.get("RANK", "0") not in ("", "0"):  # under torchrun only rank 0 talks to the user
        return
    print(f"headlens: warning: {message}", file=sys.stderr)


def main() -> None:
    """Console-script entry point: warnings as one line each, HeadlensError as one line + exit code."""
    warnings.showwarning = _show_warning
    try:
        app()
    except HeadlensError as err:
        from headlens.cli.failure import fail

        sys.exit(fail(err).exit_code)
    except KeyboardInterrupt:
        print("headlens: interrupted", file=sys.stderr)
        sys.exit(130)


if __name__ == "__main__":
    main()
