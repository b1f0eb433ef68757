"""The agents ``corral run`` starts ahead on SSH hosts while the engine loads
(:meth:`corral.job.headstart.HeadStart.spawn_remote`): the engine's start of the
agent command gets the one started (torchrun warm) for it; an unreachable host's
error is the engine's, from the one attempt, never a second one; what nobody asked
for is ended and a connection still opening is given up at close."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any, cast

from corral.cluster.model import Cluster, Host
from corral.contract import JOB_ID_ENV
from corral.errors import ConnectError
from corral.job.headstart import HeadStart, SshHeadStart
from corral.remote.python import agent_argv

HOSTS = tuple(Host(name=f"h{i}", address=f"10.0.0.{i}", slots=1) for i in (1, 2, 3))
CLUSTER = Cluster(hosts=HOSTS, source="test")


class _Proc:
    def __init__(self, host: Host, argv: Sequence[str]) -> None:
        self.host, self.argv, self.stdin_closed = host, list(argv), False

    def close_stdin(self) -> None:
        self.stdin_closed = True

    async def wait(self) -> int:
        return 0


class _Transport:
    """h1 starts at once, h2 is unreachable, h3 never answers."""

    def __init__(self) -> None:
        self.starts: list[tuple[str, list[str], dict[str, str] | None]] = []
        self.closed = False
        self.never: asyncio.Future[None] | None = None
        self.procs: list[_Proc] = []

    async def start(
        self,
        host: Host,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> Any:
        self.starts.append((host.name, list(argv), dict(env) if env else None))
        if host.name == "h2":
            raise ConnectError("connection refused", host=host.name, cause="refused")
        if host.name == "h3":
            self.never = asyncio.get_running_loop().create_future()
            await self.never
        self.procs.append(_Proc(host, argv))
        return self.procs[-1]

    async def close(self) -> None:
        self.closed = True


def test_the_engine_gets_the_warm_agent_and_an_unreachable_hosts_one_error() -> None:
    transport = _Transport()
    env = {JOB_ID_ENV: "job-1"}

    async def scenario() -> None:
        head = HeadStart(transport)
        head.spawn_remote(CLUSTER, None, "job-1", "torchrun")
        assert head.waiting == 3
        h1, h2, _ = HOSTS
        proc = await head.start(h1, agent_argv(None), env=env)  # the engine's command
        assert isinstance(proc, _Proc) and proc.argv == agent_argv(None, "torch.distributed.run")
        assert "--warm torch.distributed.run" in proc.argv[2]
        try:
            await head.start(h2, agent_argv(None), env=env)
        except ConnectError as exc:
            assert exc.host == "h2" and "refused" in str(exc)
        else:
            raise AssertionError("h2's error was not the engine's")
        assert [name for name, *_ in transport.starts].count("h2") == 1  # not tried twice
        assert head.waiting == 1  # h3, still connecting
        await head.close()  # gives h3 up
        assert transport.never is not None and transport.never.cancelled()
        assert transport.closed and head.waiting == 0
        assert all(e == env for *_, e in transport.starts)

    asyncio.run(scenario())


def test_agents_nobody_asked_for_are_ended() -> None:
    transport = _Transport()
    hosts = Cluster(hosts=HOSTS[:1], source="test")

    async def scenario() -> None:
        head = SshHeadStart(transport)  # type: ignore[arg-type]
        head.spawn_remote(hosts, "/opt/py/bin/python3", "job-2", "python")  # no warm launcher
        await asyncio.sleep(0)
        await head.close()
        [(_, argv, _)] = transport.starts
        assert argv == agent_argv("/opt/py/bin/python3") and "--warm" not in argv[2]

    asyncio.run(scenario())


def test_another_command_for_the_host_ends_the_agent_started_ahead() -> None:
    transport = _Transport()
    hosts = Cluster(hosts=HOSTS[:1], source="test")

    async def scenario() -> None:
        head = HeadStart(transport)
        head.spawn_remote(hosts, None, "job-3", "torchrun")
        await asyncio.sleep(0)
        other = await head.start(HOSTS[0], ["python3", "-m", "corral.agent"], env=None)
        await asyncio.sleep(0)
        ahead, started = transport.procs
        assert started is cast(_Proc, other) and not started.stdin_closed
        assert "--warm" in ahead.argv[2] and ahead.stdin_closed  # ended: not the job's
        await head.close()

    asyncio.run(scenario())
