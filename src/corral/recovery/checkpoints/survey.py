"""Listing the complete checkpoints of every host, and of the coordinator's replica.

Each host runs :func:`corral.recovery.checkpoints.hostside.list_checkpoints`
(shipped over stdin with :mod:`corral.remote.python`); a host that cannot be
asked comes back with ``error`` set, so one lost host never hides the others.
:func:`newest` then picks the highest complete step among the hosts' listings
and the replica's newest file.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import posixpath
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from corral.cluster.model import Host
from corral.errors import CorralError, TransportError
from corral.recovery.checkpoints.common import (
    HOSTSIDE,
    KILL_GRACE,
    SHIPPED,
    SURVEY_TIMEOUT,
    step_of,
)
from corral.remote.python import start_program
from corral.transport.base import NodeProcess, Transport, kill_and_wait

__all__ = ["Candidate", "CheckpointFile", "HostCheckpoints", "newest", "survey"]


@dataclass(frozen=True)
class CheckpointFile:
    """One rank-0 checkpoint file on a host."""

    name: str
    step: int
    size: int
    complete: bool
    mtime: float


@dataclass(frozen=True)
class HostCheckpoints:
    """What one host holds in the checkpoint directory (``error`` when it could not be asked)."""

    host: Host
    directory: str | None = None
    """The directory resolved on the host (absolute)."""
    exists: bool = False
    free: int | None = None
    """Bytes still available there (or in its nearest existing parent)."""
    files: tuple[CheckpointFile, ...] = ()
    """Oldest first; incomplete ones included (``complete`` False)."""
    error: str | None = None

    @property
    def ok(self) -> bool:
        """Whether the host answered."""
        return self.error is None

    @property
    def latest(self) -> CheckpointFile | None:
        """The newest complete checkpoint, or None."""
        complete = [f for f in self.files if f.complete]
        return complete[-1] if complete else None

    def find(self, name: str) -> CheckpointFile | None:
        """The file called ``name``, or None."""
        return next((f for f in self.files if f.name == name), None)

    def path_of(self, name: str) -> str:
        """Absolute path of ``name`` on the host."""
        assert self.directory is not None
        return posixpath.join(self.directory, name)


def _describe_exit(code: int, proc: NodeProcess, stderr: bytes) -> str:
    lost = getattr(proc, "lost", None)
    if isinstance(lost, TransportError):
        return str(lost)
    lines = stderr.decode("utf-8", "replace").strip().splitlines()
    return lines[-1] if lines else f"exit status {code}"


def _parse(host: Host, out: bytes) -> HostCheckpoints | None:
    for line in out.decode("utf-8", "replace").splitlines():
        if not line.startswith("{"):
            continue
        with contextlib.suppress(ValueError, KeyError, TypeError):
            data = json.loads(line)
            files = tuple(
                CheckpointFile(
                    name=str(f["name"]),
                    step=int(f["step"]),
                    size=int(f["size"]),
                    complete=bool(f["complete"]),
                    mtime=float(f["mtime"]),
                )
                for f in data["files"]
            )
            free = data.get("free")
            return HostCheckpoints(
                host,
                directory=str(data["directory"]),
                exists=bool(data.get("exists")),
                free=None if free is None else int(free),
                files=files,
            )
    return None


async def _survey_one(
    transport: Transport,
    host: Host,
    directory: str,
    cwd: str | None,
    python: str | None,
    timeout: float,
) -> HostCheckpoints:
    started: list[NodeProcess] = []

    async def ask() -> tuple[int, bytes, bytes, NodeProcess]:
        proc = await start_program(
            transport, host, python, SHIPPED, f"{HOSTSIDE}:list_checkpoints", directory, cwd
        )
        started.append(proc)
        proc.close_stdin()
        out, err = await asyncio.gather(proc.stdout.read(), proc.stderr.read())
        return await proc.wait(), out, err, proc

    try:
        code, out, err, proc = await asyncio.wait_for(ask(), timeout)
    except asyncio.TimeoutError:
        for proc in started:
            await kill_and_wait(proc, KILL_GRACE)
        return HostCheckpoints(host, error=f"no answer within {timeout:g} s")
    except CorralError as exc:
        return HostCheckpoints(host, error=str(exc))
    except asyncio.CancelledError:
        for proc in started:
            await asyncio.shield(kill_and_wait(proc, KILL_GRACE))
        raise
    parsed = _parse(host, out)
    if parsed is not None:
        return parsed
    return HostCheckpoints(
        host, error=f"listing the checkpoints failed: {_describe_exit(code, proc, err)}"
    )


async def survey(
    transport: Transport,
    hosts: Sequence[Host],
    directory: str,
    cwd_of: Callable[[Host], str | None],
    *,
    python: str | None = None,
    timeout: float = SURVEY_TIMEOUT,
) -> dict[str, HostCheckpoints]:
    """List the rank-0 checkpoints of ``directory`` on every host at once.

    ``directory`` is resolved on each host against ``cwd_of(host)`` (the node's
    working directory), as the ranks resolve ``CORRAL_CHECKPOINT_DIR``. A host that
    cannot be asked within ``timeout`` seconds comes back with ``error`` set; this
    never raises for a host.
    """
    results = await asyncio.gather(
        *(_survey_one(transport, h, directory, cwd_of(h), python, timeout) for h in hosts)
    )
    return {r.host.name: r for r in results}


@dataclass(frozen=True)
class Candidate:
    """Where a copy of the chosen checkpoint can come from: a host or the replica."""

    step: int
    name: str
    size: int
    host: HostCheckpoints | None = None
    replica_file: Path | None = None


def newest(listed: Mapping[str, HostCheckpoints], replica_latest: Path | None) -> list[Candidate]:
    """Every holder of the highest complete step (hosts first, in ``listed``'s order,
    then the replica's file); empty when there is no complete checkpoint anywhere."""
    found: list[Candidate] = []
    for result in listed.values():
        latest = result.latest
        if latest is not None:
            found.append(Candidate(latest.step, latest.name, latest.size, host=result))
    if replica_latest is not None:
        found.append(
            Candidate(
                step_of(replica_latest.name),
                replica_latest.name,
                replica_latest.stat().st_size,
                replica_file=replica_latest,
            )
        )
    if not found:
        return []
    best = max(c.step for c in found)
    return [c for c in found if c.step == best]
