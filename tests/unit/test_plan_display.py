"""``corral plan``'s shell lines run as printed: ``~`` reaches the shell unquoted,
a ``local:N`` node's working directory is created first, and the footer about
``python3`` appears only where a printed command starts with it."""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

import pytest

from corral.cluster.model import Cluster, Host
from corral.plan.display import command_lines, home_path, makes_cwd, python_note, shell_line
from corral.plan.launchers import CommandOptions, MadengineOptions
from corral.plan.render import plan_job
from corral.plan.spec import JobSpec, NodeCommand

TRIED = ("/venv/bin/python", "python3")


def _plan(hosts: tuple[Host, ...], **spec: object) -> list[NodeCommand]:
    base: dict[str, object] = {
        "script": "/abs/train.py",
        "job_id": "j1",
        "run_dir": "/tmp/runs",
        "launcher": "python",
    }
    return plan_job(JobSpec(**{**base, **spec}), Cluster(hosts, source="test"))  # type: ignore[arg-type]


def _echo(word: str, home: Path) -> str:
    """What bash makes of one shell word, with HOME=home."""
    done = subprocess.run(
        ["bash", "-c", f"printf '%s' {word}"],
        env={"HOME": str(home), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout


@pytest.mark.parametrize(
    ("path", "expected"),
    [("~", "H"), ("~/.corral/runs/j1/h1", "H/.corral/runs/j1/h1"), ("~/a b/$x", "H/a b/$x")],
)
def test_a_tilde_path_is_the_home_dir_in_the_shell(path: str, expected: str) -> None:
    home = Path("/tmp/not-created-home")
    assert _echo(home_path(path), home) == expected.replace("H", str(home))


def test_other_paths_stay_literal() -> None:
    for path in ("/x/~/y", "a~b", "~user/x", "/p q"):
        assert shlex.split(home_path(path)) == [path]


def test_an_ssh_node_line_expands_the_node_dir() -> None:
    (cmd,) = _plan((Host("h1"),))
    (line,) = command_lines(cmd)
    assert cmd.env["CORRAL_NODE_DIR"] == "~/.corral/runs/j1/h1"
    assert 'CORRAL_NODE_DIR="$HOME"/.corral/runs/j1/h1 ' in line.line
    assert "'CORRAL_NODE_DIR=~" not in line.line
    assert not line.line.startswith("mkdir")  # the real run needs the cwd to exist too
    words = shlex.split(line.line.replace('"$HOME"', "/home/me"))
    assert "CORRAL_NODE_DIR=/home/me/.corral/runs/j1/h1" in words


def test_a_local_node_line_creates_its_working_dir() -> None:
    commands = _plan((Host("local-0", local=True), Host("local-1", local=True)))
    for cmd in commands:
        work = f"/tmp/runs/j1/nodes/{cmd.host.name}/work"
        assert cmd.cwd == work and makes_cwd(cmd)
        (line,) = command_lines(cmd)
        assert line.line.startswith(f"mkdir -p {work} && cd {work} && env ")


def test_a_given_workdir_is_not_created() -> None:
    (cmd,) = _plan((Host("local-0", local=True),), workdir="/srv/code")
    assert not makes_cwd(cmd)
    assert command_lines(cmd)[0].line.startswith("cd /srv/code && env ")


def test_shell_line_keeps_other_values_literal() -> None:
    line = shell_line("/w", {"A": "~/x", "B": "$(rm -rf /)"}, ["echo", "a b"])
    assert shlex.split(line) == ["cd", "/w", "&&", "env", "A=~/x", "B=$(rm -rf /)", "echo", "a b"]


def test_the_python3_note_only_where_a_command_starts_with_python3() -> None:
    ssh = (Host("h1"), Host("h2"))
    note = python_note(_plan(ssh), TRIED)
    assert note == (
        "python3 above is resolved per host at launch: /venv/bin/python if it exists "
        "there, else python3 (or pass --python)"
    )
    assert python_note(_plan(ssh, launcher="torchrun"), TRIED) is not None
    command = _plan(
        ssh, launcher="command", script="", launcher_options=CommandOptions("echo {node_rank}")
    )
    assert command[0].argv[0] == "bash" and python_note(command, TRIED) is None
    madengine = _plan(
        ssh,
        launcher="madengine",
        script="",
        launcher_options=MadengineOptions("pyt_x"),
        shared_data_path="/nfs",
    )
    assert "python3" not in madengine[0].argv and python_note(madengine, TRIED) is None
    assert python_note(_plan(ssh, python="/opt/py/bin/python"), TRIED) is None
    assert python_note(_plan((Host("h1", python="/usr/bin/python3.11"),)), TRIED) is None
    local = (Host("local-0", local=True),)
    assert python_note(_plan(local, python="python3"), TRIED) is None
