"""The ``corral`` command: one Typer app, one module per verb group.

Verbs are registered lazily: the root group knows every verb by name and summary
(:data:`corral.cli.VERBS`) and imports a verb's module only when that verb is
invoked, so ``corral --version`` and ``corral --help`` stay fast. :func:`_register`
adds every verb at once (for tools and tests that walk the whole tree).
"""

from __future__ import annotations

import copy
import importlib
import inspect
import sys
import weakref
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import typer
from rich.markup import escape
from rich.text import Text
from typer._click import ClickException, Command, Context
from typer._click.core import ParameterSource
from typer._click.exceptions import (
    BadParameter,
    MissingParameter,
    NoArgsIsHelpError,
    NoSuchOption,
    UsageError,
)
from typer.core import TyperArgument, TyperCommand, TyperGroup, TyperOption

from corral import __version__
from corral.cli import VERBS, coerce
from corral.console import make_console
from corral.errors import CorralError

_prepared: weakref.WeakSet[Command] = weakref.WeakSet()


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


class WordArgument(TyperArgument):
    """An argument shown by its metavar alone: no ``<type>`` column, and the metavar
    (e.g. ``-- SCRIPT [ARGS]...``, see :func:`default_argument_metavar`) is the usage
    line's text as written."""

    def display_type_rich(self, ctx: Context) -> str | None:
        return None

    def _usage_display_name(self) -> str:
        return self.metavar if self.metavar is not None else super()._usage_display_name()


def default_argument_metavar(argument: TyperArgument) -> str:
    """How an argument that declares no metavar is written: its name in capitals,
    ``...`` when it takes several words, in brackets when optional (``[JOB_ID]``)."""
    word = (argument.name or "arg").upper() + ("..." if argument.nargs != 1 else "")
    return word if argument.required else f"[{word}]"


def default_metavar(option: TyperOption) -> str:
    """The word shown after an option that declares no metavar: nothing for a flag,
    ``N`` / ``NUMBER`` for numbers, else the last word of its long name (``DIR``)."""
    if option.is_flag:
        return ""
    annotation = option.type_descriptor.annotation
    if annotation is int:
        return "N"
    if annotation is float:
        return "NUMBER"
    longest = max(option.opts, key=len)
    return longest.lstrip("-").rsplit("-", 1)[-1].upper()


def _plain_texts(command: Command) -> None:
    """Apply :func:`plain_help` to a command's and its parameters' help."""
    for attr in ("help", "short_help", "epilog"):
        value = getattr(command, attr, None)
        if isinstance(value, str) and value:
            setattr(command, attr, plain_help(value))
    for param in command.params:
        # Options and arguments have a help; click's Parameter type does not declare one.
        value = getattr(param, "help", None)
        if isinstance(value, str) and value:
            setattr(param, "help", plain_help(value))  # noqa: B010


def _set_verbose(ctx: Context, param: object, value: bool) -> None:
    """``-v`` after a verb: the same as before it."""
    if value:
        _state["verbose"] = True


def _verbose_option(root: Command) -> TyperOption:
    return next(p for p in root.params if isinstance(p, TyperOption) and p.name == "verbose")


def prepare_tree(root: Command) -> None:
    """Make the command tree read as corral's, once per command.

    Help texts become plain (:func:`plain_help`); every option shows a word for
    its value (a flag none, see :func:`default_metavar`) and every argument its
    name only (:class:`WordArgument`); plain values are coerced without a pydantic
    adapter per option (:mod:`corral.cli.coerce`); every command below the root
    also takes the root's ``-v/--verbose``.
    """
    _prepare(root, None, _verbose_option(root))


def _prepare(command: Command, parent: Context | None, verbose: TyperOption) -> None:
    if command in _prepared:
        return
    _prepared.add(command)
    ctx = Context(command, parent=parent, info_name=command.name)
    _plain_texts(command)
    if parent is not None:
        extra = copy.copy(verbose)  # the root's flag and help, recorded by a callback
        extra.expose_value = False
        extra.callback = _set_verbose
        command.params.append(extra)
    for param in command.get_params(ctx):  # --help included
        coerce.install(param)
        if isinstance(param, TyperOption) and (param.is_flag or param.metavar is None):
            param.metavar = default_metavar(param)
        elif isinstance(param, TyperArgument) and not isinstance(param, WordArgument):
            if param.metavar is None:
                param.metavar = default_argument_metavar(param)
            param.__class__ = WordArgument
    for sub in getattr(command, "commands", {}).values():
        _prepare(sub, ctx, verbose)


def _param_name(exc: BadParameter) -> str | None:
    """How the user gave the parameter of ``exc``: ``--opt``, ``SCRIPT`` or ``ENV_VAR``."""
    param = exc.param
    if param is None:
        return None
    ctx = exc.ctx
    if (
        ctx is not None
        and param.name is not None
        and isinstance(param.envvar, str)
        and ctx.get_parameter_source(param.name) is ParameterSource.ENVIRONMENT
    ):
        return f"{param.envvar} (--{param.name.replace('_', '-')})"
    if isinstance(param, TyperOption):
        return max(param.opts, key=len)
    return (param.metavar or (param.name or "").upper()).strip("[]").removeprefix("-- ")


def _sentence(message: str) -> str:
    """``message`` as the tail of an ``error:`` line: lower-case start, no final dot."""
    message = " ".join(message.split()).rstrip(".")
    return message[:1].lower() + message[1:]


def usage_error_line(exc: ClickException) -> str:
    """The one line (after ``error: ``) for a usage error or other click error."""
    if isinstance(exc, NoSuchOption):
        line = f"{exc.option_name}: no such option"
        if exc.possibilities:
            line += f" (did you mean {' or '.join(sorted(exc.possibilities))}?)"
        return line
    if isinstance(exc, MissingParameter):
        name = _param_name(exc)
        kind = exc.param_type or (exc.param.param_type_name if exc.param else "parameter")
        return f"missing {kind} {name}" if name else _sentence(exc.format_message())
    if isinstance(exc, BadParameter):
        name = _param_name(exc)
        reason = _sentence(exc.message)
        return f"{name}: invalid value: {reason}" if name else f"invalid value: {reason}"
    return _sentence(exc.format_message())


def report_usage_error(exc: ClickException) -> None:
    """Print a click error as one ``error:`` line and where to read the usage."""
    console = make_console()
    console.print(Text("error: ", style="bold red") + Text(usage_error_line(exc)), soft_wrap=True)
    ctx = exc.ctx if isinstance(exc, UsageError) else None
    if ctx is not None:
        console.print(f"(see {ctx.command_path} --help)", style="dim", markup=False)


@contextmanager
def _one_line_usage_errors() -> Iterator[None]:
    """Report click errors as :func:`report_usage_error` does, with their exit code."""
    try:
        yield
    except NoArgsIsHelpError:
        raise  # `corral` alone: the help, as click shows it
    except ClickException as exc:
        report_usage_error(exc)
        raise typer.Exit(exc.exit_code) from exc


class VerbPlaceholder(TyperCommand):
    """A verb whose module is not imported yet: its name and summary, for the root's
    help; the root group replaces it by the real command before it runs."""


def load_verbs(module: str) -> dict[str, Command]:
    """The commands (and groups) that ``corral.cli.<module>`` registers, by name."""
    holder = typer.Typer()
    importlib.import_module(f"corral.cli.{module}").register(holder)
    return dict(typer.main.get_group(holder).commands)


class CorralGroup(TyperGroup):
    """The root group: every verb of :data:`~corral.cli.VERBS` not registered yet is a
    :class:`VerbPlaceholder`, loaded when it is invoked; the tree is prepared
    (:func:`prepare_tree`) before it runs, and usage errors come out as one
    ``error:`` line, exit code 2."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for name, verb in VERBS.items():
            if name not in self.commands:
                self.commands[name] = VerbPlaceholder(name=name, help=verb.summary)

    def _load(self, ctx: Context, name: str) -> None:
        """Replace the placeholder of ``name`` (and of the verbs its module adds too)."""
        for verb, command in load_verbs(VERBS[name].module).items():
            if isinstance(self.commands.get(verb), VerbPlaceholder):
                _prepare(command, ctx, _verbose_option(self))
                self.commands[verb] = command

    def resolve_command(
        self, ctx: Context, args: list[str]
    ) -> tuple[str | None, Command | None, list[str]]:
        if args and isinstance(self.commands.get(args[0]), VerbPlaceholder):
            self._load(ctx, args[0])
        return super().resolve_command(ctx, args)

    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        windows_expand_args: bool = True,
        **extra: Any,
    ) -> Any:
        prepare_tree(self)
        return super().main(
            args=args,
            prog_name=prog_name,
            complete_var=complete_var,
            standalone_mode=standalone_mode,
            windows_expand_args=windows_expand_args,
            **extra,
        )

    def make_context(
        self,
        info_name: str | None,
        args: list[str],
        parent: Context | None = None,
        **extra: Any,
    ) -> Context:
        with _one_line_usage_errors():
            return super().make_context(info_name, args, parent, **extra)

    def invoke(self, ctx: Context) -> Any:
        with _one_line_usage_errors():
            return super().invoke(ctx)


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


def _show_version(value: bool) -> None:
    if value:
        typer.echo(f"corral {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    verbose: bool = typer.Option(
        False, "-v", "--verbose", help="Show details and tracebacks (also after the verb)."
    ),
    version: bool = typer.Option(
        False,
        "--version",
        callback=_show_version,
        is_eager=True,
        expose_value=False,
        help="Print corral's version and exit.",
    ),
) -> None:
    _state["verbose"] = verbose


def verbose() -> bool:
    """Whether ``-v`` was given (before or after the verb)."""
    return _state["verbose"]


def report_error(exc: CorralError) -> None:
    """Print an expected error as one red line (details with ``-v``)."""
    err_console = make_console()
    # never read as markup: messages name things like gpu[01-04] or [host:rank]
    err_console.print(Text("error: ", style="bold red") + Text(str(exc)), soft_wrap=True)
    if verbose():
        for line in exc.details():
            err_console.print(f"  {line}", markup=False, soft_wrap=True)


def _register() -> None:
    """Add every verb to ``app`` now (once, however often it is called): the whole
    tree, for what walks it; ``corral`` itself loads each verb when it runs."""
    if _state["registered"]:
        return
    _state["registered"] = True
    import corral.cli

    for module in corral.cli._VERB_MODULES:
        importlib.import_module(f"corral.cli.{module}").register(app)


def main() -> None:
    """Console-script entry point: run the app, turning CorralError into one line."""
    try:
        app()  # standalone: usage errors are one line (CorralGroup), exit code 2
    except CorralError as exc:
        if verbose():
            import traceback

            traceback.print_exc()
        report_error(exc)
        sys.exit(2)
