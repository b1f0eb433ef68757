"""A process started before the event loop (the entry point's agents) is adopted by
:class:`corral.transport.local.LocalTransport` as if it had started it: its output
read, its stdin written and closed, its exit code (or ``-signum``) seen, and a
process still running killed at the transport's close."""

from __future__ import annotations

import asyncio
import os
import signal

from corral.cluster.model import Host
from corral.transport.local import LocalTransport

HOST = Host(name="local-0", address="127.0.0.1", slots=1, local=True)


def _spawn(*argv: str) -> tuple[int, int, int, int]:
    """``argv`` started as the entry point starts an agent: (pid, stdin, stdout, stderr)."""
    (in_r, in_w), (out_r, out_w), (err_r, err_w) = os.pipe(), os.pipe(), os.pipe()
    actions = [
        (os.POSIX_SPAWN_DUP2, in_r, 0),
        (os.POSIX_SPAWN_DUP2, out_w, 1),
        (os.POSIX_SPAWN_DUP2, err_w, 2),
    ]
    pid = os.posix_spawnp(argv[0], list(argv), dict(os.environ), file_actions=actions, setsid=True)
    for fd in (in_r, out_w, err_w):
        os.close(fd)
    return pid, in_w, out_r, err_r


def test_an_adopted_process_is_read_written_and_waited_for() -> None:
    async def scenario() -> tuple[bytes, bytes, int]:
        transport = LocalTransport()
        proc = await transport.adopt(
            HOST, *_spawn("sh", "-c", "read x; echo got $x; echo e >&2; exit 3")
        )
        proc.write(b"hello\n")
        proc.close_stdin()
        out, err = await proc.stdout.read(), await proc.stderr.read()
        code = await proc.wait()
        assert await proc.wait() == code  # waited for again: the same code
        await transport.close()
        return out, err, code

    assert asyncio.run(scenario()) == (b"got hello\n", b"e\n", 3)


def test_a_signalled_adopted_process_reports_minus_the_signal() -> None:
    async def scenario() -> int:
        transport = LocalTransport()
        proc = await transport.adopt(HOST, *_spawn("sleep", "30"))
        proc.signal(signal.SIGTERM)
        return await asyncio.wait_for(proc.wait(), 30)

    assert asyncio.run(scenario()) == -signal.SIGTERM


def test_the_transports_close_kills_an_adopted_process_still_running() -> None:
    async def scenario() -> int:
        transport = LocalTransport()
        proc = await transport.adopt(HOST, *_spawn("sleep", "30"))
        await transport.close()
        return await proc.wait()

    assert asyncio.run(scenario()) == -signal.SIGKILL
