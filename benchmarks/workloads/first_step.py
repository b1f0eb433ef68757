"""Launch workload: init the gloo process group, one allreduce (the first step), exit.

``python first_step.py STAMP_FILE``: rank 0 writes ``time.time()`` taken right
after the first allreduce returned to ``STAMP_FILE``.
"""

from __future__ import annotations

import os
import sys
import time

import torch
import torch.distributed as dist


def main(argv: list[str]) -> int:
    """One step; return the exit code."""
    dist.init_process_group("gloo")
    tensor = torch.ones(1)
    dist.all_reduce(tensor)
    stepped = time.time()
    if dist.get_rank() == 0:
        tmp = argv[0] + ".tmp"
        with open(tmp, "w") as handle:
            handle.write(repr(stepped))
        os.replace(tmp, argv[0])
    expected = float(dist.get_world_size())
    dist.destroy_process_group()
    return 0 if tensor.item() == expected else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
