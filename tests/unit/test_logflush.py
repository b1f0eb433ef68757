"""FlushSoon: buffered log files reach the disk within a moment of a write."""

from __future__ import annotations

import asyncio
import contextlib
import errno
from pathlib import Path
from typing import IO

from corral.logflush import FlushSoon


def test_a_write_is_flushed_soon_on_the_loop(tmp_path: Path) -> None:
    path = tmp_path / "rank-0.log"

    async def main() -> bytes:
        soon = FlushSoon(delay=0.01)
        with open(path, "ab") as handle:
            handle.write(b"step 1\n")
            soon.wrote(handle)
            handle.write(b"step 2\n")
            soon.wrote(handle)  # one timer for the burst
            assert path.read_bytes() == b""  # still in the buffer
            for _ in range(500):  # bounded polling, the rank "still running"
                await asyncio.sleep(0.01)
                if path.read_bytes():
                    break
            return path.read_bytes()

    assert asyncio.run(main()) == b"step 1\nstep 2\n"


def test_without_a_loop_a_write_is_flushed_at_once(tmp_path: Path) -> None:
    path = tmp_path / "a.log"
    with open(path, "ab") as handle:
        handle.write(b"line\n")
        FlushSoon().wrote(handle)
        assert path.read_bytes() == b"line\n"


def test_a_failed_flush_is_reported_and_closed_files_are_skipped(tmp_path: Path) -> None:
    failed: list[tuple[IO[bytes], OSError]] = []
    soon = FlushSoon(on_error=lambda h, e: failed.append((h, e)))
    closed = open(tmp_path / "closed.log", "ab")  # noqa: SIM115
    closed.close()
    soon.wrote(closed)  # no loop: flushed now, and a closed file is no error
    assert failed == []
    full = open("/dev/full", "ab")  # noqa: SIM115  (every write: no space left)
    full.write(b"line\n")
    soon.wrote(full)
    assert [h for h, _ in failed] == [full]
    assert failed[0][1].errno == errno.ENOSPC
    with contextlib.suppress(OSError):
        full.close()
