"""Under a held torchrun, the node's workers are started ahead and import torch while
torchrun's rendezvous runs (:mod:`corral.agent.aheadworkers`): the script finds torch
imported at its first line, with the ranks, world size, arguments and
``OMP_NUM_THREADS`` torchrun gives its workers; nothing is left behind."""

from __future__ import annotations

import re
from pathlib import Path

from tests.integration.conftest import run_corral

SCRIPT = """
import os, sys
ahead = "torch" in sys.modules  # imported before the script's first line?
import torch
print(f"RANKINFO rank={os.environ['RANK']} local={os.environ['LOCAL_RANK']} "
      f"world={os.environ['WORLD_SIZE']} ahead={ahead} omp={os.environ.get('OMP_NUM_THREADS')} "
      f"pid={os.getpid()} argv={sys.argv[1:]}", flush=True)
"""


def test_torchruns_workers_start_ahead_with_torch_imported(tmp_path: Path) -> None:
    (tmp_path / "rank.py").write_text(SCRIPT)
    done = run_corral(
        "run", "--hosts", "local:1", "--nproc-per-node", "2", "--launcher", "torchrun",
        "--run-dir", "runs", "--job-id", "ahead", "--", "rank.py", "a", "b c",
        cwd=tmp_path,
    )  # fmt: skip
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-3000:]
    found = sorted(
        re.findall(r"RANKINFO rank=(\d) local=(\d) world=(\d) ahead=(\w+) omp=(\w+)", out)
    )
    assert found == [("0", "0", "2", "True", "1"), ("1", "1", "2", "True", "1")], out[-3000:]
    assert out.count("argv=['a', 'b c']") == 2
    assert "workers started ahead not used" not in out
