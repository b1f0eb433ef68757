"""``corral slurm submit`` on a real Slurm cluster (slurmctld + two slurmd + munge, here).

One job, 2 nodes x 2 ranks on CPU (gloo): attempt 0 all-reduces, saves a checkpoint
and then one rank fails; the script requeues the job (``--max-restarts 1``) and
attempt 1 resumes from that checkpoint (``sdk.resume``) and completes. A secret
given as a bare ``--env`` reaches every rank without being written into the script.
"""

from __future__ import annotations

import re
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.integration.conftest import run_corral, wait_no_job_processes
from tests.slurmcluster import job_state, slurm_cluster

# one xdist worker runs them in turn: two Slurm clusters on one machine share its ports
pytestmark = [pytest.mark.slow, pytest.mark.torch, pytest.mark.xdist_group("slurm")]

TOKEN = "s3cret value,with comma"
ARGS = ("--tag", "it's $HOME `x`", "")
FINAL = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY")

TRAIN = """\
import os, sys
import torch
import torch.distributed as dist
from corral import sdk

sdk.init_distributed(backend="gloo")
me = sdk.info()
total = torch.tensor([float(me.rank)])
dist.all_reduce(total)
secret = os.environ.get("CORRAL_TEST_TOKEN") == {token!r}
if me.rank == 0:
    print(f"argv {{sys.argv[1:]!r}}", flush=True)
print(f"rank {{me.rank}}/{{me.world_size}} node {{me.node_rank}} attempt {{me.attempt}} "
      f"sum {{total.item():g}} secret {{secret}}", flush=True)
state = sdk.resume()
start = state["step"] if state else 0
print(f"rank {{me.rank}} attempt {{me.attempt}} starts at step {{start}}", flush=True)
if me.rank == 0:
    sdk.save_checkpoint({{"step": start + 1}}, os.environ["CORRAL_CHECKPOINT_DIR"], start + 1)
dist.barrier()
if me.attempt == 0 and me.rank == 3:
    sys.exit(7)
dist.barrier()
sdk.cleanup()
"""


def _wait_final(job_id: str, env: dict[str, str], within: float) -> dict[str, str]:
    deadline = time.monotonic() + within
    state = job_state(job_id, env)
    while state.get("JobState") not in FINAL and time.monotonic() < deadline:
        time.sleep(1)
        state = job_state(job_id, env)
    return state


def test_submit_requeues_and_resumes_on_real_slurm(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(TRAIN.format(token=TOKEN))
    with slurm_cluster() as env:
        done = run_corral(
            "slurm", "submit", "--nodes", "2", "--nproc-per-node", "2", "--cpus-per-task", "1",
            "--python", sys.executable, "--workdir", str(tmp_path),
            "--checkpoint-dir", str(tmp_path / "ckpt"), "--max-restarts", "1",
            "--master-port", "0", "--rdzv-timeout", "120", "--job-name", "ctest",
            "--env", "CORRAL_TEST_TOKEN", "--env", "GREETING=hello world",
            "--run-dir", str(tmp_path / "runs"), "--", "train.py", *ARGS,
            cwd=tmp_path, timeout=150, env={**env, "CORRAL_TEST_TOKEN": TOKEN},
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        job_id = done.stdout.strip()
        assert job_id.isdigit(), done.stdout
        assert f"submitted Slurm job {job_id}" in done.stderr

        (script,) = (tmp_path / "runs").glob("*/job.sbatch")
        assert stat.S_IMODE(script.stat().st_mode) == 0o600
        text = script.read_text()
        assert TOKEN not in text and "export GREETING='hello world'" in text

        state = _wait_final(job_id, env, within=420)
        out = (tmp_path / f"ctest-{job_id}.out").read_text()
        err = (tmp_path / f"ctest-{job_id}.err").read_text()
        assert state.get("JobState") == "COMPLETED", f"{state}\n{out}\n{err[-3000:]}"
        assert state.get("Restarts") == "1" and state.get("ExitCode") == "0:0", state

    for attempt in (0, 1):
        lines = re.findall(rf"rank (\d)/4 node (\d) attempt {attempt} sum 6 secret True", out)
        assert sorted(lines) == [("0", "0"), ("1", "0"), ("2", "1"), ("3", "1")], out
    assert out.count(f"argv {list(ARGS)!r}") == 2, out  # rank 0, each attempt
    assert out.count("attempt 0 starts at step 0") == 4, out
    assert out.count("attempt 1 starts at step 1") == 4, out
    assert f"[corral] resuming from {tmp_path / 'ckpt' / 'ckpt-00000001.pt'} (step 1)" in out
    assert "attempt 0 failed (exit" in err and f"requeueing job {job_id}" in err, err
    assert not wait_no_job_processes(f"slurm-{job_id}", within=30)


WATCH = """\
import os, sys, time
import torch.distributed as dist
from corral import sdk

sdk.init_distributed(backend="gloo")
me = sdk.info()
state = sdk.resume()
step = state["step"] if state else 0
if me.attempt > 0:
    print(f"rank {me.rank} attempt {me.attempt} resumed at step {step}", flush=True)
    sdk.cleanup()
    sys.exit(0)
sdk.checkpoint_requested()  # installs the handler before saying so
print(f"rank {me.rank} watching", flush=True)
deadline = time.monotonic() + 300
while time.monotonic() < deadline:
    step += 1
    time.sleep(0.1)
    if sdk.checkpoint_requested():  # every rank at the same step
        if me.rank == 0:
            sdk.save_checkpoint({"step": step}, os.environ["CORRAL_CHECKPOINT_DIR"], step)
        print(f"rank {me.rank} checkpoint requested at step {step}", flush=True)
        dist.barrier()
        break
sdk.cleanup()
"""


def test_the_time_limit_signal_checkpoints_and_requeues_on_real_slurm(tmp_path: Path) -> None:
    """The batch shell's USR1 (what --signal=B:USR1@N sends before the time limit; sent
    here with scancel --batch so as not to wait for one) reaches every rank as the SDK's
    checkpoint request; the job is requeued and resumes from that checkpoint."""
    (tmp_path / "train.py").write_text(WATCH)
    with slurm_cluster() as env:
        done = run_corral(
            "slurm", "submit", "--nodes", "2", "--nproc-per-node", "1", "--cpus-per-task", "1",
            "--python", sys.executable, "--workdir", str(tmp_path), "--time", "10",
            "--checkpoint-dir", str(tmp_path / "ckpt"), "--max-restarts", "1",
            "--signal-lead", "20", "--master-port", "0", "--rdzv-timeout", "120",
            "--job-name", "sig", "--run-dir", str(tmp_path / "runs"), "--", "train.py",
            cwd=tmp_path, timeout=150, env=env,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        job_id = done.stdout.strip()
        out_file = tmp_path / f"sig-{job_id}.out"
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            text = out_file.read_text() if out_file.exists() else ""
            if text.count(" watching") == 2:
                break
            time.sleep(0.5)
        signal = subprocess.run(
            ["scancel", "--batch", "--signal=USR1", job_id], env=env, capture_output=True
        )
        assert signal.returncode == 0, signal.stderr
        state = _wait_final(job_id, env, within=240)
        out = out_file.read_text()
        err = (tmp_path / f"sig-{job_id}.err").read_text()
        assert state.get("JobState") == "COMPLETED", f"{state}\n{out}\n{err[-3000:]}"
        assert state.get("Restarts") == "1", state

    assert (
        "#SBATCH --signal=B:USR1@20" in next((tmp_path / "runs").glob("*/job.sbatch")).read_text()
    )
    steps = set(re.findall(r"rank \d checkpoint requested at step (\d+)", out))
    assert len(steps) == 1 and out.count("checkpoint requested") == 2, out
    (step,) = steps
    assert out.count(f"attempt 1 resumed at step {step}") == 2, out
    assert "asking the ranks to checkpoint now (SIGUSR2)" in err, err
    assert f"requeueing job {job_id}, restart 1 of 1" in err, err
