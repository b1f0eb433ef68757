"""``--launcher mlx`` on ``local:2`` (2 ranks each): MLX's ring over loopback, a
failing rank's own exit code, and a backend this host does not have."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import require

from .conftest import REPO, run_corral, wait_no_job_processes
from .test_local_jobs import _common

EXAMPLE = str(REPO / "examples" / "mlx_all_sum.py")


@pytest.fixture(autouse=True)
def _mlx() -> None:
    require("mlx.core", "the mlx extra: make setup")


def mlx_run_args(run_dir: Path, job: str, hosts: str = "local:2", nproc: int = 2) -> list[str]:
    """``corral run`` options for an MLX job (a fresh master port)."""
    return [*_common(run_dir, job, hosts=hosts, nproc=nproc), "--launcher", "mlx"]


def assert_all_sum(stdout: str, hosts: list[str], per_host: int = 2) -> None:
    """Every rank printed the right all_sum, under its own ``[host:rank]`` prefix."""
    world = len(hosts) * per_host
    expected = world * (world + 1) // 2
    for rank in range(world):
        line = f"[{hosts[rank // per_host]}:{rank}] rank {rank}/{world} all_sum={expected} "
        assert re.search(rf"^{re.escape(line)}expected={expected}$", stdout, re.M), (rank, stdout)


def assert_rank_failed_alone(result: subprocess.CompletedProcess[str], job: str, host: str) -> None:
    """Rank 2 on ``host`` exited 7: the job's code, the root cause, nothing left."""
    assert result.returncode == 7, result.stderr[-4000:]
    assert f"root cause: rank 2 on {host} exited with code 7" in result.stderr, result.stderr
    assert f"[{host}:2] rank 2 fails with exit code 7" in result.stdout
    assert not wait_no_job_processes(job, within=30)


def test_all_sum_over_four_ranks_on_two_local_nodes(run_dir: Path, tmp_path: Path) -> None:
    args = mlx_run_args(run_dir, "mlx-sum")
    result = run_corral(*args, "--", EXAMPLE, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-4000:]
    assert_all_sum(result.stdout, ["local-0", "local-1"])
    # each rank's copy of MLX's hostfile is the plan's ring: ports per global rank
    hostfile = run_dir / "mlx-sum" / "nodes" / "local-1" / "mlx" / "hostfile-attempt-0-rank-3.json"
    ring = [entry for rank in json.loads(hostfile.read_text()) for entry in rank]
    assert len(ring) == len(set(ring)) == 4 and all(e.startswith("127.0.0.1:") for e in ring)


def test_a_failing_rank_fails_the_job_with_its_own_code(run_dir: Path, tmp_path: Path) -> None:
    args = mlx_run_args(run_dir, "mlx-exit7")
    result = run_corral(*args, "--", EXAMPLE, "--fail-rank", "2", cwd=tmp_path)
    assert_rank_failed_alone(result, "mlx-exit7", "local-1")


def test_a_backend_missing_on_the_hosts_is_refused_by_name(run_dir: Path, tmp_path: Path) -> None:
    mx = require("mlx.core")
    if mx.distributed.is_available("jaccl"):
        pytest.skip("jaccl is available on this machine: nothing to refuse")
    args = mlx_run_args(run_dir, "mlx-jaccl", nproc=1)
    result = run_corral(
        *args, "--mlx-backend", "jaccl", "--env", "MLX_IBV_DEVICES=/nonexistent.json",
        "--", EXAMPLE, cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 1, result.stderr[-4000:]
    assert "MLX's jaccl backend is not available on local-" in result.stderr
    assert "all_sum" not in result.stdout  # no rank ran the script
    assert not wait_no_job_processes("mlx-jaccl", within=30)


def test_a_ring_that_never_forms_ends_the_rank_after_the_init_timeout(tmp_path: Path) -> None:
    ports = []
    for _ in range(2):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            ports.append(sock.getsockname()[1])
    env = {
        "PATH": os.environ.get("PATH", ""),
        "RANK": "0",
        "MLX_RANK": "0",
        "WORLD_SIZE": "2",  # rank 1 never starts
        "CORRAL_MLX_BACKEND": "ring",
        "CORRAL_MLX_HOSTS": json.dumps([[f"127.0.0.1:{port}"] for port in ports]),
        "CORRAL_MLX_INIT_TIMEOUT": "2",
        "CORRAL_NODE_DIR": str(tmp_path),
    }
    code = "import os, sys; from corral.agent.mlx_env import prepare; sys.exit(prepare(os.environ))"
    result = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 1, result.stderr
    assert "Timeout (0:00:02)!" in result.stderr
    assert "in wait_for_mlx_peers" in result.stderr
