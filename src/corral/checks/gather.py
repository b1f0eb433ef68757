"""Collect every host's facts in parallel: one session per host runs
:mod:`corral.agent.hostfacts` (shipped, standard library only), or, for a host
whose node agent is being started meanwhile (``corral run``), the agent answers
in its own session (:class:`AgentSessions`, :mod:`corral.agent.hostcheck`); a
host whose agent did not give its facts is asked the first way.

Phase 1: every host prints its facts (the master host listens on the master
port first). Phase 2, once all are in: every reachable host makes a real TCP
connection to the master's listener, and a round trip measures the SSH latency
and the host's clock offset. Then every session is closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from corral.cluster.model import Host
from corral.errors import CorralError
from corral.remote.python import start_program
from corral.transport.base import NodeProcess, Transport

SHIPPED = ("corral.agent.fingerprint", "corral.agent.gpuprobe", "corral.agent.hostfacts")
FACTS_TIMEOUT = 60.0
REPLY_TIMEOUT = 15.0


@dataclass
class HostFacts:
    """What one host reported (``error`` set when it could not be asked)."""

    host: Host
    facts: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    start_s: float | None = None  # session start (SSH connect + auth + exec)
    rtt_ms: float | None = None  # one request/reply round trip over the session
    clock_offset_s: float | None = None  # host clock minus coordinator clock
    connect: dict[str, Any] | None = None  # TCP connection to the master's listener

    @property
    def ok(self) -> bool:
        """Whether the host answered."""
        return self.error is None


@dataclass(frozen=True)
class GatherRequest:
    """What to ask each host."""

    launcher: str = "torchrun"
    workdir: str | None = None
    code_dir: str | None = None
    script: str | None = None
    extra_ignores: tuple[str, ...] = ()
    checkpoint_dir: str | None = None
    master_addr: str | None = None
    master_port: int | None = None
    connect_timeout: float = 5.0
    job_id: str | None = None  # its processes are not stale
    binaries: tuple[str, ...] = ()  # executables to look for besides the launcher's own

    def params(self, listen: bool) -> dict[str, Any]:
        """The JSON arguments of one host's session."""
        return {
            "launcher": self.launcher,
            "workdir": self.workdir,
            "code_dir": self.code_dir,
            "script": self.script,
            "extra_ignores": list(self.extra_ignores),
            "checkpoint_dir": self.checkpoint_dir,
            "master_addr": self.master_addr,
            "listen_port": self.master_port if listen else None,
            "job_id": self.job_id,
            "binaries": list(self.binaries),
        }


async def _read_json(proc: NodeProcess, timeout: float) -> dict[str, Any] | None:
    while True:
        line = await asyncio.wait_for(proc.stdout.readline(), timeout)
        if not line:
            return None
        text = line.decode(errors="replace").strip()
        if text.startswith("{"):
            with contextlib.suppress(ValueError):
                data = json.loads(text)
                if isinstance(data, dict):
                    return data


async def _failure(proc: NodeProcess) -> str:
    with contextlib.suppress(asyncio.TimeoutError):
        err = await asyncio.wait_for(proc.stderr.read(), 5)
        lines = err.decode(errors="replace").strip().splitlines()
        code = await asyncio.wait_for(proc.wait(), 5)
        return lines[-1] if lines else f"the check session exited with code {code}"
    return "the check session ended without an answer"


class HostSession(Protocol):
    """A session some other part of corral opened on a host that already has the
    host's facts and answers the checklist's ``connect`` / ``time`` requests (a
    node agent's: :class:`corral.job.agents.AgentSession`)."""

    facts: dict[str, Any]
    start_s: float | None

    async def ask(self, op: dict[str, Any], timeout: float) -> dict[str, Any] | None:
        """Send one request; its answer (None: the session ended)."""
        ...


class AgentSessions:
    """Where the checklist and the node agents being started meet. The checklist
    posts what it asks each host (:meth:`post`) before it waits for anything, so
    each agent's probe, written once its process runs, can carry its host's
    parameters (:meth:`params`); the agent's start-up answers with a
    :class:`HostSession` or None (:meth:`answered`) and the checklist takes that
    session (:meth:`session`; None: it asks the host its own way). Agents are told
    to exit only once the checklist is done with them (:meth:`finish`,
    :meth:`finished`)."""

    def __init__(self, hosts: Iterable[str]) -> None:
        self.hosts = frozenset(hosts)
        self._params: dict[str, dict[str, Any]] = {}
        self._done: asyncio.Event | None = None
        self._sessions: dict[str, asyncio.Future[HostSession | str | None]] = {}

    def post(self, params: Mapping[str, dict[str, Any]]) -> None:
        """The parameters of the hosts the checklist asks (the others get none)."""
        self._params.update({h: p for h, p in params.items() if h in self.hosts})

    def params(self, host: str) -> dict[str, Any] | None:
        """``host``'s parameters (None: not posted; its probe asks for no facts)."""
        return self._params.get(host)

    def _future(self, host: str) -> asyncio.Future[HostSession | str | None]:
        if host not in self._sessions:
            self._sessions[host] = asyncio.get_running_loop().create_future()
        return self._sessions[host]

    def answered(self, host: str, session: HostSession | str | None) -> None:
        """``host``'s agent answered with its facts (``session``), or without (None),
        or the host could not be reached (the error: not tried a second time)."""
        future = self._future(host)
        if not future.done():
            future.set_result(session)

    async def session(self, host: str) -> HostSession | str | None:
        """``host``'s agent session once its probe was answered (None: no facts;
        a string: why the host could not be reached)."""
        if host not in self.hosts or host not in self._params:
            return None
        return await self._future(host)

    def _done_event(self) -> asyncio.Event:
        if self._done is None:
            self._done = asyncio.Event()
        return self._done

    def finish(self) -> None:
        """The checklist is done (or never ran): it asks the agents nothing more."""
        self._done_event().set()

    async def finished(self) -> None:
        """Wait until the checklist is done with the agents' sessions."""
        await self._done_event().wait()


class _Session:
    def __init__(
        self,
        host: Host,
        proc: NodeProcess | None,
        result: HostFacts,
        borrowed: HostSession | None = None,
    ) -> None:
        self.host = host
        self.proc = proc
        self.result = result
        self.borrowed = borrowed  # an agent's session: asked through it, never closed

    @property
    def open(self) -> bool:
        """Whether requests can be sent."""
        return self.proc is not None or self.borrowed is not None

    async def ask(self, op: dict[str, Any], timeout: float) -> dict[str, Any] | None:
        if self.borrowed is not None:
            return await self.borrowed.ask(op, timeout)
        assert self.proc is not None
        self.proc.write((json.dumps(op) + "\n").encode())
        return await _read_json(self.proc, timeout)


async def _open(
    transport: Transport, host: Host, python: str | None, params: dict[str, Any]
) -> _Session:
    result = HostFacts(host=host)
    started = time.monotonic()
    try:
        # the host's own env (hostfile/YAML) applies: it is the job's environment too
        proc = await start_program(
            transport, host, python, SHIPPED, "corral.agent.hostfacts:main", params
        )
    except CorralError as exc:
        result.error = str(exc)
        return _Session(host, None, result)
    result.start_s = time.monotonic() - started
    try:
        facts = await _read_json(proc, FACTS_TIMEOUT)
    except asyncio.TimeoutError:
        facts = None
        result.error = f"no answer within {FACTS_TIMEOUT:g} s"
    except CorralError as exc:
        facts = None
        result.error = str(exc)
    if facts is None:
        if result.error is None:
            result.error = await _failure(proc)
        with contextlib.suppress(Exception):
            proc.close_stdin()
        return _Session(host, None, result)
    result.facts = facts
    return _Session(host, proc, result)


async def _phase_two(session: _Session, target: tuple[str, int] | None, timeout: float) -> None:
    result = session.result
    try:
        if target is not None:
            addr, port = target
            op = {"op": "connect", "addr": addr, "port": port, "timeout": timeout}
            result.connect = await session.ask(op, timeout + REPLY_TIMEOUT)
        sent = time.time()
        reply = await session.ask({"op": "time"}, REPLY_TIMEOUT)
        received = time.time()
        if reply is not None and "time" in reply:
            result.rtt_ms = (received - sent) * 1000
            result.clock_offset_s = float(reply["time"]) - (sent + received) / 2
    except (asyncio.TimeoutError, CorralError) as exc:
        result.error = result.error or f"the check session stopped answering ({exc})"


async def _close(session: _Session) -> None:
    proc = session.proc
    if proc is None:
        return
    proc.close_stdin()
    try:
        await asyncio.wait_for(proc.wait(), 10)
    except asyncio.TimeoutError:
        proc.signal(9)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(proc.wait(), 5)


async def _open_or_borrow(
    transport: Transport,
    host: Host,
    python: str | None,
    params: dict[str, Any],
    agents: AgentSessions | None,
) -> _Session:
    borrowed = await agents.session(host.name) if agents is not None else None
    if borrowed is None:
        return await _open(transport, host, python, params)
    if isinstance(borrowed, str):  # the agent's connection failed: so would this one
        return _Session(host, None, HostFacts(host=host, error=borrowed))
    result = HostFacts(host=host, facts=borrowed.facts, start_s=borrowed.start_s)
    return _Session(host, None, result, borrowed)


def host_params(
    request: GatherRequest, hosts: Sequence[Host], master: Host | None
) -> dict[str, dict[str, Any]]:
    """What each host is asked (the master host also listens on the master port)."""
    return {h.name: request.params(master is not None and h == master) for h in hosts}


async def gather(
    transport: Transport,
    hosts: Sequence[Host],
    request: GatherRequest,
    *,
    master: Host | None,
    python: str | None = None,
    agents: AgentSessions | None = None,
) -> dict[str, HostFacts]:
    """Ask every host at once; returns each host's facts (or why it could not).
    ``agents``: the node agents being started, which answer for the hosts whose
    parameters were posted (:meth:`AgentSessions.post`)."""
    params = host_params(request, hosts, master)
    sessions = await asyncio.gather(
        *(_open_or_borrow(transport, h, python, params[h.name], agents) for h in hosts)
    )
    try:
        target: tuple[str, int] | None = None
        if master is not None and request.master_addr:
            listener = next(
                (s.result.facts.get("listener") for s in sessions if s.host == master), None
            )
            if listener and listener.get("port"):
                target = (request.master_addr, int(listener["port"]))
        await asyncio.gather(
            *(_phase_two(s, target, request.connect_timeout) for s in sessions if s.open)
        )
    finally:
        await asyncio.gather(*(_close(s) for s in sessions), return_exceptions=True)
    return {s.host.name: s.result for s in sessions}
