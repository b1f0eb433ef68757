"""One reader per job for its live event streams.

Every SSE stream of a job used to read (and JSON-decode) the job's events file on
its own: 100 streams, 100 reads of every line. A :class:`Feeds` keeps one
:class:`_Feed` per job with subscribers; it tails the file once and hands every
event, as read (the same :class:`~corral.service.eventlog.LoggedEvent`), to each
subscriber's bounded queue. Nothing is ever dropped: a subscriber whose queue is
full is detached, drains what it has and goes on reading the file from its own
offset, then re-attaches once it has caught up. A subscriber that starts behind
the reader (a ``Last-Event-ID`` resume, a late joiner) reads on its own until it
has caught up too. The reader stops when its last subscriber leaves, and ends its
subscribers' streams once the job has ended and the file has nothing more.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass, field
from pathlib import Path

from corral.service.eventlog import LoggedEvent, read_events
from corral.service.ingest import Live

# (the job's events file, or None while it has none; whether the job has ended)
JobSource = Callable[[str], tuple[Path | None, bool]]

CHUNK_BYTES = 256 << 10  # what one round of a reader reads at most
QUEUE_EVENTS = 1024  # a subscriber's queue; past it, it reads the file on its own
WAIT_S = 0.25  # a reader (or an own-reading subscriber) looks again at least this often


@dataclass(eq=False)
class _Subscriber:
    """One stream of a job: where it stands and what the reader handed it."""

    pos: int
    items: deque[LoggedEvent] = field(default_factory=deque)
    attached: bool = False
    ended: bool = False
    wake: asyncio.Event = field(default_factory=asyncio.Event)


class _Feed:
    """The one reader of a job's events file while it has subscribers."""

    def __init__(self, job_id: str, pos: int, source: JobSource, live: Live, size: int) -> None:
        self.job_id = job_id
        self.pos = pos  # where the reader reads next (an event boundary)
        self.ended = False  # the job has ended and the file had nothing after pos
        self.path: Path | None = None
        self.subscribers: set[_Subscriber] = set()
        self.moved = asyncio.Event()  # set when pos moves on or the feed ends
        self.error: Exception | None = None  # what stopped the reader (its subscribers raise it)
        self._source = source
        self._live = live
        self._size = size
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def attach(self, sub: _Subscriber) -> bool:
        """Take ``sub`` on if it has caught up with the reader (no await in between:
        nothing can move the reader meanwhile)."""
        if self.ended or sub.pos < self.pos:
            return False
        sub.attached = True
        return True

    def lookup(self) -> tuple[Path | None, bool]:
        """The job's events file (kept once known) and whether the job has ended."""
        path, ended = self._source(self.job_id)
        self.path = self.path or path
        return self.path, ended

    async def _run(self) -> None:
        try:
            await self._tail()
        except Exception as exc:  # the job's row gone, the store down: every stream says so
            self.error = exc
            for sub in self.subscribers:
                sub.attached = False
                sub.wake.set()
            self._moved()

    async def _tail(self) -> None:
        while True:
            path, ended = self.lookup()
            batch = list(read_events(path, self.pos, max_bytes=CHUNK_BYTES)) if path else []
            for ev in batch:
                self.pos = ev.next_pos
                self._hand_out(ev)
            if batch:
                self._moved()
                await asyncio.sleep(0)  # let the subscribers send before reading on
                continue
            if ended:  # nothing after pos and the job is over
                self.ended = True
                for sub in self.subscribers:
                    sub.ended = True
                    sub.wake.set()
                self._moved()
                return
            await self._live.wait(self.job_id, WAIT_S)

    def _hand_out(self, ev: LoggedEvent) -> None:
        for sub in self.subscribers:
            if not sub.attached or ev.pos < sub.pos:  # detached, or it joined further on
                continue
            if len(sub.items) >= self._size:  # too slow: it reads on from its own offset
                sub.attached = False
            else:
                sub.items.append(ev)
            sub.wake.set()

    def _moved(self) -> None:
        self.moved.set()
        self.moved = asyncio.Event()


class Feeds:
    """The shared readers of the jobs being streamed (one event loop's)."""

    def __init__(self, source: JobSource, live: Live, queue_events: int = QUEUE_EVENTS) -> None:
        self._source = source
        self._live = live
        self._size = queue_events
        self._feeds: dict[str, _Feed] = {}

    def readers(self) -> int:
        """How many jobs have a running reader."""
        return len(self._feeds)

    async def follow(self, job_id: str, start: int = 0) -> AsyncGenerator[LoggedEvent, None]:
        """The job's events from byte ``start`` on, in order, each once, until the job
        has ended and nothing more is written (the caller may stop earlier)."""
        feed = self._feeds.get(job_id)
        if feed is None:
            feed = self._feeds[job_id] = _Feed(job_id, start, self._source, self._live, self._size)
            feed.start()
        sub = _Subscriber(pos=start)
        feed.subscribers.add(sub)
        try:
            while True:
                if sub.items:  # handed over by the reader (drained even once detached)
                    ev = sub.items.popleft()
                    sub.pos = ev.next_pos
                    yield ev
                    continue
                if feed.error is not None:
                    raise feed.error
                if sub.attached:
                    if sub.ended:
                        return
                    sub.wake.clear()
                    await sub.wake.wait()
                    continue
                if feed.attach(sub):
                    continue
                # behind the reader (or too slow for it): read the file on our own
                path = feed.path or feed.lookup()[0]
                batch = list(read_events(path, sub.pos, max_bytes=CHUNK_BYTES)) if path else []
                for ev in batch:
                    sub.pos = ev.next_pos
                    yield ev
                if not batch:
                    if feed.ended:
                        return
                    moved = feed.moved
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(moved.wait(), WAIT_S)
        finally:
            feed.subscribers.discard(sub)
            if not feed.subscribers and self._feeds.get(job_id) is feed:
                del self._feeds[job_id]
                await feed.stop()
