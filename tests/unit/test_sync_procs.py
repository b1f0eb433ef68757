"""Processes of corral sync: a whole group is stopped and reaped, even mid-start."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable

import psutil
import pytest

from corral.sync.procs import communicate, gather_all, kill_group, spawn

TREE = "sleep 30 & sleep 30 & wait"  # a shell with two children, all in one group


def group_members(pgid: int) -> int:
    """How many running (not zombie) processes are in the group."""
    count = 0
    for proc in psutil.process_iter():
        try:
            if os.getpgid(proc.pid) == pgid and proc.status() != psutil.STATUS_ZOMBIE:
                count += 1
        except (OSError, psutil.Error):
            continue
    return count


def group_exists(pgid: int) -> bool:
    """A running (not zombie) process is in the group."""
    return group_members(pgid) > 0


async def until(condition: Callable[[], bool], within: float = 30.0) -> None:
    """Poll ``condition`` on the event loop until it holds; fail after ``within`` s."""
    deadline = asyncio.get_running_loop().time() + within
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


def test_kill_group_takes_the_children_too() -> None:
    async def main() -> int:
        proc = await spawn("sh", "-c", TREE, stdout=asyncio.subprocess.PIPE)
        await until(lambda: group_members(proc.pid) == 3)  # the shell and its two sleeps
        await kill_group(proc, grace=2)
        assert proc.returncode is not None
        return proc.pid

    assert not group_exists(asyncio.run(main()))


def test_a_cancelled_start_leaves_nothing() -> None:
    started: list[int] = []

    async def main() -> None:
        real = asyncio.create_subprocess_exec
        running = asyncio.Event()  # the process exists, its setup is not finished
        release = asyncio.Event()  # set once the cancellation has landed

        async def slow_start(*argv: str, **kw: object) -> asyncio.subprocess.Process:
            proc = await real(*argv, **kw)  # type: ignore[arg-type]
            started.append(proc.pid)
            running.set()
            await release.wait()  # cancelled here: pipes "not yet connected"
            return proc

        asyncio.create_subprocess_exec = slow_start  # type: ignore[assignment]
        try:
            task = asyncio.ensure_future(spawn("sh", "-c", TREE, stdout=asyncio.subprocess.PIPE))
            await asyncio.wait_for(running.wait(), 30)
            task.cancel()
            release.set()
            with pytest.raises(asyncio.CancelledError):
                await task
        finally:
            asyncio.create_subprocess_exec = real

    asyncio.run(main())
    assert started and not group_exists(started[0])


def test_communicate_captures_and_feeds_stdin() -> None:
    code, out, err = asyncio.run(communicate("sh", "-c", "cat; echo e >&2; exit 3", input=b"in"))
    assert (code, out, err) == (3, b"in", b"e\n")


def test_gather_all_waits_for_every_cleanup_when_cancelled() -> None:
    cleaned: list[str] = []

    waiting: list[str] = []
    both_waiting = asyncio.Event()

    async def worker(name: str, cleanup: float) -> str:
        waiting.append(name)
        if len(waiting) == 2:
            both_waiting.set()
        try:
            await asyncio.Event().wait()  # until cancelled
        except asyncio.CancelledError:
            await asyncio.sleep(cleanup)  # e.g. stopping and reaping a process group
            cleaned.append(name)
            raise
        return name

    async def main() -> None:
        task = asyncio.ensure_future(gather_all(worker("fast", 0), worker("slow", 0.3)))
        await asyncio.wait_for(both_waiting.wait(), 30)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert cleaned == ["fast", "slow"]

    asyncio.run(main())
    assert asyncio.run(gather_all(asyncio.sleep(0, "a"), asyncio.sleep(0, "b"))) == ["a", "b"]
