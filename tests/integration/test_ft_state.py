"""The whole state through a heal (issue 33 item 1): ``sdk.fault_tolerant(...,
state=)`` carries an LR scheduler and a sampler beside the model and the optimizer,
and the groups' digests are compared after every quorum change. Replica groups on
``local:2`` (one plain python rank each: torchrun is not the subject, and a torchrun
per group imports torch once more), torchft over gloo, a real Lighthouse."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from .conftest import REPO, run_corral, wait_no_job_processes

pytestmark = pytest.mark.torch  # the ranks import torch (checked before each test)

SCRIPT = str(REPO / "tests" / "integration" / "scripts" / "ft_state.py")


def _run(tmp_path: Path, job: str, *script: str) -> tuple[int, str]:
    result = run_corral(
        *("run", "--hosts", "local:2", "--recovery", "in-place", "--launcher", "python"),
        *("--no-preflight", "--master-port", "0", "--run-dir", str(tmp_path / "runs")),
        *("--job-id", job, "--env", "OMP_NUM_THREADS=1"),  # no idle OpenMP workers spinning
        *("--grace", "3", "--", SCRIPT, *script),
        cwd=tmp_path,
        timeout=400,
    )
    assert wait_no_job_processes(job, within=15) == []
    return result.returncode, result.stderr + result.stdout


def test_a_healed_group_holds_the_peers_scheduler_and_sampler(tmp_path: Path) -> None:
    code, err = _run(tmp_path, "ftstate", "--kill-group", "1", "--kill-at", "4")
    assert code == 0, err[-4000:]
    assert re.search(r"group 1 \(local-1\) rejoined at step \d+, healed from local-0", err)
    final = dict(re.findall(r"group (\d) final (step \d+ lr \S+ sampler \d+)", err))
    # without the carry the restarted group's schedule and sampler start over
    assert set(final) == {"0", "1"} and final["0"] == final["1"], final
    assert "StateMismatch" not in err


def test_an_object_the_heal_does_not_restore_fails_naming_it(tmp_path: Path) -> None:
    # group 1 joins late, so its heal (not a restart's: one rank fewer) brings the
    # peer's state at step 4 or later, where a stale sampler shows
    late = ("--late-group", "1", "--late-at", "4", "--progress", str(tmp_path / "at4"))
    code, err = _run(tmp_path, "ftbroken", *late, "--break", "sampler")
    assert code != 0, err[-4000:]
    line = re.search(r"StateMismatch: sdk.fault_tolerant: after the quorum change .*", err)
    assert line is not None, err[-4000:]
    assert "hold different states: 'sampler' (group 0: " in line.group(0)
    assert "'scheduler'" not in line.group(0) and "'model'" not in line.group(0)
    # the summary's root cause keeps the group failure's traceback, the mismatch named
    cause = err[err.index("\nroot cause: ") :]
    assert "StateMismatch: sdk.fault_tolerant: after the quorum change" in cause
