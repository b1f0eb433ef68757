"""The coordinator builds its agent-event validators (pydantic) at the first event an
agent sends, not when it starts reading the agent: on ``local:N`` an agent sends none
before its launcher has imported torch, so that work does not share the CPUs with
the import (issue 34 section 4). Checked in a fresh interpreter, on the supervisor's
real frame reader fed real frames."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import corral

SRC = str(Path(corral.__file__).parents[1])

SCRIPT = """
import asyncio, json, sys, time
from types import SimpleNamespace
from corral.agent.protocol import STDOUT, encode_event, encode_frame
from corral.job.supervisor import AttemptSupervisor

seen = {}
parsed_at = []
import corral.job.supervisor as sup
_parse = sup._parse_event
def _timed(payload):
    event = _parse(payload)
    parsed_at.append(time.time())
    return event
sup._parse_event = _timed

async def main():
    reader = asyncio.StreamReader()
    events, lines = [], []
    fake = SimpleNamespace(
        _lines=lambda host, rank, payload: lines.append(payload),
        _on_event=lambda node, event: events.append({**event, "read": node.frame_at}),
        _complain=lambda node, text: events.append({"complaint": text}),
        _node_gone=lambda node, code: events.append({"event": "gone", "code": code}),
    )

    async def wait():
        return 0

    node = SimpleNamespace(
        proc=SimpleNamespace(stdout=reader, wait=wait),
        host=SimpleNamespace(name="local-0"),
        watch=SimpleNamespace(heard=lambda now: None),
    )
    task = asyncio.ensure_future(AttemptSupervisor._read_frames(fake, node))
    reader.feed_data(encode_frame(STDOUT, 0, b"a rank's line\\n"))
    while not lines:
        await asyncio.sleep(0.01)
    seen["after_a_line"] = "pydantic" in sys.modules
    fed = time.time()
    reader.feed_data(encode_event({"event": "hb", "time": time.time()}))
    reader.feed_eof()
    await task
    seen["after_an_event"] = "pydantic" in sys.modules
    seen["events"] = [e.get("event") for e in events]
    # the frame's arrival is taken before it is parsed (the clock offset uses it)
    seen["read_before_parsed"] = fed <= events[0]["read"] <= parsed_at[0]

asyncio.run(main())
print(json.dumps(seen))
"""


def test_the_event_validators_load_at_the_first_event_not_before() -> None:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PYTHONPATH": SRC, "PATH": "/usr/bin:/bin"},
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.splitlines()[-1])
    assert seen == {
        "after_a_line": False,
        "after_an_event": True,
        "events": ["hb", "gone"],
        "read_before_parsed": True,
    }


def test_a_failures_time_uses_the_least_offset_any_of_its_hosts_events_shows() -> None:
    """A host's clock offset is measured at the agent's ``started`` event, and every
    event bounds it again: a frame the coordinator read late (busy, a buffered pipe)
    only overstates it. Failures are dated with the least (an overstated offset dated a
    SIGKILLed rank's end after the stop its survivor's error caused, so the survivor was
    named the root cause); the host's reports keep the one offset of the attempt (their
    intervals, a throughput's, stay as the host measured them)."""
    from types import SimpleNamespace

    from corral.cluster.model import Host
    from corral.job.result import NodeRun
    from corral.job.supervisor import AttemptSupervisor
    from corral.states import JobState, NodeState

    host = Host(name="tb2", address="10.77.0.2", slots=1)
    node = NodeRun(command=SimpleNamespace(host=host, nproc=1))  # type: ignore[arg-type]
    fake = SimpleNamespace(nodes=[node], state=JobState.RUNNING)
    on_event = AttemptSupervisor._on_event
    sent = 1_000.0
    node.frame_at = sent + 0.8  # "started" was read 0.8 s after it was sent
    on_event(fake, node, {"event": "started", "time": sent})  # type: ignore[arg-type]
    assert node.state == NodeState.RUNNING
    assert node.failure_time(sent + 1.0) == node.to_local(sent + 1.0) == sent + 1.8
    node.frame_at = sent + 2.0 + 0.01  # a heartbeat read 10 ms after it was sent
    on_event(fake, node, {"event": "hb", "time": sent + 2.0})  # type: ignore[arg-type]
    node.frame_at = sent + 5.0 + 0.5  # read late again: the least stays
    on_event(fake, node, {"event": "hb", "time": sent + 5.0})  # type: ignore[arg-type]
    assert abs(node.failure_time(sent + 7.0) - (sent + 7.01)) < 1e-9
    assert node.to_local(sent + 7.0) == sent + 7.8  # reports: the attempt's one offset
