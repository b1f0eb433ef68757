"""Test job: every rank reports N steps through corral.sdk.report (no torch).

usage: report_steps.py [--steps N]; rank R reports loss = (R + 1) / (step + 1) and
examples = 8 at every step.
"""

import argparse
import os
import time

from corral import sdk

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=5)
args = parser.parse_args()
rank = int(os.environ["RANK"])
for step in range(args.steps):
    time.sleep(0.05)
    sdk.report(step, total=args.steps, loss=(rank + 1) / (step + 1), examples=8)
