"""Wire format between the coordinator and a node agent.

Agent -> coordinator (the agent's stdout) is a stream of frames::

    <kind> <rank> <length>\\n<length bytes>

``kind`` is ``o`` (stdout) or ``e`` (stderr) with a payload of that rank's
output (``rank`` is ``-`` for node-level output such as torchrun's own), or
``j`` with one JSON event as payload (:mod:`corral.agent.events`).

Output payloads always end in ``\\n`` or ``\\r`` (:class:`Framer`): whole lines
are sent as soon as their newline arrives; bytes after the last newline that
contain a ``\\r`` (a progress bar such as tqdm's redrawing its line) are sent up
to and including their last ``\\r``, at most every :data:`CR_INTERVAL` seconds
per stream; a line longer than :data:`MAX_LINE` is cut into pieces, and what
is left at EOF is sent as is; both get a ``\\n`` added in the frame only. The
coordinator shows, per rank, the latest ``\\r`` segment of an unfinished line.
The host-side log files get every byte exactly once, in order, nothing added.

Coordinator -> agent (the agent's stdin) is JSON lines: the first is (after a
``{"op": "prestart", "node": ...}`` of a head start, :mod:`corral.job.headstart`)
``{"op": "probe", ...}`` (answered with a ``probe`` event; it may carry the
node's plan as ``"prestart"``, or a ``{"op": "prestart", "node": ...}`` follows
it: the node's processes start held at their gates, :mod:`corral.agent.prestart`)
or ``{"op": "start", ...}`` (``abort`` instead: nothing is started); then
``{"op": "hb"}`` heartbeats, ``{"op": "stop", "grace": S}``, ``{"op": "kill"}``,
``{"op": "dump", "timeout": S, "trace_wait": T}`` (stack and flight recorder
dumps) and
``{"op": "reply", "rank": R, "message": {...}}`` (an answer to a rank's SDK
request). EOF on stdin means the coordinator is gone: the agent tears the
node down. A line that is not a JSON object with an ``op`` is reported on the
agent's stderr and ignored.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import asyncio

STDOUT = b"o"
STDERR = b"e"
EVENT = b"j"
NODE = -1  # rank value of node-level output

MAX_FRAME = 1 << 24
MAX_LINE = 8 << 20  # longer lines are cut into pieces (frames are at most 16 MiB)
CR_INTERVAL = 0.2  # at most this often per stream for ``\\r``-terminated output
EVENT_TEXT_LIMIT = 256 * 1024  # longest stack dump text in one event (characters)
#: Largest flight recorder dump sent to the coordinator (bytes; larger ones stay on the node).
TRACE_LIMIT = 1 << 20


def encode_frame(kind: bytes, rank: int, payload: bytes) -> bytes:
    """One frame: header line plus payload."""
    rank_text = b"-" if rank == NODE else str(rank).encode()
    return b"%s %s %d\n" % (kind, rank_text, len(payload)) + payload


def encode_event(event: dict[str, Any]) -> bytes:
    """A ``j`` frame carrying ``event`` as JSON."""
    return encode_frame(EVENT, NODE, json.dumps(event, separators=(",", ":")).encode())


def decode_header(line: bytes) -> tuple[bytes, int, int]:
    """Parse a frame header into (kind, rank, length); ValueError if malformed."""
    parts = line.split()
    if len(parts) != 3 or parts[0] not in (STDOUT, STDERR, EVENT):
        raise ValueError(f"bad frame header {line[:80]!r}")
    rank = NODE if parts[1] == b"-" else int(parts[1])
    length = int(parts[2])
    if not 0 <= length <= MAX_FRAME:
        raise ValueError(f"bad frame length {length}")
    return parts[0], rank, length


async def read_frame(reader: asyncio.StreamReader) -> tuple[bytes, int, bytes] | None:
    """The next frame of an agent's stdout as (kind, rank, payload); None at its end.
    Raises ValueError for a line that is no frame header (:func:`decode_header`) and
    ``asyncio.IncompleteReadError`` when the stream ends inside a payload."""
    header = await reader.readline()
    if not header:
        return None
    kind, rank, length = decode_header(header)
    return kind, rank, await reader.readexactly(length)


def encode_op(op: dict[str, Any]) -> bytes:
    """One coordinator -> agent message."""
    return json.dumps(op, separators=(",", ":")).encode() + b"\n"


def decode_op(line: bytes) -> dict[str, Any]:
    """Parse one coordinator -> agent line; ValueError when it is not a JSON object
    with a string ``op``."""
    try:
        op = json.loads(line)
    except ValueError:
        raise ValueError(f"not JSON: {line[:80]!r}") from None
    if not isinstance(op, dict) or not isinstance(op.get("op"), str):
        raise ValueError(f"not an op: {line[:80]!r}")
    return op


def frame_payload(data: bytes) -> bytes:
    """What goes in an output frame for ``data`` (a :class:`Framer` chunk): the
    bytes themselves, with a ``\\n`` added when they end in neither ``\\n`` nor ``\\r``."""
    return data if data.endswith((b"\n", b"\r")) else data + b"\n"


class Framer:
    """Cuts one output stream into the chunks sent as frames (see the module docstring).

    Sans-IO: :meth:`feed` takes what was read and returns what to send now (maybe
    ``b""``); :meth:`due` says when :meth:`poll` has ``\\r`` output to send without
    more input; :meth:`close` returns the rest at EOF. The chunks concatenated are
    exactly the bytes fed.
    """

    def __init__(
        self,
        *,
        interval: float = CR_INTERVAL,
        max_line: int = MAX_LINE,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.interval = interval
        self.max_line = max_line
        self.clock = clock
        self._pending = bytearray()
        self._cr_end = 0  # pending[:_cr_end] ends in \r and waits for its turn
        self._last_sent: float | None = None

    def feed(self, data: bytes) -> bytes:
        """Take ``data``; return the chunk to send now (``b""``: nothing yet)."""
        start = len(self._pending)
        self._pending += data
        newline = data.rfind(b"\n")
        if newline >= 0:
            end = start + newline + 1
            carriage = self._pending.rfind(b"\r", end)
            return self._take(carriage + 1 if carriage >= 0 else end)
        carriage = data.rfind(b"\r")
        if carriage >= 0:
            self._cr_end = start + carriage + 1
        if len(self._pending) >= self.max_line:  # a pathological line: pass it on in pieces
            return self._take(len(self._pending))
        return self.poll()

    def due(self) -> float | None:
        """When the waiting ``\\r`` output may be sent (None: nothing waits)."""
        if not self._cr_end:
            return None
        if self._last_sent is None:
            return self.clock()
        return self._last_sent + self.interval

    def poll(self) -> bytes:
        """The waiting ``\\r`` output once it is due, else ``b""``."""
        when = self.due()
        if when is None or self.clock() < when:
            return b""
        return self._take(self._cr_end)

    def close(self) -> bytes:
        """Everything not sent yet (at EOF)."""
        return self._take(len(self._pending))

    def _take(self, end: int) -> bytes:
        chunk = bytes(self._pending[:end])
        del self._pending[:end]
        self._cr_end = 0
        if chunk:
            self._last_sent = self.clock()
        return chunk


class Complaints:
    """Rate-limited notes about dropped messages: at most one line per ``interval``
    seconds, with how many were dropped silently since the last one."""

    def __init__(self, interval: float = 5.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval = interval
        self.clock = clock
        self._last: float | None = None
        self._quiet = 0

    def note(self, text: str) -> str | None:
        """The line to print for this complaint, or None while rate-limited."""
        now = self.clock()
        if self._last is not None and now - self._last < self.interval:
            self._quiet += 1
            return None
        self._last = now
        quiet, self._quiet = self._quiet, 0
        more = f" ({quiet} more dropped before)" if quiet else ""
        return f"corral agent: {text}{more}"
