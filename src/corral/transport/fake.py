"""A scripted transport for unit tests (the fake at the transport seam).

Each host's behaviour is an async function that plays the node agent: it
receives a :class:`FakeNode` to emit frames and events and to read the
coordinator's ops, then returns an exit code. No process is started.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from corral.agent.protocol import NODE, STDERR, STDOUT, encode_event, encode_frame
from corral.cluster.model import Host
from corral.errors import ConnectError

Behaviour = Callable[["FakeNode"], Awaitable[int]]


class FakeNode:
    """One scripted node process: what the supervisor sees as the agent."""

    def __init__(self, host: Host, argv: Sequence[str]) -> None:
        self.host = host
        self.argv = list(argv)
        self.stdout = asyncio.StreamReader()
        self.stderr = asyncio.StreamReader()
        self.ops: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.received: list[dict[str, Any]] = []
        self.signals: list[int] = []
        self._buffer = b""
        self._exit: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self.stdin_closed = False

    # -- what the supervisor calls (NodeProcess) --------------------------------

    def write(self, data: bytes) -> None:
        """Collect JSON-line ops from the coordinator."""
        self._buffer += data
        while b"\n" in self._buffer:
            line, self._buffer = self._buffer.split(b"\n", 1)
            op = json.loads(line)
            self.received.append(op)
            self.ops.put_nowait(op)

    def close_stdin(self) -> None:
        """Record EOF on stdin."""
        self.stdin_closed = True

    def signal(self, signum: int) -> None:
        """Record the signal; SIGKILL ends the fake process at once."""
        self.signals.append(signum)
        if signum == 9:
            self.finish(-9)

    async def wait(self) -> int:
        """The behaviour's exit code."""
        return await asyncio.shield(self._exit)

    # -- what a behaviour calls ---------------------------------------------------

    def event(self, name: str, **fields: Any) -> None:
        """Emit an agent event."""
        self.stdout.feed_data(encode_event({"event": name, "time": time.time(), **fields}))

    def out(self, rank: int, text: str) -> None:
        """Emit whole lines of stdout for ``rank`` (``NODE`` for node-level)."""
        self.stdout.feed_data(encode_frame(STDOUT, rank, text.encode()))

    def err(self, rank: int, text: str) -> None:
        """Emit whole lines of stderr for ``rank``."""
        self.stdout.feed_data(encode_frame(STDERR, rank, text.encode()))

    async def next_op(self, name: str | None = None, timeout: float = 30.0) -> dict[str, Any]:
        """Wait for the next op from the coordinator (of kind ``name``, skipping others)."""
        while True:
            op = await asyncio.wait_for(self.ops.get(), timeout)
            if name is None or op.get("op") == name:
                return op

    def finish(self, code: int) -> None:
        """End the fake process: EOF on its streams, then exit ``code``."""
        if self._exit.done():
            return
        self.stdout.feed_eof()
        self.stderr.feed_eof()
        self._exit.set_result(code)


class FakeTransport:
    """Plays scripted behaviours per host name instead of starting processes."""

    def __init__(
        self,
        behaviours: Mapping[str, Behaviour],
        *,
        unreachable: Sequence[str] = (),
    ) -> None:
        self.behaviours = dict(behaviours)
        self.unreachable = set(unreachable)
        self.nodes: dict[str, FakeNode] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self.closed = False

    async def start(
        self,
        host: Host,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> FakeNode:
        """Start the behaviour scripted for ``host``."""
        if host.name in self.unreachable:
            raise ConnectError("cannot connect", host=host.name, cause="unreachable")
        node = FakeNode(host, argv)
        self.nodes[host.name] = node
        behaviour = self.behaviours[host.name]

        async def play() -> None:
            code = await behaviour(node)
            node.finish(code)

        self._tasks.append(asyncio.ensure_future(play()))
        return node

    async def close(self) -> None:
        """Cancel behaviours still running."""
        self.closed = True
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


__all__ = ["NODE", "Behaviour", "FakeNode", "FakeTransport"]
