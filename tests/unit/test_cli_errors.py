"""What a new user sees when the command line is wrong, and in ``corral plan`` / ``ping``.

Usage errors (unknown option, bad value, missing argument) come out as the one
``error: ...`` line every other error uses, plus where to read the usage, with
exit code 2 and no box. ``-v`` after the verb adds the details as before it.
``corral plan`` prints each node's command as one copy-pasteable shell line;
``corral ping`` names its time for what it is (echo over a new SSH connection).
"""

from __future__ import annotations

import io
import json
import re
import shlex
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from corral.cli import main as cli_main
from corral.cli import run as cli_run
from corral.cli.main import _register, app
from corral.console import make_console

_register()
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_BOX = re.compile(r"[╭╮╰╯│─]")


@pytest.fixture(autouse=True)
def no_corral_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No CORRAL_* setting from the environment; a scratch working directory."""
    import os

    for name in list(os.environ):
        if name.startswith("CORRAL_"):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)


def invoke(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, list(args), env={"COLUMNS": "80"})
    return result.exit_code, result.stdout, result.stderr


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error:")]


def assert_one_line_usage_error(code: int, stderr: str, command: str) -> str:
    assert code == 2, stderr
    assert not _BOX.search(stderr), stderr
    lines = error_lines(stderr)
    assert len(lines) == 1, stderr
    assert f"(see {command} --help)" in stderr
    assert "Usage:" not in stderr
    return lines[0]


def test_unknown_option_is_one_line_with_a_suggestion() -> None:
    code, out, err = invoke("run", "--nproc", "2", "--hosts", "local:1", "--", "x.py")
    line = assert_one_line_usage_error(code, err, "corral run")
    assert line.startswith("error: --nproc: no such option (did you mean --nproc-per-node")
    assert out == ""


@pytest.mark.parametrize(
    ("option", "reason"),
    [("--master-port", "valid integer"), ("--timeout", "valid number")],
)
def test_bad_number_is_one_line(option: str, reason: str) -> None:
    code, _, err = invoke("run", option, "abc", "--hosts", "local:1", "--", "x.py")
    line = assert_one_line_usage_error(code, err, "corral run")
    assert line.startswith(f"error: {option}: invalid value: input should be a ")
    assert reason in line


def test_bad_value_from_the_environment_names_the_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CORRAL_MASTER_PORT", "abc")
    code, _, err = invoke("plan", "--hosts", "local:1", "--", "x.py")
    line = assert_one_line_usage_error(code, err, "corral plan")
    assert line.startswith("error: CORRAL_MASTER_PORT (--master-port): invalid value")


def test_missing_argument_and_unknown_verb() -> None:
    code, _, err = invoke("exec", "--hosts", "local:1")
    assert (
        assert_one_line_usage_error(code, err, "corral exec")
        == "error: missing argument COMMAND..."
    )
    code, _, err = invoke("nope")
    assert assert_one_line_usage_error(code, err, "corral") == "error: no such command 'nope'"


def test_no_arguments_still_show_the_help() -> None:
    result = CliRunner().invoke(app, [])
    assert result.exit_code == 2
    assert "Usage: corral" in result.output and not error_lines(result.output)


def run_main(monkeypatch: pytest.MonkeyPatch, *args: str) -> int:
    monkeypatch.setattr(sys, "argv", ["corral", *args])
    with pytest.raises(SystemExit) as exited:
        cli_main.main()
    return int(exited.value.code or 0)


@pytest.mark.parametrize("where", ["after the verb", "before the verb"])
def test_verbose_after_the_verb_adds_the_details(
    where: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["--hosts", "local:1", "--", "missing.py"]
    argv = ["run", "-v", *args] if where == "after the verb" else ["-v", "run", *args]
    assert run_main(monkeypatch, *argv) == 2
    err = capsys.readouterr().err
    assert error_lines(err) == [f"error: script missing.py not found (looked in {Path.cwd()})"]
    assert "Traceback (most recent call last)" in err


def test_without_verbose_no_details(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run_main(monkeypatch, "-v", "--version") == 0  # -v of a former run is not kept
    capsys.readouterr()
    assert run_main(monkeypatch, "run", "--hosts", "local:1", "--", "missing.py") == 2
    err = capsys.readouterr().err
    assert len(error_lines(err)) == 1 and "Traceback" not in err


# --- corral plan -------------------------------------------------------------------

PLAN_ARGS = (
    "plan",
    "--hosts",
    "local:2",
    "--job-id",
    "j1",
    "--env",
    "MSG=hello world; $(rm -rf /)",
    "--env",
    "HF_TOKEN=s3cr3t-value",
)


class Terminal(io.StringIO):
    """A stdout that says it is a terminal."""

    def isatty(self) -> bool:
        return True


def plan_lines(stdout: str) -> list[str]:
    return [_ANSI.sub("", line) for line in stdout.splitlines()]


def expected_lines(launcher: str) -> list[list[str]]:
    """``mkdir -p CWD && cd CWD && env K=V... ARGV`` of each node (each rank for
    python), from --json (a local node's working dir is created, as its agent does)."""
    code, out, err = invoke(*PLAN_ARGS, "--launcher", launcher, "--json", "--", "train.py", "-x")
    assert code == 0, err
    words = []
    for node in json.loads(out)["nodes"]:
        runs = [r["env"] for r in node["ranks"]] or [{}]
        for extra in runs:
            env = {**node["env"], **extra}
            assigns = [f"{k}={v}" for k, v in env.items()]
            mkdir = ["mkdir", "-p", node["cwd"], "&&"]
            words.append([*mkdir, "cd", node["cwd"], "&&", "env", *assigns, *node["argv"]])
    return words


def commands_in(lines: list[str]) -> list[list[str]]:
    return [shlex.split(line) for line in lines if line.startswith(("cd ", "mkdir -p "))]


@pytest.mark.parametrize("launcher", ["torchrun", "python"])
def test_plan_piped_prints_each_command_on_one_shell_line(launcher: str) -> None:
    Path("train.py").write_text("")
    code, out, err = invoke(*PLAN_ARGS, "--launcher", launcher, "--", "train.py", "-x")
    assert code == 0, err
    lines = plan_lines(out)
    assert commands_in(lines) == expected_lines(launcher)
    assert "s3cr3t" not in out
    assert sum(line.strip() == "HF_TOKEN=<redacted>" for line in lines) == 2  # each node's env
    assert sum(line.strip() == "MSG=hello world; $(rm -rf /)" for line in lines) == 2


def test_plan_on_a_100_column_terminal_keeps_command_lines_whole(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    Path("train.py").write_text("")
    terminal = Terminal()
    monkeypatch.setattr(cli_run, "make_console", lambda **_: make_console(file=terminal))
    result = CliRunner().invoke(
        app, [*PLAN_ARGS, "--launcher", "python", "--", "train.py", "-x"], env={"COLUMNS": "100"}
    )
    assert result.exit_code == 0, result.output
    lines = plan_lines(terminal.getvalue())
    assert commands_in(lines) == expected_lines("python")
    assert max(len(line) for line in lines if line.startswith("mkdir -p ")) > 100
    table = [line for line in lines if line.startswith(("┃", "│", "┏", "┡", "└"))]
    assert table and all(len(line) <= 100 for line in table)


# --- corral ping ------------------------------------------------------------------


def test_ping_names_its_time_ssh_echo() -> None:
    code, _, err = invoke("ping", "--hosts", "local:2")
    assert code == 0, err
    header = err.splitlines()[0].split()
    assert header[:4] == ["host", "status", "ssh", "echo"]
    assert "rtt" not in header
    code, out, _ = invoke("ping", "--hosts", "local:1", "--json")
    entry = json.loads(out)["hosts"]["local-0"]
    assert entry["ssh_echo_ms"] == entry["rtt_ms"] >= 0
