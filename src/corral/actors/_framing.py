"""Frames on a worker's channel: an 8-byte big-endian body length, a kind byte, the body.

The channel is the worker process's stdin (coordinator -> worker) and a private
copy of its stdout (worker -> coordinator), carried by the SSH session or a
local pipe, so nothing here listens on a port. User values are pickled
(:data:`MSG`, :data:`DONE`); control frames carry JSON.

A :data:`MSG` body starts with an 8-byte message id (:data:`MSG_ID`): from the
coordinator, that worker's sequence number of the message (1, 2, ...); from a
worker, the id of the last message its ``work_fn`` received (0: none yet), the
request it answers. So the coordinator knows a late reply to a request it gave up
on (a failed ``call``) and never hands it to a later one. The blocking helpers
are the worker's (and the reader thread's of a local worker on the coordinator),
:func:`read_frame_async` the coordinator's for SSH channels.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import pickle
import struct
from typing import Any, Protocol

HEADER = struct.Struct(">QB")
#: Bodies larger than this are refused as garbage (1 TiB).
MAX_BODY = 1 << 40
PICKLE_PROTOCOL = 5

# coordinator -> worker
INIT = 1
MSG = 2
STOP = 3
PING = 4  # heartbeat: a worker that hears nothing for its timeout kills itself
# worker -> coordinator (MSG too)
HELLO = 10
READY = 11
ERROR = 12
DONE = 13
REPORT = 14

KINDS = frozenset({INIT, MSG, STOP, PING, HELLO, READY, ERROR, DONE, REPORT})
#: The id in front of every MSG body (see the module doc).
MSG_ID = struct.Struct(">Q")
_unpack_id = MSG_ID.unpack_from


class ProtocolError(ValueError):
    """Bytes on the channel that are not a frame (e.g. a login script's output)."""


def header(kind: int, length: int) -> bytes:
    """The 9-byte header of a frame."""
    return HEADER.pack(length, kind)


def parse_header(raw: bytes) -> tuple[int, int]:
    """``(kind, body length)`` of a header; ProtocolError when it is not one."""
    length, kind = HEADER.unpack(raw)
    if kind not in KINDS or length > MAX_BODY:
        raise ProtocolError(f"not a corral actor frame: {raw!r}")
    return kind, length


def dumps(value: object) -> bytes:
    """Pickle a user value."""
    return pickle.dumps(value, protocol=PICKLE_PROTOCOL)


class _Unpickler(pickle.Unpickler):
    """Finds the classes of the worker's copy of the main script (``__mp_main__``) in
    this process's ``__main__``."""

    def find_class(self, module: str, name: str) -> Any:
        if module == "__mp_main__":
            module = "__main__"
        return super().find_class(module, name)


#: Below this many bytes a value is unpickled from a copy (faster than from a view).
_COPY_BELOW = 1 << 16


def loads(body: bytes | bytearray, offset: int = 0) -> Any:
    """Unpickle the user value at ``offset`` of ``body`` (a large one without a copy,
    unless it names ``__mp_main__``)."""
    if body.find(b"__mp_main__", offset) >= 0:
        return _Unpickler(io.BytesIO(memoryview(body)[offset:])).load()
    if offset == 0:
        return pickle.loads(body)
    if len(body) - offset < _COPY_BELOW:
        return pickle.loads(body[offset:])
    return pickle.loads(memoryview(body)[offset:])


def msg_head(msg_id: int) -> bytes:
    """The id that goes in front of a MSG body."""
    return MSG_ID.pack(msg_id)


def msg_id(body: bytes | bytearray) -> int:
    """The id of a MSG body (ProtocolError when it is too short to hold one)."""
    if len(body) < 8:
        raise ProtocolError(f"a message frame of {len(body)} bytes has no id")
    answers: int = _unpack_id(body)[0]
    return answers


def msg_value(body: bytes | bytearray) -> Any:
    """The user value of a MSG body (after its id)."""
    return loads(body, 8)


def encode_json(value: object) -> bytes:
    """A control frame's body."""
    return json.dumps(value).encode()


def decode_json(body: bytes | bytearray | memoryview) -> Any:
    """A control frame's body, decoded."""
    return json.loads(bytes(body))


# -- blocking I/O (the worker; a local worker's reader thread) ----------------------------


class Readable(Protocol):
    """A blocking byte stream (``io.FileIO``, ``io.BufferedReader``)."""

    def readinto(self, buffer: bytearray | memoryview, /) -> int | None: ...


def read_exact(stream: Readable, size: int) -> bytearray | None:
    """Exactly ``size`` bytes from ``stream`` (partial reads are continued); None at EOF
    before the first byte, EOFError at EOF after some."""
    buf = bytearray(size)
    view = memoryview(buf)
    got = 0
    while got < size:
        n = stream.readinto(view[got:])
        if not n:
            if got == 0:
                return None
            raise EOFError(f"channel closed after {got} of {size} bytes")
        got += n
    return buf


def read_frame(stream: Readable) -> tuple[int, bytearray] | None:
    """The next ``(kind, body)`` from ``stream``; None at a clean EOF."""
    raw = read_exact(stream, HEADER.size)
    if raw is None:
        return None
    kind, length = parse_header(bytes(raw))
    if length == 0:
        return kind, bytearray()
    body = read_exact(stream, length)
    if body is None:
        raise EOFError("channel closed before the frame's body")
    return kind, body


def write_all(fd: int, data: bytes | bytearray | memoryview) -> None:
    """Write all of ``data`` to ``fd`` (partial writes are continued)."""
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def write_frame(fd: int, kind: int, body: bytes = b"", *, head: bytes = b"") -> None:
    """Write one frame to ``fd`` whose body is ``head + body`` (without joining a large
    ``body``); the caller serialises writers."""
    start = header(kind, len(head) + len(body)) + head
    if len(body) < 1 << 16:
        write_all(fd, start + body)
    else:
        write_all(fd, start)
        write_all(fd, body)


# -- asyncio (the coordinator) -----------------------------------------------------------


async def read_frame_async(reader: asyncio.StreamReader) -> tuple[int, bytes] | None:
    """The next ``(kind, body)``; None at a clean EOF (IncompleteReadError mid-frame,
    ProtocolError for bytes that are not a frame)."""
    try:
        raw = await reader.readexactly(HEADER.size)
    except asyncio.IncompleteReadError as exc:
        if not exc.partial:
            return None
        raise
    kind, length = parse_header(raw)
    body = await reader.readexactly(length) if length else b""
    return kind, body
