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

Values are named by words: a flag shows none, an option a word such as ``DIR``
or ``K=V`` (never a type like ``<bool>`` or ``<list[str]>``), and the script
argument reads ``-- SCRIPT [ARGS]...`` as the README writes it. Every verb takes
``-v`` and the root takes ``--version``.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Iterator
from functools import cache

import pytest
import typer
import typer.testing
from typer._click import Command
from typer.testing import CliRunner

from corral import __version__
from corral.cli.main import _register, app, prepare_tree

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


@cache
def render(path: tuple[str, ...], columns: int) -> str:
    """``corral PATH --help`` as a terminal COLUMNS wide shows it; rendered once per
    path and width (several tests read each; rich's tables cost ~0.1 CPU-s a help)."""
    result = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": str(columns)})
    assert result.exit_code == 0, result.output
    return result.output


@pytest.fixture(scope="module", autouse=True)
def _render_once() -> Iterator[None]:
    """A module-scoped fixture: one worker runs the module (tests/parallel.py), so each
    help is rendered once; the cache goes with the module. The click tree the runner
    invokes is built once for the module too (typer builds it anew for each
    ``invoke``: ~0.04 CPU-s, for a couple of hundred invocations), a tree of its own:
    TREE keeps the source help, PREPARED is prepared by the test."""
    built: dict[int, Command] = {}

    def once(typer_app: typer.Typer) -> Command:
        if id(typer_app) not in built:
            built[id(typer_app)] = typer.main.get_command(typer_app)
        return built[id(typer_app)]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(typer.testing, "_get_command", once)
        yield
    render.cache_clear()


_register()
TREE = list(commands(typer.main.get_command(app)))
IDS = [" ".join(("corral", *path)) for path, _ in TREE]


def test_the_tree_has_every_verb() -> None:
    names = {path[0] for path, _ in TREE if path}
    verbs = {"run", "plan", "check", "exec", "sync", "logs", "ping", "serve", "job", "testbed"}
    verbs |= {"calibrate", "k8s", "slurm"}
    assert verbs <= names
    paths = {path for path, _ in TREE}
    assert ("testbed", "up") in paths
    assert {("k8s", v) for v in ("render", "apply", "logs", "delete")} <= paths
    assert {("slurm", "render"), ("slurm", "submit")} <= paths
    jobs = {path[1] for path, _ in TREE if len(path) == 2 and path[0] == "job"}
    assert jobs == {"submit", "list", "status", "logs", "stop", "queue", "resubmit"}


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

    cli_main.report_error(ConfigError("duplicate host gpu[01-02] ([bold]x[/]) at [host:rank]"))
    err = capsys.readouterr().err
    assert "error: duplicate host gpu[01-02] ([bold]x[/]) at [host:rank]" in err


_TYPE_LABEL = re.compile(r"<(bool|str|int|float|path|Path|datetime|list\[[^>]*\])>")


@pytest.mark.parametrize(("path", "command"), TREE, ids=IDS)
def test_values_are_named_by_words(path: tuple[str, ...], command: Command) -> None:
    shown = render(path, WIDE)
    assert _TYPE_LABEL.findall(shown) == [], shown
    assert "list[str]" not in shown
    assert "[command]" not in shown
    assert "{" not in shown.split("\n", 3)[1], "a required argument in braces"


PREPARED = typer.main.get_command(app)
prepare_tree(PREPARED)  # as the app does before it runs (TREE keeps the source help)


@pytest.mark.parametrize(("path", "command"), list(commands(PREPARED)), ids=IDS)
def test_every_option_shows_its_word(path: tuple[str, ...], command: Command) -> None:
    lines = [collapse(line) for line in render(path, WIDE).splitlines()]
    for param in command.params:
        if getattr(param, "hidden", False) or param.param_type_name != "option":
            continue
        names = " ".join(sorted(param.opts + param.secondary_opts, key=len, reverse=True))
        metavar = param.metavar or ""
        if getattr(param, "is_flag", False):
            assert metavar == "", f"{names} is a flag: no value word"
        else:
            assert re.fullmatch(r"[A-Za-z0-9_=|:,.\-]+", metavar), (names, metavar)
            assert any(
                line.startswith(f"{param.opts[0]}") and f" {metavar} " in f"{line} "
                for line in lines
            ), (names, metavar)


@pytest.mark.parametrize("verb", ["run", "plan"])
def test_script_usage_reads_as_the_readme(verb: str) -> None:
    assert f"Usage: corral {verb} [OPTIONS] -- SCRIPT [ARGS]..." in collapse(render((verb,), 200))


def test_options_read_as_words_in_run_help() -> None:
    lines = [collapse(line) for line in render(("run",), WIDE).splitlines()]
    expected = {
        "--env": "K=V",
        "--secret-env": "KEY",
        "--hosts": "FILE|local:N|h1,h2",
        "--run-dir": "DIR",
        "--timeout": "SECONDS",
        "--max-restarts": "N",
    }
    for option, word in expected.items():
        assert any(line.startswith(f"{option} {word} ") for line in lines), option
    assert any(line.startswith("-- SCRIPT [ARGS]... ") for line in lines)
    assert any(line.startswith("--no-preflight Launch without") for line in lines)


@pytest.mark.parametrize(("path", "command"), TREE[1:], ids=IDS[1:])
def test_every_verb_takes_verbose(path: tuple[str, ...], command: Command) -> None:
    result = CliRunner().invoke(app, [*path, "-v", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "--verbose" in result.output


def test_version() -> None:
    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0, result.output
    assert result.output == f"corral {__version__}\n"
    assert "--version" in collapse(render((), 200))


def test_every_console_of_the_cli_comes_from_make_console() -> None:
    import ast
    from pathlib import Path

    import corral.cli

    made = []
    for source in sorted(Path(corral.cli.__file__).parent.glob("*.py")):
        for node in ast.walk(ast.parse(source.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Console":
                made.append(f"{source.name}:{node.lineno}")
    assert made == [], "use corral.console.make_console()"
