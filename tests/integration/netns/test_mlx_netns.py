"""``--launcher mlx`` across testbed hosts over real SSH (2 hosts x 2 ranks, CPU):
MLX's ring between the namespaces, and a failing rank's own exit code with
nothing left on any host."""

from __future__ import annotations

from pathlib import Path

import pytest

from corral.testbed import Testbed
from tests.conftest import require

from ..conftest import run_corral
from ..test_mlx_local import EXAMPLE, assert_all_sum, assert_rank_failed_alone, mlx_run_args

pytestmark = pytest.mark.netns
HOSTS = ["tb1", "tb2"]


def _args(testbed: Testbed, tmp_path: Path, run_dir: Path, job: str) -> list[str]:
    hostfile = tmp_path / "hosts"
    hostfile.write_text("".join(f"{name}\n" for name in HOSTS))
    args = mlx_run_args(run_dir, job, hosts=str(hostfile), nproc=2)
    return [*args, "--ssh-config", str(testbed.ssh_config)]


@pytest.fixture(autouse=True)
def _mlx() -> None:
    require("mlx.core", "the mlx extra: make setup")


def test_all_sum_over_four_ranks_on_two_hosts(
    testbed: Testbed, run_dir: Path, tmp_path: Path
) -> None:
    args = _args(testbed, tmp_path, run_dir, "mlx-ssh-sum")
    result = run_corral(*args, "--", EXAMPLE, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-4000:]
    assert_all_sum(result.stdout, HOSTS)


def test_a_failing_rank_fails_the_job_with_its_code_and_leaves_nothing(
    healthy_testbed: Testbed, run_dir: Path, tmp_path: Path
) -> None:
    args = _args(healthy_testbed, tmp_path, run_dir, "mlx-ssh-exit7")
    result = run_corral(*args, "--", EXAMPLE, "--fail-rank", "2", cwd=tmp_path)
    assert_rank_failed_alone(result, "mlx-ssh-exit7", "tb2")
