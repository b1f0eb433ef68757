"""examples/actors_fsdp.py as a program on ``local:2`` (1 worker per node, CPU, gloo:
every worker and the coordinator import torch, so the smallest world that spans
nodes; the example's default of 2 workers per node runs over SSH in
netns/test_actors_example_netns.py).

One FSDP run of 6 steps saves a checkpoint; a rerun to 9 steps resumes from it;
a DDP run of 9 steps on the same seed follows the same losses, before and after
the resume point (so resuming continued the very run). A warmup of 1 step (the
example's default is 5) lets 6 steps show it learning; a step costs ~0.1 CPU-s.
"""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import require_torch

from .conftest import REPO, wait_no_job_processes

pytestmark = [pytest.mark.torch, pytest.mark.slow]

EXAMPLE = REPO / "examples" / "actors_fsdp.py"
STEP = re.compile(r"^Step (\d+): loss=([\d.]+), grad_norm=([\d.]+), lr=([\d.e+-]+)", re.M)
FIRST, TOTAL = 6, 9
WORKERS = 2  # --workers-per-host 1 on local:2
# a warmup of 1 step; 1 torch thread per worker (both workers share this machine: its
# default, the CPUs / the workers on the host, spins idle threads)
SHRINK = ("--warmup-steps", "1", "--threads", "1")


@dataclass
class Run:
    stdout: str
    stderr: str
    steps: list[int]
    losses: list[float]
    job_id: str


def run_example(*args: str, cwd: Path, timeout: float = 300) -> Run:
    """Run the example to completion (it must succeed); its output, parsed."""
    require_torch()
    done = subprocess.run(
        [sys.executable, str(EXAMPLE), "--seed", "3", "--workers-per-host", "1", *SHRINK, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr[-4000:]}"
    found = STEP.findall(done.stdout)
    job = re.search(rf"^Cluster (actors-\S+): {WORKERS} workers on ", done.stdout, re.M)
    assert job, done.stdout
    return Run(
        done.stdout,
        done.stderr,
        [int(s) for s, *_ in found],
        [float(loss) for _, loss, *_ in found],
        job[1],
    )


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("actors_example")


@pytest.fixture(scope="module")
def fsdp_runs(root: Path) -> tuple[Run, Run]:
    """FSDP: FIRST steps, then a rerun to TOTAL from the same checkpoint dir."""
    ckpt = root / "fsdp-ckpt"
    first = run_example("--steps", str(FIRST), "--checkpoint-dir", str(ckpt), cwd=root)
    resumed = run_example("--steps", str(TOTAL), "--checkpoint-dir", str(ckpt), cwd=root)
    return first, resumed


def test_the_example_trains_saves_and_leaves_no_worker(
    fsdp_runs: tuple[Run, Run], root: Path
) -> None:
    first, _ = fsdp_runs
    assert first.steps == list(range(1, FIRST + 1))
    assert first.losses[-1] < 0.75 * first.losses[0], first.losses  # it learns
    assert f"All {WORKERS} workers ready: fsdp on cpu" in first.stdout
    assert "Shutting down..." in first.stdout and first.stdout.rstrip().endswith("Done.")
    assert "[local-0:0] rank 0/2: fsdp on cpu, 1 torch thread(s)" in first.stderr  # prefixed
    assert "[local-1:1] rank 1/2: fsdp on cpu" in first.stderr
    saved = root / "fsdp-ckpt" / f"step_{FIRST:08d}"
    assert sorted(p.name for p in saved.iterdir()) == [f"rank_{r:05d}" for r in range(WORKERS)]
    assert (root / "runs" / first.job_id / "logs" / "local-1.1.log").is_file()
    assert wait_no_job_processes(first.job_id, 10) == []


def test_a_rerun_resumes_from_the_checkpoint(fsdp_runs: tuple[Run, Run]) -> None:
    first, resumed = fsdp_runs
    assert f"Resumed from checkpoint step {FIRST} in " in resumed.stdout
    assert resumed.steps == list(range(FIRST + 1, TOTAL + 1))
    assert resumed.losses[-1] < first.losses[-1]  # it goes on learning
    assert wait_no_job_processes(resumed.job_id, 10) == []


def test_ddp_and_fsdp_reach_the_same_loss_on_the_same_seed(
    fsdp_runs: tuple[Run, Run], root: Path
) -> None:
    first, resumed = fsdp_runs
    ddp = run_example(
        "--backend", "ddp", "--steps", str(TOTAL), "--checkpoint-dir", str(root / "ddp-ckpt"),
        cwd=root,
    )  # fmt: skip
    assert f"All {WORKERS} workers ready: ddp on cpu" in ddp.stdout
    assert "Resumed" not in ddp.stdout
    assert ddp.steps == list(range(1, TOTAL + 1))
    assert ddp.losses == pytest.approx(first.losses + resumed.losses, rel=2e-3, abs=1e-3)
