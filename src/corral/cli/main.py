"""The ``corral`` command: one Typer app, one module per verb group."""

from __future__ import annotations

import inspect
import sys
import weakref
from collections.abc import Sequence
from typing import Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.text import Text
from typer._click import Command
from typer.core import TyperGroup

from corral.errors import CorralError

_plain: weakref.WeakSet[Command] = weakref.WeakSet()


def plain_help(text: str) -> str:
    """``text`` (a docstring or a ``help=``) as typer's rich help should render it.

    Help is written as plain text: a ``[host:rank]`` in it is literal, never rich
    markup, so it is escaped. Source lines are wrapped for the editor, not the
    terminal: the lines of each paragraph (paragraphs are separated by a blank
    line) are joined with single spaces so that only the terminal wraps them.
    A paragraph starting with ``\b`` keeps its lines; anything after ``\f``
    is not shown (both as in click).
    """
    visible = inspect.cleandoc(text).partition("\f")[0]
    paragraphs = [p if p.startswith("\b") else " ".join(p.split()) for p in visible.split("\n\n")]
    return escape("\n\n".join(p for p in paragraphs if p.strip()))


def plain_help_tree(command: Command) -> None:
    """Apply :func:`plain_help` to a command, its parameters and its subcommands, once."""
    if command in _plain:
        return
    _plain.add(command)
    for attr in ("help", "short_help", "epilog"):
        value = getattr(command, attr, None)
        if isinstance(value, str) and value:
            setattr(command, attr, plain_help(value))
    for param in command.params:
        # Options and arguments have a help; click's Parameter type does not declare one.
        value = getattr(param, "help", None)
        if isinstance(value, str) and value:
            setattr(param, "help", plain_help(value))  # noqa: B010
    for sub in getattr(command, "commands", {}).values():
        plain_help_tree(sub)


class CorralGroup(TyperGroup):
    """The root group: every help text of the tree is made plain before it runs."""

    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        windows_expand_args: bool = True,
        **extra: Any,
    ) -> Any:
        plain_help_tree(self)
        return super().main(
            args=args,
            prog_name=prog_name,
            complete_var=complete_var,
            standalone_mode=standalone_mode,
            windows_expand_args=windows_expand_args,
            **extra,
        )


app = typer.Typer(
    name="corral",
    cls=CorralGroup,
    help="Launch, check, watch and recover distributed training on machines you own.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
)

_state = {"verbose": False, "registered": False}
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
    # never read as markup: messages name things like gpu[01-04] or [host:rank]
    err_console.print(Text("error: ", style="bold red") + Text(str(exc)), soft_wrap=True)
    if verbose():
        for line in exc.details():
            err_console.print(f"  {line}", markup=False, soft_wrap=True)


def _register() -> None:
    """Add every verb to ``app`` (once, however often it is called)."""
    if _state["registered"]:
        return
    _state["registered"] = True
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
