"""Test job for a straggler feeding ``--rebalance``: gloo all-reduces, rank
``--slow-rank`` delayed inside ``sdk.section("compute")`` in the first attempt, then
failing after ``--fail-at`` steps so that corral restarts the job; every attempt's
rank 0 prints the weights it was started with.

usage: straggler_rebalance_job.py [--steps N] [--slow-rank R] [--fail-at K]
"""

import argparse
import os
import sys
import time

import torch
import torch.distributed as dist

from corral import sdk

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=20)
parser.add_argument("--base", type=float, default=0.03, help="compute seconds per step")
parser.add_argument("--delay", type=float, default=0.06)
parser.add_argument("--slow-rank", type=int, default=1)
parser.add_argument("--fail-at", type=int, default=12)
args = parser.parse_args()

sdk.init_distributed(backend="gloo")
rank = dist.get_rank()
attempt = int(os.environ.get("CORRAL_ATTEMPT", "0"))
weights = sdk.workload_weights() or ()
if rank == 0:
    print(f"attempt {attempt} weights " + ",".join(f"{w:.3f}" for w in weights), flush=True)
slow = attempt == 0 and rank == args.slow_rank
grad = torch.ones(16)
for step in range(args.steps):
    with sdk.section("compute"):
        time.sleep(args.base + (args.delay if slow else 0.0))
    with sdk.section("wait"):
        dist.all_reduce(grad)
    sdk.report(step + 1, args.steps)
    if slow and step + 1 == args.fail_at:
        print(f"rank {rank} fails at step {step + 1}", flush=True)
        sys.exit(7)
dist.barrier()
sdk.cleanup()
