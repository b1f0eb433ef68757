"""Which hosts answer (the engine of ``corral ping``, and worker failure detection).

:func:`ping_hosts` runs ``echo corral-ping-<nonce>`` on every host at once and
checks that the nonce comes back, under one hard deadline per host that covers
connect, authentication and the command. A host that fails is a failed
:class:`PingResult` naming the cause (the transport's own error when it raised
one: connection refused, auth failed, host key mismatch, ...), never an
exception. When the deadline passes, the host's attempt is cancelled and a
process already started is killed; the call returns at most
:data:`KILL_GRACE` seconds after the deadline even when the link is dead.

A connection that is still being opened when the deadline passes belongs to
the transport (shared with its other callers); it is bounded by the
transport's connect timeout and cancelled by ``transport.close()``.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from corral.cluster.model import Host
from corral.errors import CommandTimeout, ConnectError, TransportError
from corral.transport.base import NodeProcess, Transport, kill_and_wait

__all__ = ["KILL_GRACE", "PingResult", "failed_hosts", "ping_hosts"]

#: After the deadline, how long to wait for a killed ping command to end (then it is left).
KILL_GRACE = 1.0
DEFAULT_PING_TIMEOUT = 10.0
_NONCE_PREFIX = "corral-ping-"
_CAPTURE_LIMIT = 4096  # bytes of stdout/stderr kept per host
_SHOWN = 120  # characters of unexpected output quoted in an error


@dataclass(frozen=True)
class PingResult:
    """Whether one host answered."""

    host: str
    ok: bool
    """True when the echo came back with the nonce and exit status 0, in time."""
    rtt_ms: float | None
    """Milliseconds from the start to the command's exit (connect and auth included
    when the transport had no open connection); None when no reply came."""
    error: TransportError | None = None
    """Why the host did not answer: ConnectError, CommandTimeout, ConnectionLost, or a
    TransportError whose cause is ``exit N`` or ``unexpected output``."""

    @property
    def cause(self) -> str | None:
        """Short cause of the failure (``connection refused``, ``timed out after 5s``, ...)."""
        if self.error is None:
            return None
        return self.error.cause or type(self.error).__name__

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form: ``ok``, ``rtt_ms``, ``error`` (the message) and ``cause``."""
        return {
            "ok": self.ok,
            "rtt_ms": None if self.rtt_ms is None else round(self.rtt_ms, 3),
            "error": None if self.error is None else str(self.error),
            "cause": self.cause,
        }


def failed_hosts(results: Mapping[str, PingResult]) -> list[str]:
    """Names of the hosts that did not answer, in the order of ``results``."""
    return [name for name, result in results.items() if not result.ok]


def _seconds(value: float) -> str:
    return f"{round(value, 1):g}s"


async def _read_capped(reader: asyncio.StreamReader, limit: int) -> bytes:
    """Read to EOF, keeping the first ``limit`` bytes."""
    kept = b""
    while True:
        chunk = await reader.read(64 * 1024)
        if not chunk:
            return kept
        if len(kept) < limit:
            kept += chunk[: limit - len(kept)]


async def _probe(
    transport: Transport, host: Host, argv: list[str], started: list[NodeProcess]
) -> tuple[int, bytes, bytes, TransportError | None]:
    """Start ``argv`` and wait for its exit; the process goes into ``started`` at once."""
    proc = await transport.start(host, argv)
    started.append(proc)
    proc.close_stdin()
    out, err = await asyncio.gather(
        _read_capped(proc.stdout, _CAPTURE_LIMIT), _read_capped(proc.stderr, _CAPTURE_LIMIT)
    )
    code = await proc.wait()
    lost = getattr(proc, "lost", None)
    return code, out, err, lost if isinstance(lost, TransportError) else None


def _check_reply(
    host: Host, command: str, nonce: str, code: int, out: bytes, err: bytes
) -> TransportError | None:
    """None when the reply is right, else the error describing what came back."""
    lines = out.decode("utf-8", "replace").splitlines()
    if code == 0 and nonce in (line.strip() for line in lines):
        return None
    if code != 0:
        tail = err.decode("utf-8", "replace").strip().splitlines()[-1:] or ["no stderr"]
        return TransportError(
            f"the ping command exited with status {code}: {tail[0][:_SHOWN]}",
            host=host.name,
            command=command,
            cause=f"exit {code}",
        )
    shown = out.decode("utf-8", "replace")[:_SHOWN]
    return TransportError(
        f"unexpected reply to the ping command: expected {nonce!r}, got {shown!r}",
        host=host.name,
        command=command,
        cause="unexpected output",
    )


def _timed_out(host: Host, command: str, timeout: float, connected: bool) -> TransportError:
    cause = f"timed out after {_seconds(timeout)}"
    if connected:
        return CommandTimeout(
            f"the ping command gave no reply within {timeout:g} s (killed); host overloaded, "
            "hung or link cut?",
            host=host.name,
            command=command,
            cause=cause,
        )
    return ConnectError(
        f"no answer within {timeout:g} s while connecting (host down, firewalled or link cut?)",
        host=host.name,
        command=command,
        cause=cause,
    )


def _specific_timeout(exc: TransportError, elapsed: float) -> TransportError:
    """The transport's own ``timeout`` error, with the cause saying how long it waited."""
    if exc.cause != "timeout":
        return exc
    error = type(exc)(
        exc.message,
        host=exc.host,
        command=exc.command,
        cause=f"timed out after {_seconds(elapsed)}",
    )
    error.__cause__ = exc
    return error


async def _ping_one(transport: Transport, host: Host, timeout: float) -> PingResult:
    nonce = _NONCE_PREFIX + secrets.token_hex(8)
    argv = ["echo", nonce]
    command = " ".join(argv)
    started: list[NodeProcess] = []
    begin = time.monotonic()
    try:
        code, out, err, lost = await asyncio.wait_for(
            _probe(transport, host, argv, started), timeout
        )
    except asyncio.TimeoutError:
        if started:
            await kill_and_wait(started[0], KILL_GRACE)
        return PingResult(host.name, False, None, _timed_out(host, command, timeout, bool(started)))
    except TransportError as exc:
        return PingResult(host.name, False, None, _specific_timeout(exc, time.monotonic() - begin))
    except asyncio.CancelledError:
        if started:
            await asyncio.shield(kill_and_wait(started[0], KILL_GRACE))
        raise
    except Exception as exc:  # a transport that did not translate its error: still a failed host
        if started:
            await kill_and_wait(started[0], KILL_GRACE)
        failure = TransportError(
            f"ping failed: {type(exc).__name__}: {exc}",
            host=host.name,
            command=command,
            cause="error",
        )
        failure.__cause__ = exc
        return PingResult(host.name, False, None, failure)
    rtt_ms = (time.monotonic() - begin) * 1000.0
    if lost is not None:
        return PingResult(host.name, False, None, lost)
    wrong = _check_reply(host, command, nonce, code, out, err)
    return PingResult(host.name, wrong is None, rtt_ms, wrong)


async def ping_hosts(
    transport: Transport, hosts: Sequence[Host], *, timeout: float = DEFAULT_PING_TIMEOUT
) -> dict[str, PingResult]:
    """Ping every host in parallel; ``{name: PingResult}`` in host order.

    ``timeout`` is the hard deadline per host, from the start to the reply
    (connect, authentication and the command). Never raises for a failed host;
    raises ValueError for a ``timeout`` that is not positive.
    """
    if not timeout > 0:
        raise ValueError(f"timeout must be positive, not {timeout!r}")
    results = await asyncio.gather(*(_ping_one(transport, h, timeout) for h in hosts))
    return {r.host: r for r in results}
