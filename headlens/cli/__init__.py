"""The ``headlens`` command: a thin typer layer over the library.

Each area registers its commands from its own module in this package so the command
line stays one file of wiring. Every ``HeadlensError`` becomes one line on stderr and
its class's exit code (see ``headlens.errors``), never a traceback.

Exit codes (``headlens.cli.options.EXIT_CODES``, printed at the end of every ``--help``): 0 ok;
1 generic headlens error; 2 bad option value or usage; 3 checkpoint; 4 model reference; 5 probe /
prompts; 6 detector; 7 output path; 8 doctor found a problem; 9 doctor inconclusive (no
evaluation source separates the head layouts; never a pass); 10 circuit's run-time check failed; 130 interrupted.
``headlens circuit``: 2 for a bad sender, receiver, input or method, 5 for a metric the model
cannot take (next-token metrics on an encoder).
"""

from __future__ import annotations

import importlib
import os
import sys
import warnings
from typing import Any

import typer
from typer.core import TyperGroup

from headlens.cli.options import EXIT_CODES_HELP
from headlens.errors import HeadlensError


class _Group(TyperGroup):
    """The root group: when ``--help`` is among the arguments, write the registries' choices into the help
    first (:func:`headlens.cli.options.fill_help`; only then, because the registries import torch)."""

    def invoke(self, ctx: Any) -> Any:
        rest = [*getattr(ctx, "_protected_args", getattr(ctx, "protected_args", [])), *ctx.args]
        if any(a in ("--help", "-h") for a in rest):
            from headlens.cli.options import fill_help

            fill_help(self)
        return super().invoke(ctx)

    def main(self, args: Any = None, prog_name: Any = None, complete_var: Any = None, standalone_mode: bool = True,
             **extra: Any) -> Any:
        """Click's usage errors (unknown option, bad value) and any ``HeadlensError`` a command lets through
        end as one line on stderr and their exit code (2 for usage), never a box or a traceback."""
        from headlens.cli.failure import fail, say

        click = _click_exceptions()
        try:
            rv = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except click.NoArgsIsHelpError as err:  # `headlens` alone: its help was printed as the error was made
            code = err.exit_code
        except click.UsageError as err:
            where = f"{err.ctx.command_path} --help" if err.ctx is not None else "headlens --help"
            say(f"headlens: error: {_one_line(err.format_message())} (see '{where}')")
            code = err.exit_code
        except click.ClickException as err:
            say(f"headlens: error: {_one_line(err.format_message())}")
            code = err.exit_code
        except typer.Abort:
            say("headlens: interrupted")
            code = 130
        except HeadlensError as err:
            code = fail(err).exit_code
        else:
            code = rv if isinstance(rv, int) else 0
            if code == 130:  # typer turns Ctrl+C into Exit(130)
                say("headlens: interrupted")
        if not standalone_mode:
            return code
        sys.exit(code)


def _click_exceptions() -> Any:
    """The click exceptions typer raises (typer >= 0.2x vendors click as ``typer._click``)."""
    try:
        from typer._click import exceptions
    except ImportError:  # typer that uses the installed click
        from click import exceptions
    return exceptions


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


app = typer.Typer(
    name="headlens",
    cls=_Group,
    help="Find out what every attention head of a transformer does.",
    epilog=EXIT_CODES_HELP,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


def _version(value: bool) -> None:
    if value:
        from headlens import __version__

        typer.echo(f"headlens {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                 help="Print the version and exit."),
) -> None:
    """Find out what every attention head of a transformer does."""


# modules that each define register(app); missing ones are skipped so areas can land independently
_COMMAND_MODULES = [
    "headlens.cli.models",
    "headlens.cli.detectors",
    "headlens.cli.train",
    "headlens.cli.classify",
    "headlens.cli.ablate",
    "headlens.cli.circuit",
    "headlens.cli.attribute",
    "headlens.cli.dashboard",
    "headlens.cli.doctor",
    "headlens.cli.export",
    "headlens.cli.trajectory",
    "headlens.cli.atlas",
]

for _name in _COMMAND_MODULES:
    try:
        _module = importlib.import_module(_name)
    except ModuleNotFoundError as _err:
        if _err.name != _name:
            raise
        continue
    _module.register(app)
for _command in app.registered_commands:  # every command's --help ends with the exit codes
    _command.epilog = _command.epilog or EXIT_CODES_HELP


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
