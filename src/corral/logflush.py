"""Log files that a reader (``tail -f``, the web's per-rank links) sees within a
moment of a line, at the cost of one flush per file per :data:`FLUSH_DELAY`.

Writers append through ordinary buffered files (a chatty rank's output costs one
``write`` per buffer, not per line) and tell a :class:`FlushSoon` which file they
wrote; it flushes every such file :data:`FLUSH_DELAY` seconds after the first
write of a burst, on the running event loop (at once when there is none).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import IO

FLUSH_DELAY = 0.25
"""Seconds between a write and the flush that makes it visible (at most)."""


class FlushSoon:
    """Flushes the files written to within :data:`FLUSH_DELAY` seconds of the write.

    ``on_error(handle, exc)`` hears about a flush that failed (disk full); without
    it the error is dropped here and raised by the file's next write or close."""

    def __init__(
        self,
        delay: float = FLUSH_DELAY,
        on_error: Callable[[IO[bytes], OSError], None] | None = None,
    ) -> None:
        self.delay = delay
        self.on_error = on_error
        self._dirty: dict[int, IO[bytes]] = {}
        self._timer: asyncio.TimerHandle | None = None

    def wrote(self, handle: IO[bytes]) -> None:
        """``handle`` has unflushed bytes: flush it soon."""
        self._dirty[id(handle)] = handle
        if self._timer is not None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self.flush()
            return
        self._timer = loop.call_later(self.delay, self.flush)

    def flush(self) -> None:
        """Flush every file written since the last flush (closed ones are skipped)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        dirty = list(self._dirty.values())
        self._dirty.clear()
        for handle in dirty:
            if handle.closed:
                continue
            try:
                handle.flush()
            except OSError as exc:
                if self.on_error is not None:
                    self.on_error(handle, exc)

    def forget(self, handle: IO[bytes]) -> None:
        """Stop tracking ``handle`` (it is being closed, which flushes it)."""
        self._dirty.pop(id(handle), None)


__all__ = ["FLUSH_DELAY", "FlushSoon"]
