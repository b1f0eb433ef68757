"""Processes of corral sync: a whole group is stopped and reaped, even mid-start."""

from __future__ import annotations

import asyncio
import os

import psutil
import pytest

from corral.sync.procs import communicate, gather_all, kill_group, spawn

TREE = "sleep 30 & sleep 30 & wait"  # a shell with two children, all in one group


def group_exists(pgid: int) -> bool:
    """A running (not zombie) process is in the group."""
    for proc in psutil.process_iter():
        try:
            if os.getpgid(proc.pid) == pgid and proc.status() != psutil.STATUS_ZOMBIE:
                return True
        except (OSError, psutil.Error):
            continue
    return False


def test_kill_group_takes_the_children_too() -> None:
    async def main() -> int:
        proc = await spawn("sh", "-c", TREE, stdout=asyncio.subprocess.PIPE)
        await asyncio.sleep(0.2)
        assert group_exists(proc.pid)
        await kill_group(proc, grace=2)
        assert proc.returncode is not None
        return proc.pid

    assert not group_exists(asyncio.run(main()))


def test_a_cancelled_start_leaves_nothing() -> None:
    started: list[int] = []

    async def main() -> None:
        real = asyncio.create_subprocess_exec

        async def slow_start(*argv: str, **kw: object) -> asyncio.subprocess.Process:
            proc = await real(*argv, **kw)  # type: ignore[arg-type]
            started.append(proc.pid)
            await asyncio.sleep(0.5)  # cancelled here: pipes "not yet connected"
            return proc

        asyncio.create_subprocess_exec = slow_start  # type: ignore[assignment]
        try:
            task = asyncio.ensure_future(spawn("sh", "-c", TREE, stdout=asyncio.subprocess.PIPE))
            while not started:
                await asyncio.sleep(0.01)
            task.cancel()
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

    async def worker(name: str, cleanup: float) -> str:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            await asyncio.sleep(cleanup)  # e.g. stopping and reaping a process group
            cleaned.append(name)
            raise
        return name

    async def main() -> None:
        task = asyncio.ensure_future(gather_all(worker("fast", 0), worker("slow", 0.3)))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert cleaned == ["fast", "slow"]

    asyncio.run(main())
    assert asyncio.run(gather_all(asyncio.sleep(0, "a"), asyncio.sleep(0, "b"))) == ["a", "b"]
