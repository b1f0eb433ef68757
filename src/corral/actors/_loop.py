"""The coordinator's background loop and where workers' stderr goes (see
:mod:`corral.actors._runtime`)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import queue
import sys
import threading
from collections.abc import Coroutine
from pathlib import Path
from typing import IO, Any, TypeVar

from corral.job.logfiles import LogFiles

T = TypeVar("T")


class LoopThread:
    """An asyncio loop running in a daemon thread; the sync API calls into it."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run ``coro`` on the loop and wait for its result (from another thread)."""
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise

    def close(self) -> None:
        """Stop the loop and its thread."""
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)
        if not self._thread.is_alive():
            self.loop.close()


class Output:
    """Workers' stderr: to the coordinator's stderr as ``[host:rank] line`` (from a
    thread of its own, so a stalled terminal never stalls supervision) and to
    ``<log_dir>/<host>.<rank>.log`` (0600)."""

    def __init__(self, *, echo: bool, log_dir: Path | None, stream: IO[str] | None = None) -> None:
        self.logs = LogFiles(log_dir) if log_dir is not None else None
        self._stream = stream if stream is not None else sys.stderr
        self._queue: queue.SimpleQueue[bytes | None] | None = None
        if echo:
            self._queue = queue.SimpleQueue()
            self._thread = threading.Thread(target=self._write, name="corral-echo", daemon=True)
            self._thread.start()

    def lines(self, host: str, rank: int, data: bytes) -> None:
        """Whole lines (or a final partial one) of one worker's stderr."""
        if self.logs is not None:
            self.logs.write(host, rank, data)
            self.logs.flush()  # live: tail -f works
        if self._queue is not None:
            prefix = f"[{host}:{rank}] ".encode()
            self._queue.put(b"".join(prefix + line for line in data.splitlines(keepends=True)))

    def _write(self) -> None:
        assert self._queue is not None
        buffer = getattr(self._stream, "buffer", None)
        while (data := self._queue.get()) is not None:
            if not data.endswith(b"\n"):
                data += b"\n"
            with contextlib.suppress(OSError, ValueError):
                if buffer is not None:
                    buffer.write(data)
                    buffer.flush()
                else:
                    self._stream.write(data.decode(errors="replace"))
                    self._stream.flush()

    def close(self) -> None:
        """Write out what is queued and close the log files."""
        if self._queue is not None:
            self._queue.put(None)
            self._thread.join(timeout=10)
            self._queue = None
        if self.logs is not None:
            self.logs.close()


__all__ = ["LoopThread", "Output"]
