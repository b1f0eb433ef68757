"""Entry point: ``python -m corral.agent``.

The first stdin line is either the start message or a probe. A probe is
answered with the standard library alone; the agent's heavier machinery
(asyncio, psutil) is imported while the coordinator collects every host's
answer, so the probe round trip costs as little as possible.
"""

from __future__ import annotations

import json
import os
import sys
import time

from corral.agent.probe import probe_info
from corral.agent.protocol import encode_event


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
    message = json.loads(first)
    if message.get("op") == "probe":
        info = probe_info(message.get("workdir") or "", message.get("port"))
        out.write(encode_event({"event": "probe", "time": time.time(), **info}))
        out.flush()
        import corral.agent.node  # noqa: F401  (loaded while the coordinator decides)

        first = _read_line(stdin_fd)
        if not first:
            return 2
        message = json.loads(first)
        if message.get("op") != "start":
            return 0  # the launch was called off before anything started
    from corral.agent.node import run_agent

    return run_agent(message, out, stdin_fd)


if __name__ == "__main__":
    sys.exit(main())
