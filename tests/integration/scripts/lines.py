"""Test job: every rank prints N numbered lines as fast as it can."""

import os
import sys

rank = int(os.environ["RANK"])
n = int(sys.argv[1])
out = sys.stdout
block = []
for i in range(n):
    block.append(f"rank {rank} line {i} " + "x" * 40 + "\n")
    if len(block) == 997:  # odd-sized writes so chunks never align with lines
        out.write("".join(block))
        block.clear()
out.write("".join(block))
out.flush()
