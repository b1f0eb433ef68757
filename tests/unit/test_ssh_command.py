"""Remote command lines built by the SSH transport: quoting, env, cwd, the PID line.

The built lines are run through a local ``/bin/sh`` (what sshd does with them
on the host) to prove that arguments arrive verbatim.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from corral.errors import ConfigError
from corral.transport.ssh import PID_PREAMBLE, build_command, build_shell_command

NASTY = [
    "plain",
    "with space",
    "  leading and trailing  ",
    "it's",
    '"double"',
    "$(touch /tmp/corral-pwned)",
    "`id`",
    "a; rm -rf /",
    "a && b || c",
    "line1\nline2",
    "tab\there",
    "ünïcødé ✓ 😀",
    "",
    "-n",
    "--flag=value",
    "*",
    "~",
    "$HOME",
    "back\\slash",
    "{a,b}",
    "!bang",
    "#comment",
    "x=y",
    "'",
    "\\",
    "%d",
]

ECHO_ARGS = "import sys, json; print(json.dumps(sys.argv[1:]))"


def sh(command: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["/bin/sh", "-c", command], capture_output=True, check=False, env=env)


def test_plain_argv_is_quoted_word_by_word() -> None:
    cmd = build_command(["echo", "a b", "c"], report_pid=False)
    assert cmd == "exec echo 'a b' c"


def test_env_and_cwd_come_first() -> None:
    cmd = build_command(["run"], env={"A": "1", "B": "x y"}, cwd="/srv/job dir", report_pid=False)
    assert cmd == "cd '/srv/job dir' && exec env A=1 'B=x y' run"


def test_cwd_starting_with_dash_is_not_an_option() -> None:
    cmd = build_command(["true"], cwd="-odd", report_pid=False)
    assert cmd.startswith("cd ./-odd && ")


def test_pid_preamble_is_first() -> None:
    cmd = build_command(["true"])
    assert cmd.startswith(PID_PREAMBLE + "; ")


def test_empty_argv_is_refused() -> None:
    with pytest.raises(ValueError):
        build_command([])


@pytest.mark.parametrize("name", ["A B", "1X", "A-B", "", "A=B", "$(x)"])
def test_bad_env_names_are_refused(name: str) -> None:
    with pytest.raises(ConfigError, match="environment variable"):
        build_command(["true"], env={name: "1"})


def test_nasty_arguments_arrive_verbatim_through_a_shell() -> None:
    cmd = build_command([sys.executable, "-c", ECHO_ARGS, *NASTY], report_pid=False)
    result = sh(cmd)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == NASTY


def test_nasty_env_values_and_cwd_arrive_verbatim(tmp_path: Path) -> None:
    weird = tmp_path / "dir with 'quote' and $(x) ü"
    weird.mkdir()
    env = {f"V{i}": value for i, value in enumerate(NASTY)}
    script = (
        "import os, json; "
        f"print(json.dumps([os.getcwd(), [os.environ[f'V{{i}}'] for i in range({len(NASTY)})]]))"
    )
    cmd = build_command([sys.executable, "-c", script], env=env, cwd=str(weird))
    result = sh(cmd, env={"PATH": "/usr/bin:/bin"})
    assert result.returncode == 0, result.stderr
    cwd, values = json.loads(result.stdout)
    assert cwd == str(weird)
    assert values == NASTY
    assert result.stderr.startswith(b"__corral_pid__=")


def test_only_the_given_env_is_added() -> None:
    cmd = build_command(["env"], env={"ONLY": "me"}, report_pid=False)
    result = sh(cmd, env={"PATH": "/usr/bin:/bin", "SECRET": "no"})
    lines = result.stdout.decode().splitlines()
    assert "ONLY=me" in lines
    assert "SECRET=no" in lines  # the login env is the host's own, untouched
    assert sum(line.startswith("ONLY=") for line in lines) == 1


def test_pid_line_reports_the_exec_d_process() -> None:
    cmd = build_command([sys.executable, "-c", "import os; print(os.getpid())"])
    result = sh(cmd)
    reported = int(result.stderr.decode().strip().split("=", 1)[1])
    assert reported == int(result.stdout)


def test_shell_command_runs_as_written() -> None:
    cmd = build_shell_command("echo $FOO; echo $(echo sub) | tr a-z A-Z", env={"FOO": "a b"})
    result = sh(cmd)
    assert result.stdout == b"a b\nSUB\n"
    assert result.stderr.startswith(b"__corral_pid__=")


def test_shell_command_cwd_missing_fails_before_running() -> None:
    cmd = build_shell_command("echo ran", cwd="/nonexistent/corral-dir", report_pid=False)
    result = sh(cmd)
    assert result.returncode == 1  # `cd DIR || exit 1`
    assert b"ran" not in result.stdout
    assert b"/nonexistent/corral-dir" in result.stderr


def test_shell_command_exit_code_is_kept() -> None:
    assert sh(build_shell_command("exit 7")).returncode == 7
