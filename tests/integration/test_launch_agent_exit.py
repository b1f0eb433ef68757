"""A rank's exit code reaches its node agent as one line on its control connection; the
agent reads that line with the standard library, so a job whose ranks send nothing
else (no SDK reports) never loads pydantic in its agents (0.1-0.25 CPU-s each, at
the moment every rank exits). Real agent and rank processes, stdlib scripts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import corral
from corral.agent.protocol import EVENT, decode_header

SRC = str(Path(corral.__file__).parents[1])
AGENT = """
import atexit, runpy, sys
atexit.register(lambda: print("PYDANTIC", "pydantic" in sys.modules, file=sys.stderr))
runpy.run_module("corral.agent", run_name="__main__")
"""


def _node_events(tmp_path: Path, script: str) -> tuple[list[dict[str, Any]], str]:
    """Run one node of one rank of ``script`` under a real agent; its events and the
    agent's stderr."""
    (tmp_path / "script.py").write_text(script)
    node = {
        "argv": [sys.executable, "-u", "-m", "corral.agent.worker", "script.py"],
        "cwd": str(tmp_path),
        "env": {
            "CORRAL_NODE_DIR": str(tmp_path / "node"),
            "CORRAL_JOB_ID": "exitjob",
            "CORRAL_FLIGHT_RECORDER": "0",
            "PYTHONPATH": SRC,
        },
        "ranks": [{"rank": 0, "local_rank": 0, "env": {"RANK": "0", "LOCAL_RANK": "0"}}],
    }
    start = {"op": "start", "node": node, "grace": 2.0, "heartbeat_timeout": 0.0}
    agent = subprocess.Popen(
        [sys.executable, "-c", AGENT],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": SRC},
        cwd=tmp_path,
    )
    assert agent.stdin is not None and agent.stdout is not None
    agent.stdin.write(json.dumps(start).encode() + b"\n")
    agent.stdin.flush()
    events: list[dict[str, Any]] = []
    try:
        while not events or events[-1]["event"] != "node_exit":
            header = agent.stdout.readline()
            assert header, "the agent's stdout ended"
            kind, _, length = decode_header(header)
            payload = agent.stdout.read(length)
            if kind == EVENT:
                events.append(json.loads(payload))
        agent.stdin.close()
        assert agent.stderr is not None
        err = agent.stderr.read().decode()  # until the agent exits
        assert agent.wait(timeout=60) == 0
    finally:
        agent.kill()
        agent.wait()
    return events, err


@pytest.mark.parametrize(("script", "code"), [("pass\n", 0), ("raise SystemExit(3)\n", 3)])
def test_a_ranks_exit_code_is_read_without_pydantic(tmp_path: Path, script: str, code: int) -> None:
    events, err = _node_events(tmp_path, script)
    exits = [(e["rank"], e["code"]) for e in events if e["event"] == "rank_exit"]
    assert exits == [(0, code)], events
    assert "PYDANTIC False" in err, err


def test_the_stdlib_reading_accepts_only_exit_lines_the_validator_accepts() -> None:
    from corral.agent.messages import ExitMessage, parse_message
    from corral.agent.node import exit_code

    for line, expected in [
        (b'{"type": "exit", "code": 3}', 3),
        (b'{"code": -255, "type": "exit"}\n', -255),
        (b'{"type": "exit", "code": true}', None),  # left to the validator (refused)
        (b'{"type": "exit", "code": 300}', None),
        (b'{"type": "exit", "code": 1, "rank": 0}', None),  # the validator drops the rest
        (b'{"type": "progress", "step": 1, "exit": "exit"}', None),
        (b'"exit"', None),
    ]:
        assert exit_code(line) == expected, line
        if expected is not None:
            message = parse_message(line)
            assert isinstance(message, ExitMessage) and message.code == expected
