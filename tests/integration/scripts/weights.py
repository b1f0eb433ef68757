"""Test job (standard library only): every rank prints the workload weight corral gave
it (``corral run --calibration``), then reports ``--steps`` steps of 8 examples.

usage: weights.py [--steps N]
"""

import argparse
import time

from corral import sdk

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=5)
args = parser.parse_args()
rank = sdk.info().rank
weights = sdk.workload_weights()
print(f"rank {rank}: weight {weights[rank]:.4f}" if weights else "no weights", flush=True)
for step in range(args.steps):
    time.sleep(0.02)
    sdk.report(step + 1, args.steps, examples=8)
