"""Entry point: ``python -m corral.agent``.

The first stdin line is either the start message or a probe. A probe is
answered with the standard library alone; the agent's heavier machinery
(asyncio, psutil) is imported while the coordinator collects every host's
answer, so the probe round trip costs as little as possible.
"""

from __future__ import annotations

import os
import sys
import time

from corral.agent.probe import probe_info
from corral.agent.protocol import decode_op, encode_event


def _read_line(fd: int) -> bytes:
    line = b""
    while not line.endswith(b"\n"):
        byte = os.read(fd, 1)
        if not byte:
            break
        line += byte
    return line


def main() -> int:
    """Answer an optional probe, read the start message, run until the node is done."""
    # Frames go to the real stdout; anything else printed goes to stderr.
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    stdin_fd = os.dup(0)
    first = _read_line(stdin_fd)
    if not first:
        return 2
    try:
        message = decode_op(first)
    except ValueError as exc:
        print(f"corral agent: expected a probe or start op: {exc}", file=sys.stderr)
        return 2
    if message["op"] == "probe":
        info = probe_info(message.get("workdir") or "", message.get("port"))
        out.write(encode_event({**info, "event": "probe", "time": time.time()}))
        out.flush()
        import corral.agent.node  # noqa: F401  (loaded while the coordinator decides)

        first = _read_line(stdin_fd)
        if not first:
            return 2
        try:
            message = decode_op(first)
        except ValueError:
            message = {"op": "abort"}
        if message["op"] != "start":
            return 0  # the launch was called off before anything started
    elif message["op"] != "start":
        print(f"corral agent: expected a probe or start op, got {message['op']!r}", file=sys.stderr)
        return 2
    from corral.agent.node import run_agent

    return run_agent(message, out, stdin_fd)


if __name__ == "__main__":
    sys.exit(main())
