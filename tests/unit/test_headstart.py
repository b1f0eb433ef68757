"""The agents ``corral run`` starts ahead on ``local:N`` (:mod:`corral.job.headstart`):
the engine gets the one started for exactly its command; any other is ended (at once
when the engine starts another for its host)."""

from __future__ import annotations

import asyncio
import sys
from types import SimpleNamespace
from typing import Any

import pytest

from corral.cluster.hostfile import local_cluster
from corral.contract import JOB_ID_ENV
from corral.job.headstart import HeadStart
from corral.transport.local import LocalTransport


def test_the_engine_gets_the_agent_started_for_its_command(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    started: list[list[str]] = []
    procs: list[Any] = []
    start = LocalTransport.start

    async def counting(self: LocalTransport, host: Any, argv: Any, **kwargs: Any) -> Any:
        started.append(list(argv))
        procs.append(await start(self, host, argv, **kwargs))
        return procs[-1]

    monkeypatch.setattr(LocalTransport, "start", counting)
    cluster = local_cluster(3)
    agent = [sys.executable, "-m", "corral.agent"]

    async def scenario() -> tuple[list[int], int, int, int]:
        head = HeadStart()
        await head.spawn(cluster, None, "job-1")
        assert head.waiting == 3 and started == [agent] * 3
        local0, local1, _ = cluster.hosts
        same = await head.start(local0, agent, env={JOB_ID_ENV: "job-1"})
        other = await head.start(local1, agent, env={JOB_ID_ENV: "job-2"})  # not that one
        assert len(started) == 4 and head.waiting == 1
        assert same is procs[0] and other is procs[3]
        # local-1's agent started ahead is not the job's: ended at once (its EOF)
        replaced = await asyncio.wait_for(procs[1].wait(), 30)
        for proc in (same, other):
            proc.close_stdin()  # an agent without a probe: ends
        codes = await asyncio.gather(same.wait(), other.wait())
        await head.close()  # the one never asked for ends too
        unused = await asyncio.wait_for(procs[2].wait(), 5)
        return list(codes), replaced, unused, head.waiting

    codes, replaced, unused, waiting = asyncio.run(scenario())
    assert (codes, waiting) == ([2, 2], 0)  # both asked for ran (and ended on EOF)
    assert replaced == 2  # ended at its EOF
    assert unused in (2, -9)  # ended at its EOF, else killed


def test_a_torchrun_jobs_agents_start_it_warm(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each agent is asked for a warm torchrun, and is still the one the engine gets
    for the plain agent command (the agent runs any plan)."""
    started: list[list[str]] = []

    async def recording(self: LocalTransport, host: Any, argv: Any, **kwargs: Any) -> Any:
        started.append(list(argv))
        return SimpleNamespace(host=host.name)  # no process: the seam

    monkeypatch.setattr(LocalTransport, "start", recording)
    cluster = local_cluster(2)
    agent = [sys.executable, "-m", "corral.agent"]

    async def scenario() -> list[Any]:
        head = HeadStart()
        await head.spawn(cluster, None, "job-1", "torchrun")
        await head.spawn(local_cluster(1), None, "job-2", "python")  # no warm launcher
        env = {JOB_ID_ENV: "job-1"}
        return [await head.start(host, agent, env=env) for host in cluster.hosts]

    taken = asyncio.run(scenario())
    warm = [*agent, "--warm", "torch.distributed.run"]
    assert started == [warm, warm, agent]
    assert [proc.host for proc in taken] == ["local-0", "local-1"]
