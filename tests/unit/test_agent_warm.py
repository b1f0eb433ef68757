"""A warm launcher (corral.agent.warm): the gate of a process started before its plan
was known takes the plan's whole environment, directory and arguments; which plans it
can run (corral.agent.spawn.warm_unusable). Real gate processes, a stdlib script."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import corral
from corral.agent.gate import GATE_MODULE, TORCHRUN, WORKER
from corral.agent.spawn import warm_unusable
from corral.agent.warm import Warm, agent_argv, gate_message, requested

SRC = str(Path(corral.__file__).parents[1])
SCRIPT = """
import json, os, sys
with open(sys.argv[1], "w") as fh:
    json.dump({"argv": sys.argv[1:], "cwd": os.getcwd(), "path": sys.path,
               "env": {k: os.environ.get(k) for k in ("A", "B", "C")}}, fh)
"""


def _warm_gate(tmp_path: Path, parent: int) -> tuple[subprocess.Popen[bytes], int, Path]:
    """A worker held at a warm gate (as the agent starts torchrun's), started in
    ``start/`` with the agent's environment; its gate's write end and the script."""
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    started = tmp_path / "start"
    started.mkdir()
    read, write = os.pipe()
    argv = [sys.executable, "-m", GATE_MODULE, "--warm", str(parent), str(read), WORKER]
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": SRC, "A": "early", "B": "gone"}
    proc = subprocess.Popen(argv, env=env, pass_fds=(read,), cwd=started)
    os.close(read)
    return proc, write, script


def test_a_warm_gate_runs_the_plans_environment_directory_and_arguments(tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    planned = tmp_path / "plan"
    planned.mkdir()
    proc, gate, script = _warm_gate(tmp_path, os.getpid())
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": SRC, "A": "late", "C": "new"}
    os.write(gate, gate_message([str(script), str(out)], env, str(planned)))
    os.close(gate)
    assert proc.wait(timeout=60) == 0
    seen = json.loads(out.read_text())
    assert seen["argv"] == [str(out)]
    assert seen["env"] == {"A": "late", "B": None, "C": "new"}  # replaced, not merged
    assert seen["cwd"] == str(planned)
    # the plan's directory is where `python -m` puts it (after the script's own, the
    # worker's); the directory it started in is not on sys.path
    assert seen["path"][:2] == [str(tmp_path), str(planned)]
    assert str(tmp_path / "start") not in seen["path"]


def test_a_warm_gate_whose_agent_is_gone_runs_nothing(tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    proc, gate, script = _warm_gate(tmp_path, os.getpid() + 1_000_000)  # not its parent
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": SRC}
    os.write(gate, gate_message([str(script), str(out)], env, str(tmp_path)))
    try:
        assert proc.wait(timeout=60) == 0
    finally:
        os.close(gate)
    assert not out.exists()  # it exited before reading its gate


def _warm(exited: int | None = None) -> Warm:
    popen = SimpleNamespace(poll=lambda: exited, returncode=exited, pid=0)
    return Warm(cast(Any, popen), TORCHRUN, -1, -1)


def test_which_plans_a_warm_launcher_can_run() -> None:
    warm = _warm()
    argv = [sys.executable, "-m", TORCHRUN, "--nnodes=2", "-m", WORKER, "train.py"]
    planned = {
        **os.environ,
        "CORRAL_NODE_DIR": "/runs/j/nodes/a",
        "CORRAL_JOB_ID": "j",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "0",
        "NNODES": "2",
    }
    assert warm_unusable(warm, argv, planned) is None
    assert warm_unusable(warm, argv, {**planned, "PYTHONPATH": "/elsewhere"}) == (
        "PYTHONPATH differs"
    )
    assert warm_unusable(warm, argv, {**planned, "WANDB_MODE": "off"}) == "WANDB_MODE differs"
    assert warm_unusable(warm, argv, {k: v for k, v in planned.items() if k != "PATH"}) == (
        "PATH differs"
    )
    for other in (
        ["/other/python", *argv[1:]],
        [sys.executable, "-u", *argv[1:]],  # interpreter flags it was not started with
        [sys.executable, "-m", WORKER, "train.py"],
    ):
        assert warm_unusable(warm, other, planned) == "the node runs another command"
    assert warm_unusable(_warm(exited=1), argv, planned) == "it exited (1)"


def test_the_agents_warm_flag() -> None:
    agent = [sys.executable, "-m", "corral.agent"]
    assert agent_argv(agent, None) == agent
    warm = agent_argv(agent, TORCHRUN)
    assert warm == [*agent, "--warm", TORCHRUN]
    assert requested(warm[3:]) == TORCHRUN
    assert requested([]) is None
    assert requested(["--warm", "some.module"]) is None
    assert requested(["--warm"]) is None
