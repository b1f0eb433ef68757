"""The Transport protocol: how a command runs on a node.

A transport starts one OS process on a host (locally, or over SSH) and hands
back a :class:`NodeProcess` with its stdin, stdout and stderr as asyncio
streams. Everything above (the agent protocol, the supervisor, ``exec``) is
written against this protocol, so ``local:N``, SSH and the scripted fake used
by unit tests are interchangeable.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Mapping, Sequence
from typing import Protocol, runtime_checkable

from corral.cluster.model import Host


@runtime_checkable
class NodeProcess(Protocol):
    """A process started on one host."""

    host: Host
    stdout: asyncio.StreamReader
    stderr: asyncio.StreamReader

    def write(self, data: bytes) -> None:
        """Send bytes to the process's stdin (ignored once stdin is closed)."""

    def close_stdin(self) -> None:
        """Close the process's stdin (EOF)."""

    def signal(self, signum: int) -> None:
        """Send ``signum`` to the process's whole process group on the host."""

    async def wait(self) -> int:
        """Wait for exit; returns the exit code, or ``-signum`` if killed by a signal."""
        ...


@runtime_checkable
class Transport(Protocol):
    """Starts processes on the hosts of a cluster."""

    async def start(
        self,
        host: Host,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> NodeProcess:
        """Start ``argv`` on ``host`` in its own session/process group.

        ``env`` is the *complete* set of variables the caller wants set beyond
        what the host's login environment provides; nothing from the
        coordinator's own environment is forwarded implicitly.
        """
        ...

    async def close(self) -> None:
        """Release connections and other resources."""
        ...


async def kill_and_wait(proc: NodeProcess, grace: float) -> None:
    """SIGKILL ``proc`` and wait at most ``grace`` seconds for its exit; never raises
    (the process, or the link to its host, may already be gone)."""
    with contextlib.suppress(Exception):
        proc.signal(signal.SIGKILL)
    with contextlib.suppress(Exception, asyncio.TimeoutError):
        await asyncio.wait_for(proc.wait(), grace)
