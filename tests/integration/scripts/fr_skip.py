"""Test job: gloo all-reduces; rank ``--skip-rank`` skips the one of step ``--skip-at``
and then stays in its own code, so the others wait in a collective it never enters.

usage: fr_skip.py [--steps N] [--skip-rank R] [--skip-at K]
"""

import argparse
import time

import torch
import torch.distributed as dist

from corral import sdk

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=6)
parser.add_argument("--skip-rank", type=int, default=1)
parser.add_argument("--skip-at", type=int, default=3)
args = parser.parse_args()

sdk.init_distributed(backend="gloo")
rank = dist.get_rank()
grad = torch.ones(8)
for step in range(args.steps):
    if rank == args.skip_rank and step == args.skip_at:
        print(f"rank {rank} skips the all-reduce of step {step + 1}", flush=True)
        while True:  # its own code, never the collective
            time.sleep(1.0)
    dist.all_reduce(grad)
    sdk.report(step + 1, args.steps)
dist.barrier()
sdk.cleanup()
