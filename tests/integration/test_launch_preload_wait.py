"""After the start message a node agent loads its own machinery (and sends the events the
coordinator then handles) only once the processes it released have imported torch:
on a host with few cores that work would otherwise delay the launcher's first
rendezvous join (issue 34 §4). Real agent and rank processes; ``torch`` is a stand-in
package whose import the test holds and lets go."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Any

import corral
from corral.agent.protocol import EVENT, decode_header

SRC = str(Path(corral.__file__).parents[1])
FAKE_TORCH = """
import os, time
here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
open(os.path.join(here, "importing"), "w").close()
deadline = time.monotonic() + 90
while not os.path.exists(os.path.join(here, "release")) and time.monotonic() < deadline:
    time.sleep(0.01)
"""
SCRIPT = "import sys\nimport torch\nopen(sys.argv[1], 'w').write('ran')\n"


def _setup(tmp_path: Path) -> tuple[subprocess.Popen[bytes], dict[str, Any]]:
    """An agent holding one rank whose script imports the stand-in torch (through the
    probe's plan), once that import has begun."""
    fake = tmp_path / "fake"
    (fake / "torch").mkdir(parents=True)
    (fake / "torch" / "__init__.py").write_text(FAKE_TORCH)
    (tmp_path / "script.py").write_text(SCRIPT)
    node = {
        "argv": [sys.executable, "-u", "-m", "corral.agent.worker", "script.py", "out"],
        "cwd": str(tmp_path),
        "env": {
            "CORRAL_NODE_DIR": str(tmp_path / "node"),
            "CORRAL_JOB_ID": "waitjob",
            "CORRAL_FLIGHT_RECORDER": "0",
            "PYTHONPATH": f"{fake}:{SRC}",
        },
        "ranks": [{"rank": 0, "local_rank": 0, "env": {"RANK": "0", "LOCAL_RANK": "0"}}],
    }
    agent = subprocess.Popen(
        [sys.executable, "-m", "corral.agent"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": SRC},
        cwd=tmp_path,
    )
    _send(agent, {"op": "probe", "workdir": None, "port": None, "prestart": node})
    assert agent.stdout is not None
    assert _event(agent.stdout)["event"] == "probe"
    deadline = time.monotonic() + 60
    while not (tmp_path / "importing").exists():  # the held rank is importing "torch"
        assert agent.poll() is None and time.monotonic() < deadline
        time.sleep(0.02)
    return agent, node


def _send(agent: subprocess.Popen[bytes], op: dict[str, Any]) -> None:
    assert agent.stdin is not None
    agent.stdin.write(json.dumps(op).encode() + b"\n")
    agent.stdin.flush()


def _event(stream: IO[bytes]) -> dict[str, Any]:
    """The next JSON event on the agent's stdout (output frames skipped)."""
    while True:
        header = stream.readline()
        assert header, "the agent's stdout ended"
        kind, _, length = decode_header(header)
        payload = stream.read(length)
        if kind == EVENT:
            event: dict[str, Any] = json.loads(payload)
            return event


def _start(node: dict[str, Any]) -> dict[str, Any]:
    return {"op": "start", "node": node, "grace": 2.0, "heartbeat_timeout": 0.0,
            "heartbeat_interval": 5.0}  # fmt: skip


def test_the_agent_reports_once_the_released_rank_has_imported_torch(tmp_path: Path) -> None:
    agent, node = _setup(tmp_path)
    assert agent.stdout is not None
    try:
        _send(agent, _start(node))
        _send(agent, {"op": "hb"})  # heartbeats meanwhile do not end the wait
        time.sleep(1.5)  # time enough for the agent to report, were it not waiting
        released = time.time()
        (tmp_path / "release").touch()
        first = _event(agent.stdout)  # rank_start or started: the agent runs now
        assert first["event"] in ("started", "rank_start"), first
        assert first["time"] >= released  # loaded and reported after the import
        assert agent.wait(timeout=60) == 0
        assert (tmp_path / "out").read_text() == "ran"
    finally:
        agent.kill()
        agent.wait()


def test_a_stop_during_the_wait_is_acted_upon_and_the_script_never_runs(tmp_path: Path) -> None:
    agent, node = _setup(tmp_path)
    assert agent.stdout is not None
    try:
        _send(agent, _start(node))
        _send(agent, {"op": "stop", "grace": 1.0})  # read while waiting: not lost
        names: list[str] = []
        while not names or names[-1] != "node_exit":
            names.append(_event(agent.stdout)["event"])
        assert "stopping" in names, names
        assert agent.wait(timeout=60) == 0
        assert not (tmp_path / "out").exists()  # stopped inside its import of torch
    finally:
        (tmp_path / "release").touch()
        agent.kill()
        agent.wait()
