"""The ``corral`` command: one Typer app, one module per verb group."""

from __future__ import annotations

import sys

import typer
from rich.console import Console

from corral.errors import CorralError

app = typer.Typer(
    name="corral",
    help="Launch, check, watch and recover distributed training on machines you own.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

_state = {"verbose": False}
err_console = Console(stderr=True, highlight=False)


@app.callback()
def _root(
    verbose: bool = typer.Option(False, "-v", "--verbose", help="Show details and tracebacks."),
) -> None:
    _state["verbose"] = verbose


def verbose() -> bool:
    """Whether ``-v`` was given."""
    return _state["verbose"]


def report_error(exc: CorralError) -> None:
    """Print an expected error as one red line (details with ``-v``)."""
    err_console.print(f"[bold red]error:[/] {exc}", markup=True, soft_wrap=True)
    if verbose():
        for line in exc.details():
            err_console.print(f"  {line}", markup=False, soft_wrap=True)


def _register() -> None:
    # Imported here so each verb module can import ``app`` helpers from this one.
    from corral.cli import register_all

    register_all(app)


def main() -> None:
    """Console-script entry point: run the app, turning CorralError into one line."""
    _register()
    try:
        app()  # standalone: click reports usage errors and exits with typer.Exit's code
    except CorralError as exc:
        if verbose():
            import traceback

            traceback.print_exc()
        report_error(exc)
        sys.exit(2)
