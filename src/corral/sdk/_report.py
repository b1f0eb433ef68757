"""Progress heartbeats to the corral supervisor over the node agent's control socket.

``CORRAL_CONTROL`` is ``unix:/path/to/socket``: a filesystem socket the node
agent makes in a private directory for each attempt. Every connection first
sends ``auth <token>\n`` with the token from ``CORRAL_CONTROL_TOKEN`` (the agent
drops connections without it, see :mod:`corral.agent.control`), then
``ctl <rank>\n``; each report is then one JSON line::

    {"type": "progress", "rank": 0, "step": 10, "total": 100,
     "metrics": {"loss": 0.5}, "time": 1700000000.0}

Other SDK parts send their own events on the same connection with
:func:`send_event` (e.g. ``save_checkpoint``'s ``{"type": "checkpoint", ...}``);
the node agent forwards every line but ``{"type": "exit"}`` to the coordinator.

The connection also carries answers back: :func:`request` sends an event
with ``"ack": true`` and waits (at most its ``timeout``) for the coordinator's
reply line (the node agent writes it to this socket), e.g. ``{"type":
"replicated", "name": ..., "ok": true}`` once a checkpoint reached the
coordinator's replica.

Reporting never raises into training: any socket error (including a send
that blocks for more than :data:`SEND_TIMEOUT` seconds) disables it for the
rest of the process.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import selectors
import socket
import sys
import threading
import time
from collections.abc import Mapping

from corral.contract import CONTROL_ENV, CONTROL_TOKEN_ENV, auth_line
from corral.sdk import _section
from corral.sdk._env import info

__all__ = [
    "CONTROL_ENV",
    "REQUEST_TIMEOUT",
    "SEND_TIMEOUT",
    "TOKEN_ENV",
    "auth_line",
    "connect_control",
    "report",
    "request",
    "send_event",
]

SEND_TIMEOUT = 1.0
REQUEST_TIMEOUT = 600.0
TOKEN_ENV = CONTROL_TOKEN_ENV
_monotonic = time.monotonic  # the clock of request()'s deadline (tests replace it)
# No SIGPIPE even in a process that restored its default action (which kills).
_SEND_FLAGS = getattr(socket, "MSG_NOSIGNAL", 0)


def _socket_address(spec: str) -> str:
    if not spec.startswith(("unix:/", "unix:@")) or len(spec) <= len("unix:@"):
        raise OSError(f"unsupported {CONTROL_ENV} address {spec!r}")
    target = spec[len("unix:") :]
    return "\0" + target[1:] if target.startswith("@") else target


def connect_control(spec: str, timeout: float | None = SEND_TIMEOUT) -> socket.socket:
    """Connect to the control socket at ``spec`` and authenticate with
    ``$CORRAL_CONTROL_TOKEN``. ``spec`` is ``unix:/path`` (what the node agent sets)
    or ``unix:@NAME`` (a Linux abstract socket: a test's or a custom server's).
    Raises OSError (a bad address included)."""
    address = _socket_address(spec)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout)
        sock.connect(address)
        sock.sendall(auth_line(os.environ.get(TOKEN_ENV, "")), _SEND_FLAGS)
    except BaseException:
        sock.close()
        raise
    return sock


def _metric(value: object) -> float | None:
    number = float(value)  # type: ignore[arg-type]  # tensors, numpy scalars, ints
    return number if math.isfinite(number) else None


class _Reporter:
    """One connection per (process, address); disabled for good after an error."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._reply_lock = threading.Lock()
        self._replies = bytearray()
        self._spec: str | None = None
        self._pid = 0
        self._sock: socket.socket | None = None
        self._disabled = False

    def _reset(self, spec: str) -> None:
        if self._sock is not None and self._pid == os.getpid():
            self._sock.close()
        self._sock = None
        self._spec = spec
        self._pid = os.getpid()
        self._disabled = False
        self._replies = bytearray()

    def _connect(self, spec: str, rank: int) -> socket.socket:
        sock = connect_control(spec)
        try:
            sock.sendall(f"ctl {rank}\n".encode("ascii"), _SEND_FLAGS)
        except BaseException:
            sock.close()
            raise
        return sock

    def send(self, step: int, total: int | None, metrics: dict[str, object]) -> None:
        spec = os.environ.get(CONTROL_ENV, "")
        if not spec:
            return
        try:
            rank = info().rank
            payload = {
                "type": "progress",
                "rank": rank,
                "step": int(step),
                "total": None if total is None else int(total),
                "metrics": {str(k): _metric(v) for k, v in metrics.items()},
                "time": time.time(),
            }
            sections = _section.drain()  # sdk.section timings since the last report
            if sections:
                payload["sections"] = sections
            line = (json.dumps(payload, allow_nan=False) + "\n").encode()
        except (TypeError, ValueError):
            return  # a bad value in this one report: drop it, keep reporting
        self._send_line(spec, rank, line)

    def send_event(self, event: Mapping[str, object]) -> socket.socket | None:
        spec = os.environ.get(CONTROL_ENV, "")
        if not spec:
            return None
        try:
            rank = info().rank
            payload = {"rank": rank, **event}
            if not isinstance(payload.get("type"), str) or payload["type"] == "exit":
                return None  # "exit" is the agent's own message; an untyped line means nothing
            payload.setdefault("time", time.time())
            line = (json.dumps(payload, allow_nan=False) + "\n").encode()
        except (TypeError, ValueError):
            return None
        return self._send_line(spec, rank, line)

    def _send_line(self, spec: str, rank: int, line: bytes) -> socket.socket | None:
        """Send ``line``; the socket it went out on, or None when it could not be sent."""
        with self._lock:
            if spec != self._spec or self._pid != os.getpid():
                self._reset(spec)
            if self._disabled:
                return None
            try:
                if self._sock is None:
                    self._sock = self._connect(spec, rank)
                self._sock.sendall(line, _SEND_FLAGS)
                return self._sock
            except OSError:
                self._fail()
                return None

    def _fail(self) -> None:
        if self._sock is not None:
            self._sock.close()
        self._sock = None
        self._disabled = True

    def request(
        self, event: Mapping[str, object], match: Mapping[str, object], timeout: float
    ) -> dict[str, object] | None:
        """Send ``event`` asking for an answer; the first reply line whose fields
        equal ``match``, or None (no connection, EOF, timeout: with a warning)."""
        with self._reply_lock:
            sock = self.send_event({**event, "ack": True})
            if sock is None:
                return None
            deadline = _monotonic() + timeout
            with selectors.DefaultSelector() as selector:
                try:
                    selector.register(sock, selectors.EVENT_READ)
                except (OSError, ValueError):  # closed meanwhile by another thread
                    return None
                while True:
                    line = self._read_line(sock, selector, deadline)
                    if line is None:
                        if _monotonic() >= deadline:
                            _warn(
                                f"no answer to {event.get('type', 'the request')!s} from the "
                                f"coordinator within {timeout:g} s; going on without it"
                            )
                        return None
                    with contextlib.suppress(ValueError):
                        reply = json.loads(line)
                        if isinstance(reply, dict) and all(
                            reply.get(k) == v for k, v in match.items()
                        ):
                            return reply

    def _read_line(
        self, sock: socket.socket, selector: selectors.BaseSelector, deadline: float
    ) -> bytes | None:
        """One line from the agent (waiting in short slices, so sends of other
        threads keep their own timeout); None on EOF, error or deadline."""
        while b"\n" not in self._replies:
            wait = min(1.0, deadline - _monotonic())
            if wait <= 0:
                return None
            try:
                if not selector.select(wait):
                    continue
                chunk = sock.recv(65536, socket.MSG_DONTWAIT)
            except BlockingIOError:
                continue
            except (OSError, ValueError):  # closed meanwhile (ValueError: fd -1)
                return None
            if not chunk:
                with self._lock:
                    if self._sock is sock:
                        self._fail()
                return None
            self._replies += chunk
        line, _, rest = bytes(self._replies).partition(b"\n")
        self._replies = bytearray(rest)
        return line


def _warn(message: str) -> None:
    with contextlib.suppress(OSError, ValueError):  # stderr closed: nothing to tell
        print(f"corral: warning: {message}", file=sys.stderr, flush=True)


_reporter = _Reporter()


def report(step: int, total: int | None = None, **metrics: float) -> None:
    """Tell the supervisor this rank reached ``step`` (of ``total``), with optional metrics.

    A no-op without ``CORRAL_CONTROL``. Cheap enough to call every step; never
    raises and never blocks for more than about a second. Non-finite metric
    values are sent as ``null``. The :func:`corral.sdk.section` timings since the
    previous report travel with it (``"sections"``: mean seconds per section).
    """
    _reporter.send(step, total, dict(metrics))


def request(
    event: Mapping[str, object],
    match: Mapping[str, object],
    timeout: float = REQUEST_TIMEOUT,
) -> dict[str, object] | None:
    """Send ``event`` (as :func:`send_event`, with ``"ack": true``) and wait for the
    coordinator's answer: the first reply whose fields equal ``match``.

    Returns None at once outside corral, and when the connection ends (the agent
    is gone) or ``timeout`` seconds (default :data:`REQUEST_TIMEOUT`) pass first;
    a timeout also prints a warning on stderr. Never raises.
    """
    return _reporter.request(event, match, timeout)


def send_event(event: Mapping[str, object]) -> None:
    """Send one JSON event line (it must have a string ``"type"``, not ``"exit"``).

    ``rank`` (this process's) and ``time`` are added when missing. Like
    :func:`report`: a no-op without ``CORRAL_CONTROL``, never raises, never
    blocks for more than about a second; the coordinator receives it as
    ``{"event": "report", **event}``.
    """
    _reporter.send_event(event)
