"""Progress heartbeats to the corral supervisor over the node agent's control socket.

``CORRAL_CONTROL`` is ``unix:/path/to/socket``: a filesystem socket the node
agent makes in a private directory for each attempt. Every connection first
sends ``auth <token>\n`` with the token from ``CORRAL_CONTROL_TOKEN`` (the agent
drops connections without it, see :mod:`corral.agent.control`), then
``ctl <rank>\n``; then JSON lines.

:func:`report` costs about a microsecond: it appends the report to a buffer
(:data:`corral.sdk._section.records`, in order with the section timings) and a
daemon thread sends what piled up every :data:`FLUSH_INTERVAL` seconds as one
line (several when long), each report ``[step, total, age, metrics, sections]``::

    {"type":"reports","rank":0,"sent":1795870437.06,
     "reports":[[10,100,150,{"loss":0.5},{"compute":51000000}],
                [11,100,148,{"loss":0.49},null], ...]}

``age``: milliseconds between the call and ``sent`` (the rank's clock when the
batch was taken, the node's clock: the agent may read the line late, as while it
imports what validates it); ``sections``: the mean
nanoseconds per :func:`corral.sdk.section` timed since the previous report
(null: none; integers print faster than floats). The node agent forwards each
report as its own ``progress`` event (time: ``sent``, never after it read the
line, less the age; sections in
seconds, as ``{"type": "progress"}`` had them), so the
coordinator sees every step as before. The buffer is also sent before any other
event (:func:`send_event`: a checkpoint announced at step N comes after the
report of step N) and at exit (``atexit``, also after an uncaught exception).

Other SDK parts send their own events on the same connection with
:func:`send_event` (e.g. ``save_checkpoint``'s ``{"type": "checkpoint", ...}``);
the node agent forwards every line but ``{"type": "exit"}`` to the coordinator.

The connection also carries answers back: :func:`request` sends an event
with ``"ack": true`` and waits (at most its ``timeout``) for the coordinator's
reply line (the node agent writes it to this socket), e.g. ``{"type":
"replicated", "name": ..., "ok": true}`` once a checkpoint reached the
coordinator's replica.

Reporting never raises into training: any socket error (a connection not made
within :data:`SEND_TIMEOUT` seconds, a send that moves no byte for
:data:`STALL_TIMEOUT` seconds) disables it for the rest of the process.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import math
import os
import selectors
import socket
import sys
import threading
import time
from collections.abc import Iterator, Mapping

from corral.contract import CONTROL_ENV, CONTROL_TOKEN_ENV, auth_line
from corral.sdk import _section
from corral.sdk._env import info

__all__ = [
    "CONTROL_ENV",
    "FLUSH_INTERVAL",
    "REQUEST_TIMEOUT",
    "SEND_TIMEOUT",
    "STALL_TIMEOUT",
    "TOKEN_ENV",
    "auth_line",
    "connect_control",
    "flush_reports",
    "report",
    "request",
    "send_event",
]

SEND_TIMEOUT = 1.0
#: Seconds a send may make no progress (the agent reads nothing) before reporting is
#: turned off: the sender thread, not training, waits; an agent that reads slowly
#: (its coordinator is busy) only delays the reports.
STALL_TIMEOUT = 5.0
REQUEST_TIMEOUT = 600.0
TOKEN_ENV = CONTROL_TOKEN_ENV
_monotonic = time.monotonic  # the clock of request()'s deadline (tests replace it)
_clock = time.monotonic  # when a report was made
#: Seconds between two sends of the buffered reports at most (hang detection's
#: resolution is seconds: a report reaches the coordinator well within one).
FLUSH_INTERVAL = 0.2
#: Records piled up before the sender thread is woken early.
_WAKE_AT = 8192
#: Longest ``reports`` line sent (the agent accepts 64 KiB) and most reports in one.
MAX_LINE = 60_000
MAX_BATCH = 512
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


def _send_all(sock: socket.socket, data: bytes) -> None:
    """Send all of ``data``; TimeoutError only when the socket took no byte for its
    whole timeout (a slow reader is waited for, a stuck one is not)."""
    view = memoryview(data)
    while view:
        view = view[sock.send(view, _SEND_FLAGS) :]


def _metric(value: object) -> float | None:
    number = float(value)  # type: ignore[arg-type]  # tensors, numpy scalars, ints
    return number if math.isfinite(number) else None


def _plain(metrics: dict[str, object]) -> dict[str, object] | None:
    """``metrics`` with every value a float (read now: a tensor may change, and holding
    it would keep its memory); None when one is not a number."""
    try:
        return {name: float(value) for name, value in metrics.items()}  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None


_encode = json.JSONEncoder(allow_nan=False, separators=(",", ":")).encode
_STEP_LIMIT = 2**62  # what the agent accepts as a step or a total


def _entries(taken: list[_section.Report], now: float) -> list[_section.Report]:
    """``taken`` as the ``reports`` line lists them: the report's time becomes its age
    in milliseconds (in place)."""
    for entry in taken:
        age = now - entry[2]
        entry[2] = int(age * 1000.0) if age > 0 else 0
    return taken


def _cleaned(entry: _section.Report) -> _section.Report | None:
    """``entry`` as the agent accepts it (non-finite metrics as null), or None."""
    try:
        step, total, age, metrics, sections = entry
        if abs(step) > _STEP_LIMIT or (total is not None and abs(total) > _STEP_LIMIT):
            return None
        entry = [step, total, age, {str(k): _metric(v) for k, v in metrics.items()}, sections]
        _encode(entry)
    except (TypeError, ValueError, OverflowError):
        return None
    return entry


def _lines(rank: int, entries: list[_section.Report], sent: float) -> Iterator[bytes]:
    """``reports`` lines of at most :data:`MAX_BATCH` reports and :data:`MAX_LINE`
    bytes; a report with a bad value is dropped alone."""
    for first in range(0, len(entries), MAX_BATCH):
        yield from _encoded(rank, entries[first : first + MAX_BATCH], sent)


def _encoded(rank: int, entries: list[_section.Report], sent: float) -> Iterator[bytes]:
    message = {"type": "reports", "rank": rank, "sent": sent, "reports": entries}
    try:
        line = _encode(message).encode() + b"\n"
    except (TypeError, ValueError, OverflowError):  # NaN, a huge int, ...: the slow way
        entries = [clean for entry in entries if (clean := _cleaned(entry)) is not None]
        if not entries:
            return
        line = _encode({**message, "reports": entries}).encode() + b"\n"
    if len(line) > MAX_LINE and len(entries) > 1:
        half = len(entries) // 2
        yield from _encoded(rank, entries[:half], sent)
        yield from _encoded(rank, entries[half:], sent)
    elif len(line) <= MAX_LINE:
        yield line


class _Reporter:
    """One connection per (process, address); disabled for good after an error.

    :func:`report` only appends to :data:`corral.sdk._section.records` while
    :attr:`active`; a daemon thread sends what piled up every
    :data:`FLUSH_INTERVAL` seconds (sooner when much did), :meth:`send_event` sends
    it before its own event, and the process sends the rest at exit.
    """

    def __init__(self) -> None:
        self._setup()

    def _setup(self) -> None:
        self._lock = threading.Lock()  # the connection
        self._flush_lock = threading.Lock()  # one sender at a time, in order
        self._reply_lock = threading.Lock()
        self._replies = bytearray()
        self._spec: str | None = None
        self._sock: socket.socket | None = None
        self._disabled = False
        #: report() buffers (a reachable control socket is known); read without a lock
        self.active = False
        self._thread: threading.Thread | None = None
        self._wake = threading.Event()
        self.woken = False  # the sender thread was told to send soon

    def _forked(self) -> None:
        """In a forked child: its own connection, locks and sender thread, later."""
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.close()  # the child's copy of the parent's descriptor only
        self._setup()

    def _reset(self, spec: str) -> None:
        if self._sock is not None:
            self._sock.close()
        self._sock = None
        self._spec = spec
        self._disabled = False
        self._replies = bytearray()

    def _connect(self, spec: str, rank: int) -> socket.socket:
        sock = connect_control(spec)
        try:
            sock.sendall(f"ctl {rank}\n".encode("ascii"), _SEND_FLAGS)
            sock.settimeout(STALL_TIMEOUT)  # from now on: per send, while bytes move
        except BaseException:
            sock.close()
            raise
        return sock

    def start(self) -> bool:
        """Whether reports are to be buffered now (``$CORRAL_CONTROL`` is set and
        reporting to it has not failed); starts the sender thread on the first."""
        spec = os.environ.get(CONTROL_ENV, "")
        if not spec:
            return False
        with self._lock:
            if spec != self._spec:
                self._reset(spec)
            if self._disabled:
                return False
        if self._thread is None:
            thread = threading.Thread(target=self._run, name="corral-report", daemon=True)
            thread.start()
            self._thread = thread
            _flush_at_exit()
        self.active = True
        return True

    def wake(self) -> None:
        """Send soon: much piled up."""
        self.woken = True
        self._wake.set()

    def _run(self) -> None:
        wake = self._wake
        while True:
            wake.wait(FLUSH_INTERVAL)
            wake.clear()
            self.woken = False
            self.flush()

    def flush(self) -> None:
        """Send every report recorded so far (never raises)."""
        with self._flush_lock:
            self._flush_locked()

    def _flush_locked(self) -> None:
        taken = _section.reports()
        if not taken:
            return
        spec = os.environ.get(CONTROL_ENV, "")
        if not spec or not self.active:
            self.active = False  # not reporting (any more): dropped
            return
        try:
            rank = info().rank
        except ValueError:
            return
        sent = time.time()  # the wall clock of the moment the ages are taken from
        for line in _lines(rank, _entries(taken, _clock()), sent):
            if self._send_line(spec, rank, line) is None:
                self.active = False
                return

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
        with self._flush_lock:  # the reports made before it go first
            self._flush_locked()
            return self._send_line(spec, rank, line)

    def _send_line(self, spec: str, rank: int, line: bytes) -> socket.socket | None:
        """Send ``line``; the socket it went out on, or None when it could not be sent."""
        with self._lock:
            if spec != self._spec:
                self._reset(spec)
            if self._disabled:
                return None
            try:
                if self._sock is None:
                    self._sock = self._connect(spec, rank)
                _send_all(self._sock, line)
                return self._sock
            except OSError:
                self._fail()
                return None

    def _fail(self) -> None:
        if self._sock is not None:
            self._sock.close()
        self._sock = None
        self._disabled = True
        self.active = False

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
os.register_at_fork(after_in_child=_reporter._forked)
_at_exit_registered = False


def _flush_at_exit() -> None:
    """Send the last reports at exit: an interpreter's (also after an uncaught
    exception), and a ``multiprocessing`` child's (it leaves with ``os._exit``, after
    its finalizers: ``torch.multiprocessing.spawn``'s ranks, a forked worker)."""
    global _at_exit_registered
    if not _at_exit_registered:  # inherited by forked children
        _at_exit_registered = True
        atexit.register(_reporter.flush)
    mp_util = sys.modules.get("multiprocessing.util")
    if mp_util is not None:  # a child's finalizers start empty: once per process
        mp_util.Finalize(None, _reporter.flush, exitpriority=100)


_records = _section.records
_extend = _records.extend
_REPORT = _section.REPORT


def report(step: int, total: int | None = None, **metrics: float) -> None:
    """Tell the supervisor this rank reached ``step`` (of ``total``), with optional metrics.

    A no-op without ``CORRAL_CONTROL``. Cheap enough to call every step of a fast
    GPU loop: the report is buffered (no syscall, no lock, no encoding here) and a
    background thread sends what piled up every :data:`FLUSH_INTERVAL` seconds,
    before any other SDK event (a checkpoint's) and at exit; every report arrives,
    in order. Never raises and never blocks. Non-finite metric values are sent as
    ``null``; a value that is not a Python number (a tensor) is read now, so pass
    floats you already have to avoid a GPU sync. The :func:`corral.sdk.section`
    timings since the previous report travel with it (``"sections"``: mean seconds
    per section).
    """
    if not _reporter.active and not _reporter.start():
        return
    for value in metrics.values():
        if value.__class__ is not float and value.__class__ is not int:
            plain = _plain(metrics)  # type: ignore[arg-type]
            if plain is None:
                return  # a bad value in this one report: drop it, keep reporting
            metrics = plain  # type: ignore[assignment]
            break
    if step.__class__ is not int or (total is not None and total.__class__ is not int):
        try:
            step, total = int(step), None if total is None else int(total)
        except (TypeError, ValueError):
            return
    _extend((_REPORT, step, total, _clock(), metrics))
    if len(_records) >= _WAKE_AT and not _reporter.woken:
        _reporter.wake()


def flush_reports() -> None:
    """Send the buffered reports now (an agent that takes nothing for
    :data:`STALL_TIMEOUT` seconds turns reporting off): the
    rank wrapper does before it tells the agent the script's exit code."""
    _reporter.flush()


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

    ``rank`` (this process's) and ``time`` are added when missing. The reports
    buffered so far are sent first. Like :func:`report`: a no-op without
    ``CORRAL_CONTROL`` and never raises; it waits only while the agent is reading
    (at most :data:`STALL_TIMEOUT` s for a stuck one); the coordinator receives it
    as ``{"event": "report", **event}``.
    """
    _reporter.send_event(event)
