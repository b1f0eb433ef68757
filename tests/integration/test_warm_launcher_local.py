"""A ``local:N`` torchrun job's launcher started warm, before the plan is known
(corral.agent.warm): real ``corral`` commands through the entry point, real agents,
torchrun and a stdlib rank.

* the plan matches: the rank's torchrun is the warm one, and the rank sees the plan's
  environment, working directory and arguments;
* the plan adds a variable read before the gate (``--env``): the warm launcher is
  killed and the plan's own started; nothing of it is left;
* an agent never sent a plan (its end, an abort, killed), or a command refused after
  the agents started: the warm launcher is gone with it;
* a start message with no plan before it (a stand-in ``torch``): adopted, its gate
  opened at once.
"""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

import corral
from corral.agent.gate import TORCHRUN
from tests.integration.test_entry_headstart_local import _corral

WAIT = 90.0  # a bound for a busy machine, never reached when it works
SRC = str(Path(corral.__file__).parents[1])
RANK = """
import json, os, sys
parent = os.getppid()
with open(f"/proc/{parent}/cmdline", "rb") as fh:
    launcher = fh.read().split(b"\\0")
with open(sys.argv[1], "w") as fh:
    json.dump({"argv": sys.argv[1:], "cwd": os.getcwd(),
               "launcher": [w.decode() for w in launcher if w],
               "launcher_cwd": os.readlink(f"/proc/{parent}/cwd"),
               "env": {k: os.environ.get(k) for k in ("CORRAL_NODE_DIR", "MASTER_ADDR", "FOO")}},
              fh)
"""


def _corral_run(tmp_path: Path, job_id: str, *args: str) -> tuple[str, int, list[list[str]]]:
    """``corral run --hosts local:1 --job-id JOB_ID ARGS`` through the entry point; its
    output, exit code and the agents' commands."""
    argv = ["run", "--hosts", "local:1", "--job-id", job_id, "--run-dir", "runs", *args]
    out, code, seen = _corral(tmp_path, *argv)
    return out, code, [agent for *_, agent in seen]


def _warm_processes(job_id: str) -> list[psutil.Process]:
    """The warm launchers of ``job_id`` still running."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        with contextlib.suppress(psutil.Error):
            cmdline = proc.info["cmdline"] or []
            warm = "--warm" in cmdline and "corral.agent.gate" in cmdline
            if warm and proc.environ().get("CORRAL_JOB_ID") == job_id:
                found.append(proc)
    return found


def _run_rank(tmp_path: Path, job_id: str, *options: str) -> dict[str, Any]:
    """Run ``rank.py`` as the job's one rank under torchrun; what it saw."""
    (tmp_path / "rank.py").write_text(RANK)
    out = tmp_path / "seen.json"
    args = ("--launcher", "torchrun", *options, "--", "rank.py", str(out), "planned")
    output, code, seen = _corral_run(tmp_path, job_id, *args)
    assert code == 0, output
    assert seen and all(argv[-2:] == ["--warm", TORCHRUN] for argv in seen), seen
    assert _warm_processes(job_id) == []
    return dict(json.loads(out.read_text()))


@pytest.mark.torch
def test_the_warm_launcher_runs_the_plan(tmp_path: Path) -> None:
    rank = _run_rank(tmp_path, "warm-used")
    # started before the plan: its command line is still the one it was started with
    assert rank["launcher"][1:4] == ["-m", "corral.agent.gate", "--warm"], rank
    assert rank["launcher"][-1] == TORCHRUN
    node_dir = tmp_path / "runs" / "warm-used" / "nodes" / "local-0"
    # the plan's environment (the agent's has no node directory), directory, arguments
    assert rank["env"] == {
        "CORRAL_NODE_DIR": str(node_dir),
        "MASTER_ADDR": "127.0.0.1",
        "FOO": None,
    }
    assert rank["cwd"] == rank["launcher_cwd"] == str(node_dir / "work")
    assert rank["argv"] == [str(tmp_path / "seen.json"), "planned"]
    assert "warm launcher not used" not in (node_dir / "logs" / "node.log").read_text()


@pytest.mark.torch
def test_a_plan_the_warm_launcher_cannot_run_starts_its_own(tmp_path: Path) -> None:
    rank = _run_rank(tmp_path, "warm-replaced", "--env", "FOO=bar")
    assert "corral.agent.gate" in rank["launcher"] and "--warm" not in rank["launcher"], rank
    assert rank["env"]["FOO"] == "bar"
    log = tmp_path / "runs" / "warm-replaced" / "nodes" / "local-0" / "logs" / "node.log"
    assert "warm launcher not used: FOO differs" in log.read_text()


def _agent(job_id: str, path: str = SRC) -> tuple[subprocess.Popen[bytes], psutil.Process]:
    """A node agent asked for a warm torchrun (``path``: its PYTHONPATH); the warm
    launcher it started."""
    agent = subprocess.Popen(
        [sys.executable, "-m", "corral.agent", "--warm", TORCHRUN],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": path, "CORRAL_JOB_ID": job_id},
        start_new_session=True,
    )
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        warm = _warm_processes(job_id)
        if warm:
            assert warm[0].ppid() == agent.pid
            return agent, warm[0]
        time.sleep(0.02)
    agent.kill()
    raise AssertionError("the agent started no warm launcher")


def _gone(proc: psutil.Process) -> bool:
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize("end", [b"", b'{"op": "abort"}\n'])
def test_an_agent_never_sent_a_plan_leaves_no_warm_launcher(end: bytes) -> None:
    agent, warm = _agent(f"warm-unused-{len(end)}")
    assert agent.stdin is not None
    agent.stdin.write(end)
    agent.stdin.close()
    assert agent.wait(timeout=WAIT) == 2
    assert _gone(warm)


@pytest.mark.torch
def test_a_killed_agent_takes_its_warm_launcher_with_it() -> None:
    agent, warm = _agent("warm-killed")
    deadline = time.monotonic() + WAIT  # past its start: torch is being imported
    while time.monotonic() < deadline and not any("torch" in m.path for m in warm.memory_maps()):
        time.sleep(0.02)
    agent.send_signal(signal.SIGKILL)
    agent.wait(timeout=WAIT)
    assert _gone(warm)


def test_a_refused_command_leaves_no_warm_launcher(tmp_path: Path) -> None:
    (tmp_path / "rank.py").write_text(RANK)
    output, code, seen = _corral_run(
        tmp_path, "warm-refused", "--nproc-per-node", "zero", "--", "x.py"
    )
    assert code == 2, output
    assert seen and all(argv[-2:] == ["--warm", TORCHRUN] for argv in seen), seen
    deadline = time.monotonic() + WAIT
    while _warm_processes("warm-refused") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _warm_processes("warm-refused") == []


def test_agents_the_cli_starts_itself_start_torchrun_warm_too(tmp_path: Path) -> None:
    """No ``--``: ``corral run`` starts the agents once its options are parsed (the
    default launcher: torchrun, warm); a script it then refuses leaves nothing."""
    output, code, seen = _corral_run(tmp_path, "warm-cli", "missing.py")
    assert code == 2 and "missing.py" in output, output
    assert seen and all(argv[-2:] == ["--warm", TORCHRUN] for argv in seen), seen
    deadline = time.monotonic() + WAIT
    while _warm_processes("warm-cli") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _warm_processes("warm-cli") == []


FAKE_TORCHRUN = """
import json, os, sys
def main():
    with open(sys.argv[1], "w") as fh:
        json.dump({"argv": sys.argv[1:], "cwd": os.getcwd(), "pid": os.getpid(),
                   "node_dir": os.environ.get("CORRAL_NODE_DIR")}, fh)
"""


def test_a_start_message_without_a_plan_before_it_opens_the_warm_gate_at_once(
    tmp_path: Path,
) -> None:
    fake = tmp_path / "fake"
    (fake / "torch" / "distributed").mkdir(parents=True)
    (fake / "torch" / "__init__.py").write_text("")
    (fake / "torch" / "distributed" / "__init__.py").write_text("")
    (fake / "torch" / "distributed" / "run.py").write_text(FAKE_TORCHRUN)
    (tmp_path / "work").mkdir()
    out = tmp_path / "out.json"
    agent, warm = _agent("warm-start", f"{fake}:{SRC}")
    node = {
        "argv": [sys.executable, "-m", TORCHRUN, str(out), "planned"],
        "cwd": str(tmp_path / "work"),
        "env": {
            "CORRAL_NODE_DIR": str(tmp_path / "node"),
            "CORRAL_JOB_ID": "warm-start",
            "CORRAL_FLIGHT_RECORDER": "0",  # else torch's names for this launcher
        },
    }
    start = {"op": "start", "node": node, "grace": 2.0, "heartbeat_timeout": 0.0}
    assert agent.stdin is not None
    agent.stdin.write(json.dumps(start).encode() + b"\n")
    agent.stdin.flush()
    try:
        assert agent.wait(timeout=WAIT) == 0
    finally:
        agent.kill()
    seen = json.loads(out.read_text())
    assert seen["pid"] == warm.pid  # the warm launcher ran the plan
    assert seen["argv"] == [str(out), "planned"]
    assert seen["cwd"] == str(tmp_path / "work")
    assert seen["node_dir"] == str(tmp_path / "node")
