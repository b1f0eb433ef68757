"""A worker's message path on the coordinator: its :class:`Mailbox` (what it sent,
for the coordinator's threads) and, for a local worker, :class:`LocalPipes` (its
stdin and stdout used straight from threads; see :mod:`corral.actors._runtime`)."""

from __future__ import annotations

import asyncio
import collections
import os
import threading
from typing import Any

from corral.actors import _framing as fr
from corral.actors.errors import WorkerDied
from corral.transport.base import NodeProcess


class Mailbox:
    """What one worker sent, for the coordinator's threads. Items are ``("msg", (id,
    body))`` (``id``: the request the message answers, see :mod:`._framing`) or
    ``("raise", error)`` (raised once); ``dead`` is the final error, raised by every
    ``recv`` once the items are used up. All the mailboxes of one cluster share one
    condition, so a group operation can wait on all of them.

    A request given up on (a failed ``call``) is :meth:`abandon`-ed: its answers
    are dropped, the ones already here and the ones still to come."""

    def __init__(self, cond: threading.Condition) -> None:
        self.cond = cond
        self.items: collections.deque[tuple[str, Any]] = collections.deque()
        self.dead: WorkerDied | None = None
        self.abandoned: set[int] = set()

    def put(self, kind: str, value: object) -> None:
        with self.cond:
            self.items.append((kind, value))
            self.cond.notify_all()

    def put_msg(self, body: bytes | bytearray) -> None:
        """A message from the worker (dropped when it answers an abandoned request)."""
        answers = fr.msg_id(body)
        with self.cond:
            if self.abandoned:
                # the worker's ids only grow: older abandoned ones never come again
                self.abandoned = {a for a in self.abandoned if a >= answers}
                if answers in self.abandoned:
                    return
            self.items.append(("msg", (answers, body)))
            self.cond.notify_all()

    def abandon(self, request: int) -> None:
        """Drop every answer to ``request`` (the caller holds ``cond``)."""
        self.abandoned.add(request)
        self.items = collections.deque(
            item for item in self.items if item[0] != "msg" or item[1][0] != request
        )

    def renew(self) -> None:
        """A new process took over: nothing it sends answers an old request."""
        with self.cond:
            self.abandoned.clear()

    def finish(self, error: WorkerDied) -> None:
        with self.cond:
            self.dead = error
            self.cond.notify_all()

    def ready(self, since: int = 0) -> bool:
        """Whether a ``recv`` would return or raise at once, counting only messages
        that answer request ``since`` or a later one (caller holds ``cond``)."""
        if self.dead is not None or (self.items and since == 0):
            return True
        return any(kind != "msg" or value[0] >= since for kind, value in self.items)

    def take(self, since: int = 0) -> tuple[str, Any]:
        """The first item :meth:`ready` counts (the caller holds ``cond`` and saw it
        ready); earlier messages stay, in order."""
        if since == 0 and self.items:
            return self.items.popleft()
        for index, (kind, value) in enumerate(self.items):
            if kind != "msg" or value[0] >= since:
                del self.items[index]
                return kind, value
        return "raise", self.dead


class LocalPipes:
    """A local worker's stdin and stdout, used from threads (see the module doc).

    Writes go to a private duplicate of the stdin pipe (so a descriptor the loop
    closes is never reused under a writer), only while asyncio's transport has
    nothing buffered and no frame waits on the loop (the supervisor's lock
    guards both), so frames keep their order. The stdout pipe is left to the
    reader thread: the loop's transport is paused, and closed at the end so the
    process's ``wait()`` returns."""

    def __init__(
        self, stdin: asyncio.WriteTransport, stdout: asyncio.ReadTransport, fds: tuple[int, int]
    ) -> None:
        self.stdin = stdin
        self.stdout = stdout
        self.write_fd: int | None = fds[0]
        self.read_fd = fds[1]

    @classmethod
    def of(cls, proc: NodeProcess) -> LocalPipes | None:
        """The pipes of a local process, before anything was read from its stdout
        (None for other processes: they stay on the loop)."""
        inner = getattr(proc, "_proc", None)
        transport = getattr(inner, "_transport", None)
        if not isinstance(inner, asyncio.subprocess.Process) or transport is None:
            return None
        stdin = transport.get_pipe_transport(0)
        stdout = transport.get_pipe_transport(1)
        if not isinstance(stdin, asyncio.WriteTransport) or not isinstance(
            stdout, asyncio.ReadTransport
        ):
            return None
        if stdin.is_closing() or stdout.is_closing() or len(getattr(proc.stdout, "_buffer", b"")):
            return None
        try:
            write_fd = os.dup(stdin.get_extra_info("pipe").fileno())
        except OSError:
            return None
        try:
            read_fd = os.dup(stdout.get_extra_info("pipe").fileno())
        except OSError:
            os.close(write_fd)
            return None
        stdout.pause_reading()
        return cls(stdin, stdout, (write_fd, read_fd))

    def write_now(self, data: bytes) -> bytes | None:
        """Write ``data`` if nothing is ahead of it (the caller holds the lock): what
        is left to write (``data`` itself when nothing could be), ``b""`` when all
        went out or the worker is gone, None when the transport must take it."""
        if self.write_fd is None or self.stdin.is_closing():
            return b""
        if self.stdin.get_write_buffer_size():
            return None
        try:
            written = os.write(self.write_fd, data)
        except (BlockingIOError, InterruptedError):
            return data
        except OSError:  # the worker is gone: dropped, as the transport would
            return b""
        return data[written:]

    def close_writer(self) -> None:
        """Drop the duplicate of stdin (the caller holds the lock), so closing the
        transport is the worker's EOF."""
        if self.write_fd is not None:
            os.close(self.write_fd)
            self.write_fd = None


__all__ = ["LocalPipes", "Mailbox"]
