"""The README's ``sdk.resume`` snippet on ``local:N``: a relative ``ckpt_dir`` is the
job's (under where corral was started), not each node's per-job dir, so the second
run of the same command resumes where the first stopped."""

from __future__ import annotations

import textwrap
from pathlib import Path

from tests.conftest import require_torch

from .conftest import run_corral, wait_no_job_processes

# The README's snippet, trimmed: 2 ranks in a gloo group, a relative ckpt_dir.
TRAIN = """
import os, sys
import torch
from corral import sdk

sdk.init_distributed(timeout=120)
model = torch.nn.Linear(4, 1)
ckpt_dir, total, start = "ckpt", int(sys.argv[1]), 0
if (state := sdk.resume(ckpt_dir)) is not None:
    model.load_state_dict(state["model"])
    start = state["step"]
print(f"rank {sdk.info().rank} starts at step {start} in {os.getcwd()}", flush=True)
for step in range(start + 1, total + 1):
    if step % 5 == 0:
        sdk.save_checkpoint({"step": step, "model": model.state_dict()}, ckpt_dir, step)
sdk.cleanup()
"""


def _run(tmp_path: Path, job: str, steps: int) -> str:
    done = run_corral(
        "run", "--hosts", "local:2", "--launcher", "python", "--job-id", job,
        "--run-dir", str(tmp_path / "runs"), "--master-port", "0", "--no-preflight",
        "--", "train.py", str(steps),
        cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert not wait_no_job_processes(job, within=15)
    return done.stdout


def test_a_relative_checkpoint_dir_resumes_on_the_next_run(tmp_path: Path) -> None:
    require_torch()
    (tmp_path / "train.py").write_text(textwrap.dedent(TRAIN))
    first = _run(tmp_path, "rel-1", 10)
    assert "rank 0 starts at step 0" in first and "rank 1 starts at step 0" in first
    assert "/runs/rel-1/nodes/local-1/work" in first  # the ranks' own cwd is per job
    saved = sorted(p.name for p in (tmp_path / "ckpt").iterdir())
    assert saved == ["ckpt-00000005.pt", "ckpt-00000010.pt"]
    assert not list((tmp_path / "runs").rglob("ckpt"))  # nothing under a node's dir

    second = _run(tmp_path, "rel-2", 15)  # a new job id: new node dirs
    assert f"resuming from {tmp_path / 'ckpt' / 'ckpt-00000010.pt'} (step 10)" in second
    assert "rank 0 starts at step 10" in second and "rank 1 starts at step 10" in second
    assert (tmp_path / "ckpt" / "ckpt-00000015.pt").is_file()
