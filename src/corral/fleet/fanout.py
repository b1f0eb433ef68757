"""Run one command on every host in parallel (the engine of ``corral exec``).

:func:`check_connectivity` connects to every host at once and reports the ones
that cannot be reached; :func:`run_on_hosts` then starts the command on every
host, streams its output as whole lines (never split, never interleaved
within a line) to a callback, enforces a per-host timeout (the remote process
group is killed) and returns one :class:`HostResult` per host, in host order.

A ``str`` command is a shell command line, interpreted by the host's login
shell (``$HOSTNAME``, pipes and ``;`` work as with ``ssh host 'CMD'``); a
sequence is an argv run verbatim (every word quoted).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from corral.cluster.model import Host
from corral.errors import CommandTimeout, TransportError
from corral.transport.base import NodeProcess, Transport

__all__ = [
    "HostResult",
    "OutputCallback",
    "Stream",
    "check_connectivity",
    "run_on_hosts",
    "unreachable_summary",
]

Stream = Literal["stdout", "stderr"]
#: Called with a chunk of one or more whole lines (each ending in ``\n``) of one host.
OutputCallback = Callable[[Host, Stream, bytes], None]

READ_CHUNK = 64 * 1024
MAX_LINE = 1 << 20  # a longer "line" is passed on in pieces
DRAIN_GRACE = 5.0  # after exit, how long to wait for output still in flight
KILL_GRACE = 5.0


@runtime_checkable
class _Connecting(Protocol):
    async def connect(self, host: Host) -> None: ...


@runtime_checkable
class _ShellStarting(Protocol):
    async def start_shell(
        self,
        host: Host,
        command: str,
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> NodeProcess: ...


@dataclass(frozen=True)
class HostResult:
    """How the command went on one host."""

    host: str
    exit_code: int | None
    """Exit code (``-signum`` if killed by a signal); None if it did not finish."""
    duration: float
    """Seconds from start to exit (or to the failure)."""
    error: TransportError | None = None
    """Why it did not finish: ConnectError, CommandTimeout, ConnectionLost."""
    stdout: bytes = field(default=b"", repr=False)
    stderr: bytes = field(default=b"", repr=False)

    @property
    def ok(self) -> bool:
        """True when the command exited 0."""
        return self.error is None and self.exit_code == 0

    @property
    def status(self) -> str:
        """``ok``, ``exit N``, ``signal NAME``, or the failure's cause (``timeout``, ...)."""
        if self.error is not None:
            return self.error.cause or type(self.error).__name__
        if self.exit_code is None:
            return "unknown"
        if self.exit_code == 0:
            return "ok"
        if self.exit_code < 0:
            try:
                return f"signal {signal.Signals(-self.exit_code).name}"
            except ValueError:
                return f"signal {-self.exit_code}"
        return f"exit {self.exit_code}"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (output decoded as UTF-8 with replacement)."""
        return {
            "host": self.host,
            "ok": self.ok,
            "status": self.status,
            "exit_code": self.exit_code,
            "duration": round(self.duration, 4),
            "error": str(self.error) if self.error is not None else None,
            "cause": self.error.cause if self.error is not None else None,
            "stdout": self.stdout.decode("utf-8", "replace"),
            "stderr": self.stderr.decode("utf-8", "replace"),
        }


async def check_connectivity(
    transport: Transport, hosts: Sequence[Host]
) -> dict[str, TransportError]:
    """Connect to every host in parallel; returns ``{host: error}`` for those that failed.

    Transports without connections (local) always succeed. Connections made here
    are kept by the transport and reused by :func:`run_on_hosts`.
    """
    if not isinstance(transport, _Connecting):
        return {}

    async def one(host: Host) -> TransportError | None:
        try:
            await transport.connect(host)
        except TransportError as exc:
            return exc
        return None

    errors = await asyncio.gather(*(one(h) for h in hosts))
    return {h.name: e for h, e in zip(hosts, errors, strict=True) if e is not None}


def _local_shell() -> str:
    return os.environ.get("SHELL") or "/bin/sh"


async def _start(
    transport: Transport,
    host: Host,
    command: str | Sequence[str],
    env: Mapping[str, str] | None,
    cwd: str | None,
) -> NodeProcess:
    if not isinstance(command, str):
        return await transport.start(host, list(command), env=env, cwd=cwd)
    if isinstance(transport, _ShellStarting):
        return await transport.start_shell(host, command, env=env, cwd=cwd)
    return await transport.start(host, [_local_shell(), "-c", command], env=env, cwd=cwd)


class _Capture:
    """Keeps up to ``limit`` bytes of a stream."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.parts: list[bytes] = []
        self.size = 0

    def add(self, data: bytes) -> None:
        room = self.limit - self.size
        if room > 0:
            piece = data[:room]
            self.parts.append(piece)
            self.size += len(piece)

    def value(self) -> bytes:
        return b"".join(self.parts)


async def _pump(
    reader: asyncio.StreamReader,
    host: Host,
    stream: Stream,
    on_output: OutputCallback | None,
    capture: _Capture | None,
) -> None:
    """Read ``reader`` to EOF, passing on whole lines (a last partial line gets a newline)."""
    pending = b""
    while True:
        chunk = await reader.read(READ_CHUNK)
        if not chunk:
            break
        if capture is not None:
            capture.add(chunk)
        if on_output is None:
            continue
        data = pending + chunk if pending else chunk
        cut = data.rfind(b"\n")
        if cut < 0:
            pending = data
            if len(pending) >= MAX_LINE:
                on_output(host, stream, pending + b"\n")
                pending = b""
            continue
        on_output(host, stream, data[: cut + 1])
        pending = data[cut + 1 :]
    if pending and on_output is not None:
        on_output(host, stream, pending + b"\n")


def _retrieve(fut: asyncio.Future[Any]) -> None:
    """Mark a cancelled gather's outcome as seen (no "never retrieved" warning)."""
    if not fut.cancelled():
        fut.exception()


async def _kill(proc: NodeProcess) -> None:
    """SIGKILL the process group and wait briefly for the exit."""
    kill = getattr(proc, "kill", None)
    if kill is not None and asyncio.iscoroutinefunction(kill):
        await kill()
        return
    proc.signal(signal.SIGKILL)
    with contextlib.suppress(TransportError, asyncio.TimeoutError):
        await asyncio.wait_for(proc.wait(), KILL_GRACE)


async def _run_one(
    transport: Transport,
    host: Host,
    command: str | Sequence[str],
    *,
    timeout: float | None,
    env: Mapping[str, str] | None,
    cwd: str | None,
    on_output: OutputCallback | None,
    capture_limit: int,
) -> HostResult:
    started = time.monotonic()
    text = command if isinstance(command, str) else " ".join(command)
    try:
        proc = await _start(transport, host, command, env, cwd)
    except TransportError as exc:
        return HostResult(host.name, None, time.monotonic() - started, exc)
    proc.close_stdin()
    out = _Capture(capture_limit) if capture_limit > 0 else None
    err = _Capture(capture_limit) if capture_limit > 0 else None
    pumps = asyncio.gather(
        _pump(proc.stdout, host, "stdout", on_output, out),
        _pump(proc.stderr, host, "stderr", on_output, err),
    )
    code: int | None = None
    error: TransportError | None = None
    try:
        remaining = None if timeout is None else max(0.0, timeout - (time.monotonic() - started))
        code = await asyncio.wait_for(proc.wait(), remaining)
        lost = getattr(proc, "lost", None)
        if isinstance(lost, TransportError):
            code, error = None, lost
    except asyncio.TimeoutError as exc:
        error = CommandTimeout(
            f"command did not finish within {timeout:g} s; its processes were killed",
            host=host.name,
            command=text,
            cause="timeout",
        )
        error.__cause__ = exc
        await _kill(proc)
    except TransportError as exc:
        error = exc
    except asyncio.CancelledError:  # Ctrl-C: leave nothing running behind
        pumps.add_done_callback(_retrieve)
        pumps.cancel()
        with contextlib.suppress(Exception, asyncio.CancelledError):
            await asyncio.wait_for(asyncio.shield(_kill(proc)), KILL_GRACE + 1)
        raise
    duration = time.monotonic() - started
    try:
        await asyncio.wait_for(pumps, DRAIN_GRACE)
    except asyncio.TimeoutError:  # output pipes held open by background processes
        pumps.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await pumps
    return HostResult(
        host.name,
        code,
        duration,
        error,
        stdout=out.value() if out is not None else b"",
        stderr=err.value() if err is not None else b"",
    )


async def run_on_hosts(
    transport: Transport,
    hosts: Sequence[Host],
    command: str | Sequence[str],
    *,
    timeout: float | None = None,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
    on_output: OutputCallback | None = None,
    capture_limit: int = 0,
) -> list[HostResult]:
    """Run ``command`` on every host in parallel; one result per host, in host order.

    ``timeout`` is per host (start to exit): on expiry the host's process group
    is killed and its result carries a CommandTimeout. ``env`` is added to each
    host's own ``env`` (from the hostfile). ``capture_limit`` > 0 keeps up to
    that many bytes of each host's stdout and stderr in the results. A host that
    cannot be started, times out or loses its connection is a failed result,
    never an exception.
    """
    if timeout is not None and timeout <= 0:
        raise ValueError("timeout must be positive")

    def host_env(host: Host) -> dict[str, str] | None:
        merged = {**host.env, **(env or {})}
        return merged or None

    return list(
        await asyncio.gather(
            *(
                _run_one(
                    transport,
                    h,
                    command,
                    timeout=timeout,
                    env=host_env(h),
                    cwd=cwd,
                    on_output=on_output,
                    capture_limit=capture_limit,
                )
                for h in hosts
            )
        )
    )


def unreachable_summary(errors: Mapping[str, TransportError]) -> str:
    """``2 hosts unreachable: tb2 (connection refused), tb3 (timeout)``."""
    parts = [f"{name} ({e.cause or type(e).__name__})" for name, e in errors.items()]
    noun = "host" if len(errors) == 1 else "hosts"
    return f"{len(errors)} {noun} unreachable: " + ", ".join(parts)
