"""Workload of bench_diagnose.py and tests/integration/test_diagnose_local.py: gloo
all-reduces with timed sections; one rank can be slow (a delay inside
``sdk.section("compute")``) or skip one all-reduce (a hang).

usage: diagnose_job.py [--steps N] [--slow-rank R --slow-from K --delay S]
                       [--skip-rank R --skip-at K]
"""

import argparse
import time

import torch
import torch.distributed as dist

from corral import sdk

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=40)
parser.add_argument("--base", type=float, default=0.03, help="compute seconds per step")
parser.add_argument("--slow-rank", type=int, default=-1)
parser.add_argument("--slow-from", type=int, default=10)
parser.add_argument("--delay", type=float, default=0.2)
parser.add_argument("--skip-rank", type=int, default=-1)
parser.add_argument("--skip-at", type=int, default=5)
args = parser.parse_args()

sdk.init_distributed(backend="gloo")
rank = dist.get_rank()
grad = torch.ones(16)
for step in range(args.steps):
    with sdk.section("compute"):
        time.sleep(args.base)
        if rank == args.slow_rank and step >= args.slow_from:
            if step == args.slow_from:
                print(f"delay starts at step {step + 1}", flush=True)
            time.sleep(args.delay)
    if not (rank == args.skip_rank and step == args.skip_at):
        with sdk.section("wait"):
            dist.all_reduce(grad)
    sdk.report(step + 1, args.steps)
    print(f"step {step + 1}", flush=True)
dist.barrier()
sdk.cleanup()
