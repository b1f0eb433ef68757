"""SSE workload: print N numbered lines at a steady pace, in flushed batches.

``python paced_writer.py N LINES_PER_S STAMP_DIR``: rank ``RANK`` (set by corral)
writes ``r<RANK> <I> xxx...`` (60 bytes with the newline) for I in 0..N-1, in
batches of 100 flushed lines, sleeping between batches so that it keeps to
``LINES_PER_S``; ``time.time()`` at its start and end go to ``STAMP_DIR/start-R``
and ``STAMP_DIR/end-R``.
"""

from __future__ import annotations

import os
import sys
import time

LINE_WIDTH = 60  # bytes per line, newline included
BATCH = 100


def _stamp(directory: str, name: str) -> None:
    with open(os.path.join(directory, name), "w") as handle:
        handle.write(repr(time.time()))


def main(argv: list[str]) -> int:
    """Write the lines; return the exit code."""
    count, rate, stamp_dir = int(argv[0]), float(argv[1]), argv[2]
    rank = int(os.environ["RANK"])
    out = sys.stdout.buffer
    width = LINE_WIDTH - 1
    _stamp(stamp_dir, f"start-{rank}")
    started = time.monotonic()
    for base in range(0, count, BATCH):
        top = min(count, base + BATCH)
        lines = "".join(f"r{rank} {i} ".ljust(width, "x") + "\n" for i in range(base, top))
        out.write(lines.encode())
        out.flush()
        ahead = started + top / rate - time.monotonic()
        if ahead > 0:
            time.sleep(ahead)
    _stamp(stamp_dir, f"end-{rank}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
