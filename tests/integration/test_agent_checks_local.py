"""The pre-flight's host checks answered in the node agent's own session (real
processes): the probe carries the host's facts, the master port is listened on
while the checks run and free before the launch, the checklist asks a host whose
agent gave no facts its own way, and a local launch starts no check program."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from corral.agent.protocol import decode_header, encode_op
from corral.checks.gather import AgentSessions, GatherRequest, gather
from corral.cluster.hostfile import load_cluster
from corral.cluster.model import Host
from corral.job.agents import start_agent
from corral.job.engine import Job
from corral.job.events import Checked, JobEvent
from corral.job.states import JobState
from corral.plan.spec import JobSpec
from corral.transport.local import LocalProcess, LocalTransport

SHIPPED_CALL = "corral.agent.hostfacts:main"


class RecordingTransport(LocalTransport):
    """LocalTransport that remembers every command it started."""

    def __init__(self) -> None:
        super().__init__()
        self.argvs: list[list[str]] = []

    async def start(
        self,
        host: Host,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> LocalProcess:
        self.argvs.append(list(argv))
        return await super().start(host, argv, env=env, cwd=cwd)

    def programs(self) -> list[list[str]]:
        """The shipped host-check programs started (their label is the call)."""
        return [a for a in self.argvs if SHIPPED_CALL in a]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("", 0))
        return int(sock.getsockname()[1])


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("", port))
        except OSError:
            return False
        return True


def _read_event(out: Any) -> dict[str, Any]:
    _, _, length = decode_header(out.readline())
    event: dict[str, Any] = json.loads(out.read(length))
    return event


def test_the_probe_carries_the_facts_and_the_master_port_is_free_before_the_launch(
    tmp_path: Path,
) -> None:
    port = _free_port()
    params = GatherRequest(workdir=str(tmp_path), master_addr="127.0.0.1", job_id="j").params(True)
    params["listen_port"] = port
    agent = subprocess.Popen(
        [sys.executable, "-m", "corral.agent"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert agent.stdin is not None and agent.stdout is not None
    try:
        agent.stdin.write(encode_op({"op": "probe", "workdir": str(tmp_path), "facts": params}))
        agent.stdin.flush()
        probe = _read_event(agent.stdout)
        facts = probe["facts"]
        assert probe["event"] == "probe" and facts["event"] == "facts"
        assert facts["software"]["python_executable"] == sys.executable
        assert facts["workdir"] == {"path": str(tmp_path), "exists": True}
        assert facts["listener"]["free"] and facts["listener"]["port"] == port
        assert not _bindable(port)  # listened on while the checks run

        for op in ({"op": "time"}, {"op": "connect", "addr": "127.0.0.1", "port": port}):
            agent.stdin.write(encode_op({**op, "timeout": 2.0}))
            agent.stdin.flush()
            answer = _read_event(agent.stdout)
            assert answer["event"] == op["op"]
        assert answer["ok"] is True  # the connection reached the listener

        agent.stdin.write(encode_op({"op": "abort"}))
        agent.stdin.flush()
        assert agent.wait(timeout=30) == 0
    finally:
        agent.kill()
        agent.wait()
    assert _bindable(port)  # nothing holds the master port once the agent is done


def _request(tmp_path: Path) -> GatherRequest:
    return GatherRequest(
        workdir=str(tmp_path), master_addr="127.0.0.1", master_port=_free_port(), job_id="j2"
    )


def test_the_checklist_asks_through_the_agent_and_starts_no_program(tmp_path: Path) -> None:
    host = Host(name="box")  # not local: the shipped program would travel over stdin

    async def main() -> tuple[dict[str, Any], RecordingTransport]:
        transport = RecordingTransport()
        agents = AgentSessions([host.name])
        request = _request(tmp_path)
        agents.post({host.name: request.params(True)})
        try:
            starting = asyncio.ensure_future(
                start_agent(transport, host, python=None, workdir=None, port=None, checks=agents)
            )
            facts = await gather(transport, [host], request, master=host, agents=agents)
            proc, probe = await starting
            assert probe.facts is not None
            proc.write(encode_op({"op": "abort"}))
            proc.close_stdin()
            assert await asyncio.wait_for(proc.wait(), 30) == 0
        finally:
            await transport.close()
        return {name: f for name, f in facts.items()}, transport

    facts, transport = asyncio.run(main())
    box = facts["box"]
    assert box.ok and box.facts["hostname"] == socket.gethostname()
    assert box.connect is not None and box.connect["ok"]  # its own listener, asked through it
    assert box.rtt_ms is not None and box.start_s is not None
    assert transport.programs() == []
    assert len(transport.argvs) == 1 and "corral.agent" in " ".join(transport.argvs[0])


def _ask_after(tmp_path: Path, answered: str | None) -> tuple[Any, RecordingTransport]:
    """gather() for one host whose agent ``answered`` no facts (None) or could not
    reach it (the error)."""
    host = Host(name="box")

    async def main() -> tuple[Any, RecordingTransport]:
        transport = RecordingTransport()
        agents = AgentSessions([host.name])
        request = _request(tmp_path)
        agents.post({host.name: request.params(True)})
        agents.answered(host.name, answered)
        try:
            facts = await gather(transport, [host], request, master=host, agents=agents)
        finally:
            await transport.close()
        return facts["box"], transport

    return asyncio.run(main())


def test_a_host_whose_agent_gave_no_facts_is_asked_its_own_way(tmp_path: Path) -> None:
    box, transport = _ask_after(tmp_path, None)  # e.g. an agent that could not start
    assert box.ok and box.facts["event"] == "facts"
    assert len(transport.programs()) == 1


def test_a_host_its_agent_could_not_reach_is_not_tried_a_second_time(tmp_path: Path) -> None:
    box, transport = _ask_after(tmp_path, "box: cannot connect: connection refused")
    assert box.error == "box: cannot connect: connection refused"
    assert transport.argvs == []


def test_a_local_launch_checks_its_host_through_an_agent(tmp_path: Path) -> None:
    script = tmp_path / "hello.py"
    script.write_text("print('hello from', __import__('os').environ['RANK'])\n")
    transport = RecordingTransport()
    spec = JobSpec(
        script=str(script),
        launcher="python",
        job_id="agentcheck",
        master_port=0,
        workdir=str(tmp_path),
        run_dir=str(tmp_path / "runs"),
    )
    job = Job(spec, load_cluster("local:2"), transport=transport)
    events: list[JobEvent] = []
    job.subscribe(events.append)

    async def main() -> Any:
        try:
            return await asyncio.wait_for(job.run(), 120)
        finally:
            await transport.close()

    result = asyncio.run(main())
    assert result.state == JobState.SUCCEEDED
    checked = [e for e in events if isinstance(e, Checked)]
    assert len(checked) == 1 and not checked[0].blocking
    software = checked[0].report.check("software")
    assert software.status.value == "pass"
    assert transport.programs() == []  # the host was asked by local-0's agent
    agents = [a for a in transport.argvs if a[1:] == ["-m", "corral.agent"]]
    assert len(agents) == 2
