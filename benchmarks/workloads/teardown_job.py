"""Teardown workload: every rank loops; one rank exits with a code at a recorded time.

``python teardown_job.py STAMP_DIR [--mode sleep|gloo] [--fail-rank 1]
[--fail-after 0.5] [--code 7] [--hard-exit]``

Each rank writes ``STAMP_DIR/ready-R`` once it is running (in ``gloo`` mode: once
the process group is up), then loops: ``sleep`` sleeps in 10 ms steps, ``gloo``
does a small allreduce and a 10 ms sleep. The failing rank waits until every
rank is ready, loops ``--fail-after`` seconds more, writes ``time.time()`` to
``STAMP_DIR/exit-R`` and exits with ``--code``: through ``sys.exit``, or with
``--hard-exit`` through ``os._exit`` (dies at once, like a crash: no interpreter
or process-group shutdown, which takes a second with torch loaded). With ``--fail-rank -1`` no rank
fails (the ranks loop until they are killed).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any


def _write(path: Path, text: str) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def main(argv: list[str]) -> int:
    """Loop until killed, or fail on schedule; return the exit code."""
    parser = argparse.ArgumentParser()
    parser.add_argument("stamp_dir", type=Path)
    parser.add_argument("--mode", choices=("sleep", "gloo"), default="sleep")
    parser.add_argument("--fail-rank", type=int, default=1)
    parser.add_argument("--fail-after", type=float, default=0.5)
    parser.add_argument("--code", type=int, default=7)
    parser.add_argument("--hard-exit", action="store_true")
    args = parser.parse_args(argv)
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    step: Any = None
    if args.mode == "gloo":
        import torch
        import torch.distributed as dist

        dist.init_process_group("gloo")
        tensor = torch.ones(16)

        def step() -> None:
            dist.all_reduce(tensor)

    _write(args.stamp_dir / f"ready-{rank}", f"{os.getpid()}\n")
    fail_at: float | None = None
    while True:
        if step is not None:
            step()
        time.sleep(0.01)
        if rank != args.fail_rank:
            continue
        if fail_at is None:
            if all((args.stamp_dir / f"ready-{r}").exists() for r in range(world)):
                fail_at = time.monotonic() + args.fail_after
            continue
        if time.monotonic() >= fail_at:
            _write(args.stamp_dir / f"exit-{rank}", repr(time.time()))
            sys.stdout.flush()
            if args.hard_exit:
                os._exit(args.code)
            return int(args.code)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
