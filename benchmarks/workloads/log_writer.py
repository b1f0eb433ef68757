"""Log-throughput workload: print N distinct ~60-byte lines as fast as possible.

``python log_writer.py N STAMP_DIR [RANK]``: writes ``rank R line I xxx...`` for
I in 0..N-1 to stdout in big blocks, and records ``time.time()`` at its start and
end in ``STAMP_DIR/start-R`` and ``STAMP_DIR/end-R``. The rank comes from the
``RANK`` environment variable (set by corral) unless given as an argument.
"""

from __future__ import annotations

import os
import sys
import time

LINE_WIDTH = 60  # bytes per line, newline included
BLOCK = 2000  # lines per write


def _stamp(directory: str, name: str) -> None:
    with open(os.path.join(directory, name), "w") as handle:
        handle.write(repr(time.time()))


def main(argv: list[str]) -> int:
    """Write the lines; return the exit code."""
    count = int(argv[0])
    stamp_dir = argv[1]
    rank = int(argv[2]) if len(argv) > 2 else int(os.environ["RANK"])
    _stamp(stamp_dir, f"start-{rank}")
    out = sys.stdout.buffer
    width = LINE_WIDTH - 1
    for base in range(0, count, BLOCK):
        block = "".join(
            f"rank {rank} line {i} ".ljust(width, "x") + "\n"
            for i in range(base, min(count, base + BLOCK))
        )
        out.write(block.encode())
    out.flush()
    _stamp(stamp_dir, f"end-{rank}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
