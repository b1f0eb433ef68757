"""Collect every host's facts in parallel: one session per host runs
:mod:`corral.checks.hostside` (shipped, standard library only).

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
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from corral.cluster.model import Host
from corral.errors import CorralError
from corral.remote.python import start_program
from corral.transport.base import NodeProcess, Transport

SHIPPED = ("corral.sync.fingerprint", "corral.agent.gpuprobe", "corral.checks.hostside")
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


class _Session:
    def __init__(self, host: Host, proc: NodeProcess | None, result: HostFacts) -> None:
        self.host = host
        self.proc = proc
        self.result = result

    async def ask(self, op: dict[str, Any], timeout: float) -> dict[str, Any] | None:
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
            transport, host, python, SHIPPED, "corral.checks.hostside:main", params
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


async def gather(
    transport: Transport,
    hosts: Sequence[Host],
    request: GatherRequest,
    *,
    master: Host | None,
    python: str | None = None,
) -> dict[str, HostFacts]:
    """Ask every host at once; returns each host's facts (or why it could not)."""
    sessions = await asyncio.gather(
        *(
            _open(transport, h, python, request.params(master is not None and h == master))
            for h in hosts
        )
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
            *(
                _phase_two(s, target, request.connect_timeout)
                for s in sessions
                if s.proc is not None
            )
        )
    finally:
        await asyncio.gather(*(_close(s) for s in sessions), return_exceptions=True)
    return {s.host.name: s.result for s in sessions}
