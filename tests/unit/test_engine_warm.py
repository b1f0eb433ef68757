"""local:N with the pre-flight on: every node's agent is started and probed while the
checklist runs, and the launch uses those agents (scripted fake transport; the
checklist replaced at its seam, ``Job._checklist``)."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import corral
from corral.cluster import Cluster, Host, load_cluster
from corral.errors import CheckFailed
from corral.job.engine import Job
from corral.job.options import SupervisionPolicy
from corral.job.states import JobState
from corral.plan.spec import JobSpec
from corral.transport.fake import FakeNode, FakeTransport

HOSTS = ("local-0", "local-1")


class CountingTransport(FakeTransport):
    """The fake transport, keeping every node it started (a host may be started twice)."""

    def __init__(self, behaviours: Mapping[str, Any]) -> None:
        super().__init__(behaviours)
        self.started: list[FakeNode] = []
        self.envs: dict[int, dict[str, str]] = {}
        self.probed: set[str] = set()

    async def start(
        self,
        host: Host,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> FakeNode:
        node = await super().start(host, argv, env=env, cwd=cwd)
        self.envs[id(node)] = dict(env or {})
        self.started.append(node)
        return node


def agent(transport: CountingTransport) -> Callable[[FakeNode], Any]:
    """An agent that answers its probe, then runs its rank when told to start."""

    async def behaviour(node: FakeNode) -> int:
        op = await node.next_op()
        if op["op"] == "probe":
            node.event(
                "probe",
                executable=sys.executable,
                hostname=node.host.name,
                torch=True,
                workdir_ok=True,
                port=None,
                version=corral.__version__,
            )
            transport.probed.add(node.host.name)
            op = await node.next_op()
            if op["op"] != "start":
                return 0  # aborted before anything was launched
        rank = HOSTS.index(node.host.name)
        node.event("started", pid=1, pgids=[1])
        node.event("rank_start", rank=rank, pid=100 + rank)
        node.event("rank_exit", rank=rank, code=0, eof_time=time.time())
        node.event("node_exit", code=0, ranks={})
        return 0

    return behaviour


def _job(tmp_path: Path, transport: CountingTransport) -> Job:
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    spec = JobSpec(
        script=str(script),
        launcher="python",
        job_id="j1",
        master_port=0,
        run_dir=str(tmp_path / "runs"),
    )
    return Job(
        spec,
        load_cluster("local:2"),
        supervision=SupervisionPolicy(grace=5.0),
        transport=transport,
    )


def _checklist(
    transport: CountingTransport, seen: list[set[str]], outcome: Callable[[Cluster], Any]
) -> Any:
    async def checklist(self: Job, prepared: Any, _transport: Any, _sync: Any) -> Any:
        # the agents answer their probe while the checklist is still running
        async def probed() -> None:
            while transport.probed != set(HOSTS):
                await asyncio.sleep(0.01)

        await asyncio.wait_for(probed(), 10)
        seen.append(set(transport.probed))
        return outcome(self.cluster)

    return checklist


def _passed(cluster: Cluster) -> Any:
    return SimpleNamespace(cluster=cluster, interfaces={})


def test_agents_start_during_the_checklist_and_run_the_launch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    transport = CountingTransport({})
    transport.behaviours = {h: agent(transport) for h in HOSTS}
    seen: list[set[str]] = []
    monkeypatch.setattr(Job, "_checklist", _checklist(transport, seen, _passed))
    job = _job(tmp_path, transport)
    result = asyncio.run(asyncio.wait_for(job.run(), 20))
    assert seen == [set(HOSTS)]
    assert result.state == JobState.SUCCEEDED and result.exit_code == 0
    # one agent per node: the probed one got the start message
    assert sorted(n.host.name for n in transport.started) == list(HOSTS)
    for node in transport.started:
        assert [op["op"] for op in node.received] == ["probe", "start"]
        assert node.argv[1:] == ["-m", "corral.agent"]  # the supervisor's own command
        assert transport.envs[id(node)] == {"CORRAL_JOB_ID": "j1"}  # not stale for the pre-flight


def test_a_failed_checklist_sends_the_started_agents_away(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    transport = CountingTransport({})
    transport.behaviours = {h: agent(transport) for h in HOSTS}

    def failed(cluster: Cluster) -> Any:
        raise CheckFailed([])

    monkeypatch.setattr(Job, "_checklist", _checklist(transport, [], failed))
    job = _job(tmp_path, transport)
    with pytest.raises(CheckFailed):
        asyncio.run(asyncio.wait_for(job.run(), 20))
    assert job.state == JobState.FAILED
    for node in transport.started:
        assert [op["op"] for op in node.received] == ["probe", "abort"]
        assert node.stdin_closed


def test_a_host_dropped_by_the_checklist_loses_its_agent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    transport = CountingTransport({})
    transport.behaviours = {h: agent(transport) for h in HOSTS}

    def without_second(cluster: Cluster) -> Any:
        return _passed(Cluster(cluster.hosts[:1], source=cluster.source))

    monkeypatch.setattr(Job, "_checklist", _checklist(transport, [], without_second))
    job = _job(tmp_path, transport)
    result = asyncio.run(asyncio.wait_for(job.run(), 20))
    assert result.state == JobState.SUCCEEDED
    ops = {n.host.name: [op["op"] for op in n.received] for n in transport.started}
    assert ops == {"local-0": ["probe", "start"], "local-1": ["probe", "abort"]}


def test_an_agent_that_does_not_answer_is_left_to_the_supervisor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    transport = CountingTransport({})
    answering = agent(transport)
    tries: dict[str, int] = {}

    async def mute_first(node: FakeNode) -> int:
        tries[node.host.name] = tries.get(node.host.name, 0) + 1
        if node.host.name == "local-1" and tries["local-1"] == 1:
            transport.probed.add(node.host.name)
            return 1  # exits without answering its probe
        return int(await answering(node))

    transport.behaviours = {h: mute_first for h in HOSTS}
    monkeypatch.setattr(Job, "_checklist", _checklist(transport, [], _passed))
    job = _job(tmp_path, transport)
    result = asyncio.run(asyncio.wait_for(job.run(), 20))
    assert result.state == JobState.SUCCEEDED
    ops = [(n.host.name, [op["op"] for op in n.received]) for n in transport.started]
    assert ("local-0", ["probe", "start"]) in ops
    assert ops.count(("local-1", ["start"])) == 1  # started again, as without the head start
