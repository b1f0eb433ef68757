"""Test job: each rank writes its argv and env (JSON) to OUT_DIR/rank-R.json, then
prints LINES_PER_RANK numbered lines as fast as it can."""

import json
import os
import sys

rank = int(os.environ["RANK"])
with open(os.path.join(os.environ["OUT_DIR"], f"rank-{rank}.json"), "w") as f:
    json.dump({"argv": sys.argv[1:], "env": dict(os.environ)}, f)
out = sys.stdout
block = []
for i in range(int(os.environ["LINES_PER_RANK"])):
    block.append(f"rank {rank} line {i} " + "x" * 40 + "\n")
    if len(block) == 997:  # odd-sized writes so chunks never align with lines
        out.write("".join(block))
        block.clear()
out.write("".join(block))
out.flush()
