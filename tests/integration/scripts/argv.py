"""Test job: each rank writes its argv (as JSON) to OUT_DIR/rank-R.json."""

import json
import os
import sys

out_dir = os.environ["OUT_DIR"]
with open(os.path.join(out_dir, f"rank-{os.environ['RANK']}.json"), "w") as f:
    json.dump({"argv": sys.argv[1:], "env": dict(os.environ)}, f)
