"""Child processes that a cancellation (Ctrl-C) never leaves behind.

Every process ``corral sync`` starts (rsync, ssh, the user's sync script) runs
in a session of its own, so a terminal's Ctrl-C reaches only corral, which
then stops each process *group* (rsync and the ssh it started) and reaps it
before the event loop closes. :func:`spawn` also covers a cancellation that
lands while the process is still being set up (its pipes not yet connected):
the process is then stopped and reaped before the cancellation goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Awaitable
from typing import Any, TypeVar

__all__ = ["KILL_GRACE", "communicate", "drain", "gather_all", "kill_group", "spawn"]

KILL_GRACE = 3.0
_REAP_LIMIT = 30.0  # after SIGKILL (only a process stuck in the kernel takes this long)
_READ = 64 * 1024

Process = asyncio.subprocess.Process
T = TypeVar("T")


async def gather_all(*aws: Awaitable[T]) -> list[T]:
    """``asyncio.gather`` that, when cancelled or when one awaitable fails, still waits
    for every other one to finish (each stops and reaps its own processes) before
    raising; plain gather returns at the first cancelled child, and the event loop
    may then close while the others are still cleaning up."""
    tasks = [asyncio.ensure_future(a) for a in aws]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        if tasks:
            await asyncio.wait(tasks)
        raise


async def spawn(*argv: str, **kwargs: Any) -> Process:
    """``asyncio.create_subprocess_exec(*argv, start_new_session=True, **kwargs)``."""
    start = asyncio.ensure_future(
        asyncio.create_subprocess_exec(*argv, start_new_session=True, **kwargs)
    )
    try:
        return await asyncio.shield(start)
    except asyncio.CancelledError:
        with contextlib.suppress(Exception):
            proc = await start
            await kill_group(proc)
            await drain(proc)
        raise


async def kill_group(proc: Process, grace: float = KILL_GRACE) -> None:
    """SIGTERM the process's group, SIGKILL after ``grace`` seconds; returns once the
    process is reaped and no member of its group is left."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, _REAP_LIMIT)):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)
        if await _group_gone(proc, wait):
            return


async def _group_gone(proc: Process, timeout: float) -> bool:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    try:
        await asyncio.wait_for(asyncio.shield(proc.wait()), timeout)
    except asyncio.TimeoutError:
        return False
    while _group_alive(proc.pid):  # the group id stays reserved while any member lives
        if loop.time() >= end:
            return False
        await asyncio.sleep(0.02)
    return True


def _group_alive(pgid: int) -> bool:
    """Whether a member of the group still runs (zombies waiting for init do not count:
    they hold no pipes and take no signals)."""
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    try:
        pids = [int(name) for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        return True  # no /proc: a member exists, assume it runs
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", "rb") as fh:
                fields = fh.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] != b"Z":
            return True
    return False


async def drain(
    proc: Process, timeout: float = KILL_GRACE, *, stdout: bool = True, stderr: bool = True
) -> None:
    """Close a finished process's stdin and read its pipes to EOF, so their transports
    close while the event loop is still open (leave out a pipe another task reads)."""

    async def read_out(stream: asyncio.StreamReader | None) -> None:
        if stream is not None:
            while await stream.read(_READ):
                pass

    if proc.stdin is not None:
        proc.stdin.close()
    streams = [s for s, wanted in ((proc.stdout, stdout), (proc.stderr, stderr)) if wanted]
    with contextlib.suppress(asyncio.TimeoutError, OSError, RuntimeError, ValueError):
        await asyncio.wait_for(asyncio.gather(*(read_out(s) for s in streams)), timeout)


async def communicate(
    *argv: str, input: bytes | None = None, **kwargs: Any
) -> tuple[int, bytes, bytes]:
    """Run to completion with stdout and stderr captured: (exit code, stdout, stderr).
    A cancellation stops and reaps the process group first."""
    proc = await spawn(
        *argv,
        stdin=asyncio.subprocess.PIPE if input is not None else asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        **kwargs,
    )
    try:
        out, err = await proc.communicate(input)
    except BaseException:
        await kill_group(proc)
        await drain(proc)
        raise
    return (proc.returncode if proc.returncode is not None else -1), out, err
