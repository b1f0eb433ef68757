"""Wire format between the coordinator and a node agent.

Agent -> coordinator (the agent's stdout) is a stream of frames::

    <kind> <rank> <length>\\n<length bytes>

``kind`` is ``o`` (stdout) or ``e`` (stderr) with a payload of whole lines of
that rank (``rank`` is ``-`` for node-level output such as torchrun's own), or
``j`` with one JSON event as payload. Whole lines per frame keep the
coordinator's per-line work to a split and a prefix.

Coordinator -> agent (the agent's stdin) is JSON lines: the first is
``{"op": "start", ...}``; then ``{"op": "hb"}`` heartbeats, ``{"op": "stop",
"grace": S}`` and ``{"op": "kill"}``. EOF on stdin means the coordinator is
gone: the agent tears the node down.
"""

from __future__ import annotations

import json
from typing import Any

STDOUT = b"o"
STDERR = b"e"
EVENT = b"j"
NODE = -1  # rank value of node-level output

MAX_FRAME = 1 << 24


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


def encode_op(op: dict[str, Any]) -> bytes:
    """One coordinator -> agent message."""
    return json.dumps(op, separators=(",", ":")).encode() + b"\n"
