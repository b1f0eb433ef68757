"""One shared reader per job for its event streams (corral.service.fanout)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from corral.service.eventlog import EventWriter, LoggedEvent
from corral.service.fanout import Feeds
from corral.service.ingest import Live


class _Job:
    """The seam the feeds read through (the store's row): the file and whether it ended."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.ended = False
        self.writer = EventWriter(path)
        self.offsets: list[int] = []  # where each written event starts

    def source(self, job_id: str) -> tuple[Path | None, bool]:
        return self.path, self.ended

    def write(self, n: int) -> None:
        self.offsets.append(self.writer.write({"kind": "log", "n": n, "text": f"line {n}\n"}))


async def _collect(
    feeds: Feeds, start: int = 0, *, pause: asyncio.Event | None = None
) -> list[LoggedEvent]:
    got: list[LoggedEvent] = []
    async for ev in feeds.follow("j1", start):
        got.append(ev)
        if pause is not None:
            await pause.wait()  # a subscriber that stops reading for a while
    return got


def _numbers(events: list[LoggedEvent]) -> list[int]:
    return [int(ev.data["n"]) for ev in events]


def test_many_subscribers_share_one_reader_and_get_every_event_in_order(tmp_path: Path) -> None:
    job = _Job(tmp_path / "events.jsonl")

    async def go() -> tuple[list[list[LoggedEvent]], int, int]:
        live = Live()
        live.bind(asyncio.get_running_loop())
        feeds = Feeds(job.source, live)
        subs = [asyncio.ensure_future(_collect(feeds)) for _ in range(20)]
        await asyncio.sleep(0.05)
        readers = feeds.readers()
        for n in range(300):
            job.write(n)
            if n % 50 == 0:
                live.notify("j1")
                await asyncio.sleep(0.01)
        job.ended = True
        live.notify("j1")
        got = await asyncio.wait_for(asyncio.gather(*subs), 20)
        return got, readers, feeds.readers()

    got, readers, left = asyncio.run(go())
    assert readers == 1
    for events in got:
        assert _numbers(events) == list(range(300))
        assert [ev.pos for ev in events] == job.offsets
    # the file was read and decoded once: every subscriber got the reader's own events
    assert all(a is b for events in got[1:] for a, b in zip(got[0], events, strict=True))
    assert left == 0  # the reader stopped with its last subscriber


def test_a_slow_subscriber_loses_nothing_and_the_others_do_not_wait(tmp_path: Path) -> None:
    job = _Job(tmp_path / "events.jsonl")

    async def go() -> tuple[list[int], list[int], bool]:
        live = Live()
        live.bind(asyncio.get_running_loop())
        feeds = Feeds(job.source, live, queue_events=4)
        gate = asyncio.Event()
        slow = asyncio.ensure_future(_collect(feeds, pause=gate))
        fast = asyncio.ensure_future(_collect(feeds))
        await asyncio.sleep(0.05)
        for n in range(200):
            job.write(n)
            live.notify("j1")
            await asyncio.sleep(0)
        job.ended = True
        live.notify("j1")
        quick = await asyncio.wait_for(fast, 20)  # done while the slow one still waits
        waiting = not slow.done()  # still holding its first event
        gate.set()
        return _numbers(quick), _numbers(await asyncio.wait_for(slow, 20)), waiting

    quick, slow, waiting = asyncio.run(go())
    assert quick == list(range(200))
    assert waiting
    assert slow == list(range(200))


def test_a_subscriber_joining_with_an_offset_gets_the_rest_once(tmp_path: Path) -> None:
    job = _Job(tmp_path / "events.jsonl")

    async def go() -> tuple[list[int], list[int], list[int]]:
        live = Live()
        live.bind(asyncio.get_running_loop())
        feeds = Feeds(job.source, live)
        first = asyncio.ensure_future(_collect(feeds))
        for n in range(100):
            job.write(n)
        live.notify("j1")
        await asyncio.sleep(0.1)
        # a reconnect with Last-Event-ID = the offset after event 39 (behind the reader),
        # and one after event 99 (where the reader is)
        behind = asyncio.ensure_future(_collect(feeds, job.offsets[40]))
        level = asyncio.ensure_future(_collect(feeds, job.offsets[99]))
        await asyncio.sleep(0.05)
        for n in range(100, 150):
            job.write(n)
        job.ended = True
        live.notify("j1")
        got = await asyncio.wait_for(asyncio.gather(first, behind, level), 20)
        return _numbers(got[0]), _numbers(got[1]), _numbers(got[2])

    first, behind, level = asyncio.run(go())
    assert first == list(range(150))
    assert behind == list(range(40, 150))
    assert level == list(range(99, 150))
