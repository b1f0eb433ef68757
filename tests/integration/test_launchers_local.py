"""The accelerate and command launchers and the harness on ``local:N`` nodes: the
false pass refused, a script under the harness, a failing command, no leftovers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import require

from .conftest import REPO, run_corral, wait_no_job_processes

pytestmark = pytest.mark.torch
EXAMPLE = str(REPO / "examples" / "accelerate_train.py")


def _run(run_dir: Path, job: str, *args: str) -> list[str]:
    return [
        "run",
        "--hosts",
        "local:2",
        "--nproc-per-node",
        "1",
        "--no-preflight",
        "--master-port",
        "0",
        "--run-dir",
        str(run_dir),
        "--job-id",
        job,
        "--grace",
        "5",
        *args,
    ]


def test_a_world_accelerate_does_not_see_is_refused(run_dir: Path, tmp_path: Path) -> None:
    """ACCELERATE_USE_CPU=0 on a CPU host: each process would train alone and the job
    pass; every rank is refused with a message naming its host and rank."""
    require("accelerate")
    job = "acc-false-pass"
    args = _run(run_dir, job, "--launcher", "accelerate", "--env", "ACCELERATE_USE_CPU=0")
    result = run_corral(*args, "--", EXAMPLE, "--epochs", "1", cwd=tmp_path)
    assert result.returncode == 1, result.stderr[-3000:]
    for host, rank in (("local-0", 0), ("local-1", 1)):
        assert (
            f"[{host}:{rank}] corral: Accelerate sees a world of 1 process on host {host} "
            f"(rank {rank}), but the job has 2 ranks (distributed type NO)"
        ) in result.stdout
    assert "ACCELERATE_USE_CPU=0 was given (--env)" in result.stdout
    assert "epoch 0" not in result.stdout  # refused before any training
    assert not wait_no_job_processes(job, within=30)


def test_a_script_under_the_harness_gets_the_accelerator_and_config(
    run_dir: Path, tmp_path: Path
) -> None:
    require("accelerate")
    script = tmp_path / "plugin_script.py"
    script.write_text(
        "import argparse, json, os, sys\n"
        "from corral.sdk import get_accelerator\n"
        "p = argparse.ArgumentParser(); p.add_argument('--config_file'); p.add_argument('--x')\n"
        "a = p.parse_args()\n"
        "cfg = json.load(open(a.config_file))\n"
        "acc = sys.modules['__main__'].accelerator\n"
        "assert get_accelerator() is acc and accelerator is acc\n"
        "print('seen', acc.process_index, acc.num_processes, cfg['batch_size'],\n"
        "      round(cfg['learning_rate'], 4), cfg['output_dir'], cfg['is_main_process'], a.x,\n"
        "      os.environ['DISTRIBUTED_TRAINING'], os.environ['IS_MAIN_PROCESS'], flush=True)\n"
        # both ranks leave together: a rank that exits right after the process group
        # formed can reset its peer's gloo connections still being made (seen on a
        # loaded machine: "Connection reset by peer" in connectFullMesh)
        "acc.wait_for_everyone()\n"
    )
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"batch_size": 32, "learning_rate": 0.5, "output_dir": "out"}))
    job = "harness-script"
    args = _run(run_dir, job, "--harness", "--lr-scaling", "sqrt")
    result = run_corral(
        *args, "--", str(script), "--config_file", str(config), "--x", "y", cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr[-3000:] + result.stdout[-3000:]
    # the batch split over 2 ranks, the learning rate times sqrt(2), rank 1's output apart
    assert "[local-0:0] seen 0 2 16 0.7071 out True y true True" in result.stdout
    assert "[local-1:1] seen 1 2 16 0.7071 out/rank-1 False y true False" in result.stdout
    written = run_dir / job / "nodes" / "local-1" / "harness" / "attempt-0-rank-1.json"
    assert json.loads(written.read_text())["distributed"]["world_size"] == 2
    assert oct(written.stat().st_mode & 0o777) == "0o600"
    assert json.loads(config.read_text())["batch_size"] == 32  # the user's file is untouched


def test_get_accelerator_outside_the_harness_makes_one() -> None:
    require("accelerate")
    code = (
        "from corral import sdk\n"
        "a = sdk.get_accelerator()\n"
        "assert a is sdk.get_accelerator()\n"
        "print(type(a).__name__, a.num_processes)\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CORRAL_", "RANK", "WORLD"))}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "Accelerator 1"


def test_a_failing_command_fails_the_job_with_its_code(run_dir: Path, tmp_path: Path) -> None:
    job = "command-fails"
    template = (
        'echo "node {node_rank} of {nnodes} on {host}"; '
        "if [ {node_rank} = 1 ]; then sleep 0.5; exit 9; fi; exec sleep 600"
    )
    args = _run(run_dir, job, "--launcher", "command", "--command-template", template)
    result = run_corral(*args, cwd=tmp_path)
    assert result.returncode == 9, result.stderr[-3000:]
    assert "[local-1] node 1 of 2 on local-1" in result.stdout
    assert "root cause: the launcher on local-1 exited with code 9" in result.stderr
    assert not wait_no_job_processes(job, within=30)  # node 0's sleep 600 is gone too
