"""Every ``--help`` of the CLI renders its help texts as written.

Help texts are plain text: a ``[host:rank]`` in one is literal, not rich markup
(which would swallow it). Their source lines are wrapped for the editor; the
rendered help must not break a paragraph where the source did, only where the
terminal wraps it. Both are checked for every command, group and subcommand:

- at ``COLUMNS=200`` (the terminal wraps long texts), each help paragraph of the
  command and of each of its visible options and arguments, with whitespace runs
  collapsed to one space, occurs in the rendered help with table borders removed
  and whitespace runs collapsed the same way;
- at a width wider than any paragraph (the terminal wraps nothing), each such
  paragraph occurs within one line of the rendered help.
"""

from __future__ import annotations

import inspect
import re
import sys
from collections.abc import Iterator

import pytest
import typer
from typer._click import Command
from typer.testing import CliRunner

from corral.cli.main import _register, app

WIDE = 2000  # wider than any help paragraph plus the option columns
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_BORDERS = re.compile(r"[│╭╮╰╯─]")


def collapse(text: str) -> str:
    """Whitespace runs as one space, without table borders or ANSI codes."""
    return " ".join(_BORDERS.sub(" ", _ANSI.sub("", text)).split())


def paragraphs(help_text: str | None) -> list[str]:
    """The paragraphs a help text shows (blank-line separated, up to a ``\\f``), collapsed."""
    shown = inspect.cleandoc(help_text or "").partition("\f")[0]
    return [collapse(p) for p in shown.split("\n\n") if p.strip() and not p.startswith("\b")]


def commands(
    command: Command, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], Command]]:
    """Every command of the tree with the words that invoke it (the root's are empty)."""
    yield path, command
    for name, sub in getattr(command, "commands", {}).items():
        if not getattr(sub, "hidden", False):
            yield from commands(sub, (*path, name))


def texts(command: Command) -> list[str]:
    """The paragraphs its ``--help`` shows: its own help, its visible parameters' help and,
    for a group, the first paragraph of each visible subcommand's help (the command list)."""
    found = paragraphs(command.help)
    for param in command.params:
        if not getattr(param, "hidden", False):
            found += paragraphs(getattr(param, "help", None))
    for sub in getattr(command, "commands", {}).values():
        if not getattr(sub, "hidden", False):
            found += paragraphs(sub.short_help or sub.help)[:1]
    return found


def render(path: tuple[str, ...], columns: int) -> str:
    result = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": str(columns)})
    assert result.exit_code == 0, result.output
    return result.output


_register()
TREE = list(commands(typer.main.get_command(app)))
IDS = [" ".join(("corral", *path)) for path, _ in TREE]


def test_the_tree_has_every_verb() -> None:
    names = {path[0] for path, _ in TREE if path}
    assert {"run", "plan", "check", "exec", "sync", "logs", "ping", "testbed"} <= names
    assert ("testbed", "up") in {path for path, _ in TREE}


@pytest.mark.parametrize(("path", "command"), TREE, ids=IDS)
def test_every_help_paragraph_is_rendered_as_written(
    path: tuple[str, ...], command: Command
) -> None:
    shown = collapse(render(path, 200))
    expected = texts(command)
    assert expected, f"corral {' '.join(path)} has no help text"
    missing = [p for p in expected if p not in shown]
    assert missing == [], f"not rendered as written:\n{missing}\n--- rendered:\n{shown}"


@pytest.mark.parametrize(("path", "command"), TREE, ids=IDS)
def test_no_paragraph_is_broken_across_lines(path: tuple[str, ...], command: Command) -> None:
    lines = [collapse(line) for line in render(path, WIDE).splitlines()]
    broken = [p for p in texts(command) if not any(p in line for line in lines)]
    assert broken == [], f"split across lines at {WIDE} columns: {broken}"


def test_host_rank_prefix_is_literal_in_logs_help() -> None:
    assert "each line prefixed [host:rank]." in collapse(render(("logs",), 200))
    root = collapse(render((), 200))
    assert "Print a job's logs, each line prefixed [host:rank]." in root
    assert "output prefixed [host]." in root


def test_exit_code_sentence_is_one_line() -> None:
    lines = render(("run",), WIDE).splitlines()
    assert any("128+N when it was killed by signal N;" in line for line in lines)


def test_error_lines_are_never_read_as_markup(capsys: pytest.CaptureFixture[str]) -> None:
    from corral.cli import main as cli_main
    from corral.errors import ConfigError

    cli_main.err_console.file = sys.stderr  # capsys replaced stderr after import
    cli_main.report_error(ConfigError("duplicate host gpu[01-02] ([bold]x[/]) at [host:rank]"))
    err = capsys.readouterr().err
    assert "error: duplicate host gpu[01-02] ([bold]x[/]) at [host:rank]" in err
