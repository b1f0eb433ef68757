"""All-reduce over every rank with MLX: ``corral run --launcher mlx -- examples/mlx_all_sum.py``.

Rank r contributes r + 1, so every rank must see world * (world + 1) / 2; each
prints what it got and exits 1 when that is wrong. ``--fail-rank R`` makes rank
R exit with ``--exit-code`` after the sum while the others wait in a second
collective (how a failing rank looks to the rest of the job).
"""

from __future__ import annotations

import argparse
import sys

import mlx.core as mx


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--fail-rank", type=int, default=None, help="this rank exits early")
    parser.add_argument("--exit-code", type=int, default=7, help="the failing rank's code")
    args = parser.parse_args()

    group = mx.distributed.init()
    rank, world = group.rank(), group.size()
    total = mx.distributed.all_sum(mx.array([float(rank + 1)]), group=group).item()
    expected = world * (world + 1) / 2
    print(f"rank {rank}/{world} all_sum={total:g} expected={expected:g}", flush=True)
    if total != expected:
        return 1
    if rank == args.fail_rank:
        print(f"rank {rank} fails with exit code {args.exit_code}", flush=True)
        return args.exit_code
    # the second collective: with a failing rank, the others wait here until torn down
    mx.eval(mx.distributed.all_sum(mx.array([1.0]), group=group))
    return 0


if __name__ == "__main__":
    sys.exit(main())
