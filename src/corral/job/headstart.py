"""A launch's head start: the agents of ``local:N`` nodes started before the engine loads.

``corral run --hosts local:N`` spawns each node's agent (``python -m corral.agent``,
the job's id in its environment) as soon as its options are parsed, before the
engine's modules (the job, its policies, the checklist, tracking, the output) are
imported: the agents' interpreters start meanwhile. :class:`HeadStart` is then the
job's transport: when the engine starts exactly such an agent (the same host,
command, environment and working directory) it is handed the one already running;
anything else is started as it asks.

Once the options are validated, :meth:`HeadStart.prestart` sends each agent its
node's plan (:func:`head_plans`: the job's spec planned as the engine plans its
first attempt, :func:`first_plan`, still without the engine) as its first line: the
agent starts the node's launcher or ranks at once, held at their gates
(:mod:`corral.agent.prestart`), where the engine's probe would start them only
after the engine is imported, the job built and planned. The probe carries the
engine's own plan, which the agent verifies against the one its processes were
started with: processes that cannot run it are killed and the engine's plan is
started (:func:`corral.agent.prestart.prestart`); only what the processes read
after their gate may differ (the master port each plan picked, for one), and the
start message gives them the engine's. Nothing of the job runs before the checklist
passed: an agent never asked for (a refused option, a run without the pre-flight)
or told to abort kills its held processes, leaves nothing behind and exits at the
end of its stdin; it is killed at :meth:`HeadStart.close`.

When the job's launcher is already known to be torchrun when the agents start
(:func:`warm_module`), each agent is asked to start it *warm*, before it has any
plan (:mod:`corral.agent.warm`): torchrun imports torch while the coordinator
loads, validates and plans; the first plan adopts it when it can run it.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from corral.agent.gate import TORCHRUN
from corral.agent.protocol import encode_op
from corral.agent.warm import agent_argv
from corral.cluster.model import Cluster, Host
from corral.contract import JOB_ID_ENV
from corral.errors import CorralError
from corral.remote.python import agent_argv as remote_agent_argv
from corral.transport.base import NodeProcess, Transport
from corral.transport.local import LocalTransport

if TYPE_CHECKING:
    from corral.job.resolve import Prepared
    from corral.plan.spec import JobSpec
    from corral.recovery.restart import AttemptLog
    from corral.transport.ssh import SshTransport

#: How long :meth:`HeadStart.close` waits for the agents never asked for to end (s).
END_WAIT = 10.0

_Key = tuple[str, tuple[str, ...], tuple[tuple[str, str], ...], str | None]


def node_agent_argv(host: Host, python: str | None) -> list[str]:
    """How ``host`` starts its node agent: its own interpreter, else the job's
    (``--python``), else ``python3``."""
    return [host.python or python or "python3", "-m", "corral.agent"]


def warm_module(launcher: str | None) -> str | None:
    """The module a node's agent can start warm for ``launcher`` (torchrun's), if any."""
    return TORCHRUN if launcher == "torchrun" else None


def first_plan(spec: JobSpec, cluster: Cluster) -> tuple[Prepared, AttemptLog]:
    """The first attempt's plan of ``spec`` on ``cluster`` as the engine plans it
    (resolved for this machine: on ``local:N`` a free master port picked), numbered
    after the job's attempts so far (a job id used before), and those attempts."""
    from corral.job.resolve import plan_attempt, resolve
    from corral.recovery.restart import AttemptLog

    prepared = plan_attempt(resolve(spec, cluster), cluster)
    history = AttemptLog.load(prepared.job_dir)
    if history.records:
        prepared = plan_attempt(prepared.spec, cluster, history.next_number)
    return prepared, history


def head_plans(spec: JobSpec, cluster: Cluster) -> dict[str, dict[str, Any]]:
    """Each node's plan (by host) to start its processes ahead with: the job's built
    ``spec`` (:func:`~corral.job.build.build_job`, no engine) planned by
    :func:`first_plan`; empty when it cannot be planned (the engine says why)."""
    try:
        prepared, _ = first_plan(spec, cluster)
    except CorralError:
        return {}
    return {c.host.name: c.to_json() for c in prepared.commands}


def _key(host: Host, argv: Sequence[str], env: Mapping[str, str] | None, cwd: str | None) -> _Key:
    return host.name, tuple(argv), tuple(sorted((env or {}).items())), cwd


class HeadStart:
    """A transport (local by default) whose agents may have been started before they
    are asked for."""

    def __init__(self, transport: Transport | None = None) -> None:
        self._transport: Transport = transport if transport is not None else LocalTransport()
        self._ready: dict[_Key, NodeProcess] = {}
        self._starting: dict[_Key, asyncio.Future[NodeProcess]] = {}

    async def spawn(
        self, cluster: Cluster, python: str | None, job_id: str, launcher: str | None = None
    ) -> None:
        """Start the agent of every host of ``cluster`` now, with ``python`` (None:
        this interpreter, as the engine plans a local job; a host whose agent cannot
        start is left to the engine, which reports it); ``launcher``: the job's, when
        known (torchrun's is started warm, :func:`warm_module`). Each is handed to
        the engine for the agent command it would start (the same without the warm
        launcher: the agent runs any plan, adopting its warm launcher when it can)."""
        env = {JOB_ID_ENV: job_id}
        for host in cluster.hosts:
            argv = node_agent_argv(host, python or sys.executable)
            with contextlib.suppress(CorralError):
                warm = agent_argv(argv, warm_module(launcher))
                proc = await self._transport.start(host, warm, env=env)
                self._ready[_key(host, argv, env, None)] = proc

    @classmethod
    async def adopting(
        cls,
        cluster: Cluster,
        argv: Sequence[str],
        env: Mapping[str, str],
        started: Sequence[tuple[int, int, int, int]],
    ) -> HeadStart:
        """A head start of the agents the entry point started before the event loop
        (:mod:`corral.cli.entry`): the ``started`` ``(pid, stdin, stdout, stderr)`` of
        the first hosts of ``cluster``, each the agent ``argv`` with ``env`` (warm or
        not) that :meth:`spawn` would have started."""
        local = LocalTransport()
        head = cls(local)
        for host, (pid, stdin, stdout, stderr) in zip(cluster.hosts, started, strict=False):
            proc = await local.adopt(host, pid, stdin, stdout, stderr)
            head._ready[_key(host, argv, env, None)] = proc
        return head

    def spawn_remote(
        self, cluster: Cluster, python: str | None, job_id: str, launcher: str | None = None
    ) -> None:
        """Start every SSH host's agent (:func:`corral.remote.python.agent_argv`, with
        ``launcher``'s warm launcher when it has one) on a task of its own, now: the
        connections open and the agents start while the engine loads. The engine's
        start of the same agent command awaits that task, and gets its error (an
        unreachable host, a refused key) as its own start would have."""
        env = {JOB_ID_ENV: job_id}
        argv = remote_agent_argv(python)
        warm = remote_agent_argv(python, warm_module(launcher))
        for host in cluster.hosts:
            task = asyncio.ensure_future(self._transport.start(host, warm, env=env))
            task.add_done_callback(_retrieve)
            self._starting[_key(host, argv, env, None)] = task

    def prestart(self, nodes: Mapping[str, Mapping[str, Any]]) -> None:
        """Send each agent started ahead its node's plan (by host name) to start its
        processes with, held at their gates until the start message."""
        for (host, *_), proc in self._ready.items():
            node = nodes.get(host)
            if node is not None:
                proc.write(encode_op({"op": "prestart", "node": dict(node)}))

    @property
    def waiting(self) -> int:
        """How many agents started ahead are not asked for yet."""
        return len(self._ready) + len(self._starting)

    async def start(
        self,
        host: Host,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> NodeProcess:
        """The agent started ahead for exactly this command, else ``argv`` started now
        (and the host's agent started ahead for another command is ended: the
        processes it may have started for the node are not the job's)."""
        key = _key(host, argv, env, cwd)
        ready = self._ready.pop(key, None)
        if ready is not None:
            return ready
        starting = self._starting.pop(key, None)
        if starting is not None:
            return await starting
        for other in [k for k in self._ready if k[0] == host.name]:
            self._ready.pop(other).close_stdin()
        for other in [k for k in self._starting if k[0] == host.name]:
            self._starting.pop(other).add_done_callback(_end_started)
        return await self._transport.start(host, argv, env=env, cwd=cwd)

    async def close(self) -> None:
        """End the agents never asked for (at the end of their stdin each kills what
        it started and removes the node's directory it made; waited for, at most
        :data:`END_WAIT` s), and kill any process still running."""
        starting = list(self._starting.values())
        self._starting.clear()
        for task in starting:  # a connection still opening is given up
            task.cancel()
        await asyncio.gather(*starting, return_exceptions=True)
        unused = list(self._ready.values())
        unused += [t.result() for t in starting if not t.cancelled() and t.exception() is None]
        self._ready.clear()
        for proc in unused:
            proc.close_stdin()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.gather(*(p.wait() for p in unused)), END_WAIT)
        await self._transport.close()


class SshHeadStart(HeadStart):
    """A head start over SSH (:meth:`HeadStart.spawn_remote`): what the engine and the
    checklist use of the SSH transport besides ``start`` goes to it."""

    def __init__(self, transport: SshTransport) -> None:
        super().__init__(transport)
        self._ssh = transport

    async def connect(self, host: Host) -> None:
        """Open (or reuse) the connection to ``host``."""
        await self._ssh.connect(host)

    def connected(self, host: Host) -> bool:
        """Whether a live connection to ``host`` exists."""
        return self._ssh.connected(host)

    async def start_shell(
        self,
        host: Host,
        command: str,
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> NodeProcess:
        """A shell command line started on ``host`` by its login shell."""
        return await self._ssh.start_shell(host, command, env=env, cwd=cwd)

    async def run(self, host: Host, command: str, *, timeout: float | None = None) -> Any:
        """A shell command line run to completion on ``host`` (its output collected)."""
        return await self._ssh.run(host, command, timeout=timeout)


def _retrieve(task: asyncio.Future[NodeProcess]) -> None:
    """Mark a start's error as seen (it is the engine's to report, if it asks)."""
    if not task.cancelled():
        task.exception()


def _end_started(task: asyncio.Future[NodeProcess]) -> None:
    """End an agent started ahead for a command nobody asked for (at its stdin's end)."""
    if not task.cancelled() and task.exception() is None:
        task.result().close_stdin()
