"""Ask every host about the shared data path (``--shared-data-path``).

One session per host (:mod:`corral.checks.shared_hostside`), all at once: each
describes the path; the first host where it is a directory writes a marker file
(a unique name, random content); every other host where it is a directory reads
it; the writer removes it. Nothing is judged here (see
:mod:`corral.checks.shared_data`). On ``local:N`` every node is this machine, so
one session writes and reads back, and its answers stand for every node.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import socket
from dataclasses import dataclass, field
from typing import Any

from corral.checks.gather import _read_json
from corral.cluster.model import Cluster, Host
from corral.errors import CorralError
from corral.remote.python import start_program
from corral.transport.base import NodeProcess, Transport

HOSTSIDE = "corral.checks.shared_hostside"
SESSION_TIMEOUT = 30.0  # the first answer: a stat on a hung network mount never returns
REPLY_TIMEOUT = 15.0
MARKER_PREFIX = ".corral-shared-check-"  # never code (corral.agent.fingerprint ignores it)


@dataclass
class SharedProbe:
    """What the hosts said about ``path``."""

    path: str
    marker: str  # the marker file's name in ``path``
    content: str  # what the writer put in it
    facts: dict[str, dict[str, Any]] = field(default_factory=dict)  # host -> description
    unreachable: dict[str, str] = field(default_factory=dict)  # no (more) session: why
    stuck: dict[str, str] = field(default_factory=dict)  # no answer in time: why
    writer: str | None = None  # the host that wrote the marker
    write_errors: dict[str, str] = field(default_factory=dict)  # hosts that could not
    reads: dict[str, dict[str, Any]] = field(default_factory=dict)  # host -> read reply
    remove_error: str | None = None  # the marker could not be removed

    def one_machine(self) -> bool:
        """Whether every host that answered reported the same kernel boot id (one machine
        under several names, as the netns testbed is)."""
        ids = {f.get("boot_id") for f in self.facts.values()}
        return len(ids) == 1 and None not in ids


class _Session:
    def __init__(self, host: Host, probe: SharedProbe) -> None:
        self.host = host
        self.probe = probe
        self.proc: NodeProcess | None = None

    async def open(self, transport: Transport, python: str | None) -> None:
        params = {"path": self.probe.path}
        try:
            self.proc = await start_program(
                transport, self.host, python, (HOSTSIDE,), f"{HOSTSIDE}:main", params
            )
        except CorralError as exc:
            self.probe.unreachable[self.host.name] = str(exc)
            return
        facts = await self._reply(None, SESSION_TIMEOUT)
        if facts is not None:
            self.probe.facts[self.host.name] = facts

    async def ask(self, op: dict[str, Any]) -> dict[str, Any] | None:
        """The host's reply to ``op``, or None (the host is then ``stuck`` or ``unreachable``)."""
        return await self._reply(op, REPLY_TIMEOUT)

    async def _reply(self, op: dict[str, Any] | None, timeout: float) -> dict[str, Any] | None:
        if self.proc is None:
            return None
        what = op["op"] if op else "describe the path"
        try:
            if op is not None:
                self.proc.write((json.dumps(op) + "\n").encode())
            reply = await _read_json(self.proc, timeout)
        except asyncio.TimeoutError:
            self.probe.stuck.setdefault(
                self.host.name, f"no answer within {timeout:g} s to '{what}'"
            )
            await self.close(kill=True)
            return None
        except CorralError as exc:
            reply, why = None, str(exc)
        else:
            why = "the check session ended without an answer"
        if reply is None:
            self.probe.unreachable.setdefault(self.host.name, why)
            await self.close(kill=True)
        return reply

    async def close(self, *, kill: bool = False) -> None:
        """End the session: EOF (the host removes a marker it wrote, then exits), or
        SIGKILL at once for a session that stopped answering (or after 10 s)."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        proc.close_stdin()
        if not kill:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(proc.wait(), 10)
                return
        proc.signal(9)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(proc.wait(), 5)


def new_probe(path: str) -> SharedProbe:
    """An empty probe with a fresh marker: a unique name, random content."""
    token = secrets.token_hex(16)
    return SharedProbe(
        path=path,
        marker=MARKER_PREFIX + token[:12],
        content=f"corral shared data check from {socket.gethostname()}: {token}\n",
    )


async def _mark(sessions: list[_Session], probe: SharedProbe, local: bool) -> None:
    """Write from the first host that can, read everywhere else, remove."""
    usable = [s for s in sessions if probe.facts.get(s.host.name, {}).get("is_dir")]
    writer = None
    for session in usable:
        reply = await session.ask({"op": "write", "name": probe.marker, "content": probe.content})
        if reply is not None and reply.get("ok"):
            writer = session
            break
        if reply is not None:
            probe.write_errors[session.host.name] = str(reply.get("error") or "cannot write")
    if writer is None:
        return
    probe.writer = writer.host.name
    readers = [s for s in usable if s is not writer or local]
    replies = await asyncio.gather(*(s.ask({"op": "read", "name": probe.marker}) for s in readers))
    for session, reply in zip(readers, replies, strict=True):
        if reply is not None:
            probe.reads[session.host.name] = reply
    removed = await writer.ask({"op": "remove"})
    if removed is not None and not removed.get("ok"):
        probe.remove_error = str(removed.get("error"))


async def probe_shared(
    transport: Transport, cluster: Cluster, path: str, python: str | None = None
) -> SharedProbe:
    """Ask the hosts of ``cluster`` about ``path`` (see the module docstring)."""
    probe = new_probe(path)
    asked = [cluster.hosts[0]] if cluster.is_local else list(cluster.hosts)
    sessions = [_Session(h, probe) for h in asked]
    try:
        await asyncio.gather(*(s.open(transport, python) for s in sessions))
        await _mark(sessions, probe, cluster.is_local)
    finally:
        await asyncio.gather(*(s.close() for s in sessions), return_exceptions=True)
    if cluster.is_local:
        only = asked[0].name
        for host in cluster.hosts[1:]:
            tables: tuple[dict[str, Any], ...] = (
                probe.facts,
                probe.unreachable,
                probe.stuck,
                probe.reads,
            )
            for table in tables:
                if only in table:
                    table[host.name] = table[only]
    return probe
