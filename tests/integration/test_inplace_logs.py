"""An in-place job's output is not drowned in torchft's logs: its INFO quorum lines
and the flight recorder warning of a CPU build are off by default (its quorum
changes still show) and on with ``--env CORRAL_TORCHFT_LOG=info`` (real groups on
``local:2`` under ``--launcher python``: the rank's worker quiets torchft under either
launcher, and a torchrun per group imports torch once more; torchft over gloo, a real
Lighthouse, examples/train_ft.py through ``sdk.fault_tolerant``; a few steps: the
second group joins late and heals, so there is at least one reconfiguration)."""

from __future__ import annotations

from pathlib import Path

import pytest

from .conftest import REPO, run_corral

pytestmark = [pytest.mark.torch, pytest.mark.slow]  # two in-place jobs (~30 CPU-s)

EXAMPLE = str(REPO / "examples" / "train_ft.py")
RUST_INFO = "[INFO] [torchft::"
FR_WARNING = "Unable to reset NCCL flight recorder recording so traces will be incorrect."


def _run(tmp_path: Path, job: str, *options: str) -> str:
    # one intra-op thread per rank: no idle OpenMP workers spinning between steps
    result = run_corral(
        "run", "--hosts", "local:2", "--recovery", "in-place", "--no-preflight",
        "--master-port", "0", "--run-dir", str(tmp_path / "runs"), "--job-id", job,
        "--grace", "3", "--launcher", "python", "--env", "OMP_NUM_THREADS=1", *options,
        "--", EXAMPLE, "--steps", "4",
        cwd=tmp_path, timeout=300,
    )  # fmt: skip
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-4000:]
    return out


def test_torchft_logs_warnings_only_by_default_and_everything_when_asked(
    tmp_path: Path,
) -> None:
    import torch

    cpu_build = not hasattr(torch._C._distributed_c10d, "_reset_fr_recording_nccl")
    quiet = _run(tmp_path, "ftquiet")
    assert RUST_INFO not in quiet, quiet[-4000:]
    assert "Start quorum" not in quiet and "should_commit" not in quiet
    assert FR_WARNING not in quiet
    assert "reconfiguring for quorum_id=" in quiet  # the quorum changes still show
    assert "dropped an invalid message" not in quiet  # the SDK's quorum events are accepted
    if cpu_build:  # folded: once per rank process, not at every reconfiguration
        assert 1 <= quiet.count("torchft's 'Unable to reset NCCL flight recorder") <= 2

    loud = _run(tmp_path, "ftloud", "--env", "CORRAL_TORCHFT_LOG=info")
    assert RUST_INFO in loud and "Start quorum" in loud
    if cpu_build:
        assert FR_WARNING in loud
    assert loud.count("\n") > 2 * quiet.count("\n")
