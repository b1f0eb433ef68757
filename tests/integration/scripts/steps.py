"""Test job: every rank prints a step line every 0.1 s; one rank can fail.

usage: steps.py [--fail-rank R] [--fail-at K] [--mode exit|kill|raise] [--code C] [--steps N]
"""

import argparse
import os
import signal
import sys
import time

parser = argparse.ArgumentParser()
parser.add_argument("--fail-rank", type=int, default=-1)
parser.add_argument("--fail-at", type=int, default=5)
parser.add_argument("--mode", default="exit")
parser.add_argument("--code", type=int, default=7)
parser.add_argument("--steps", type=int, default=10_000)
parser.add_argument("--daemon", action="store_true", help="leave a detached child behind")
args = parser.parse_args()
rank = int(os.environ["RANK"])
if args.daemon:
    import subprocess

    subprocess.Popen(["sleep", "1000"], start_new_session=True)
for step in range(args.steps):
    print(f"rank {rank} step {step}", flush=True)
    if rank == args.fail_rank and step == args.fail_at:
        print(f"rank {rank} is about to fail ({args.mode})", file=sys.stderr, flush=True)
        if args.mode == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if args.mode == "raise":
            raise ValueError(f"bad batch on rank {rank}")
        sys.exit(args.code)
    time.sleep(0.1)
