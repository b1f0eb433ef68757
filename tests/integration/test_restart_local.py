"""Hang detection and restarts on ``local:N``: the DDP example (real torch.distributed,
gloo on CPU) hangs and is restarted; a hang without restarts ends the job (ranks in
lockstep over a standard-library barrier: importing torch costs each rank ~2 CPU-s)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from .conftest import REPO, SCRIPTS, run_corral, wait_no_job_processes

EXAMPLE = str(REPO / "examples" / "train_ddp.py")
TRAIN = (EXAMPLE, "--steps", "40", "--checkpoint-every", "10", "--sleep-per-step", "0.05")


def _run(
    tmp_path: Path,
    job: str,
    *extra: str,
    script: tuple[str, ...],
    program: tuple[str, ...] = TRAIN,
) -> tuple[int, str, str]:
    """``program`` (default: the DDP example) and ``script`` (more arguments) under
    corral run on local:2 with ``extra`` options."""
    result = run_corral(
        "run",
        "--hosts",
        "local:2",
        "--launcher",
        "python",
        "--master-port",
        "0",
        "--run-dir",
        str(tmp_path / "runs"),
        "--job-id",
        job,
        "--checkpoint-dir",
        str(tmp_path / "ckpt"),
        "--grace",
        "3",
        *extra,
        "--",
        *program,
        *script,
        cwd=tmp_path,
    )
    return result.returncode, result.stdout, result.stderr


@pytest.mark.torch  # the ranks import torch (checked before the test)
def test_hang_is_dumped_named_and_restarted(tmp_path: Path) -> None:
    hang = ("--fail-at-step", "25", "--fail-rank", "1", "--fail-mode", "hang")
    code, out, err = _run(
        tmp_path,
        "hang1",
        "--hang-timeout",
        "5",
        "--max-restarts",
        "1",
        "--restart-backoff",
        "0",
        script=hang,
    )
    assert code == 0, err[-4000:]
    assert "hang detected: no rank made progress for" in err
    assert re.search(r"rank 1 on local-1 is stuck in hang_forever \(train_ddp\.py:\d+\)", err)
    assert re.search(r"rank 0 on local-0 waits in a collective", err), err[-3000:]
    dumps = tmp_path / "runs" / "hang1" / "hang"
    assert "hang_forever" in (dumps / "local-1.1.txt").read_text()
    assert (dumps / "local-0.0.txt").exists()
    # kept on the node too
    assert list((tmp_path / "runs" / "hang1" / "nodes" / "local-1" / "hang").glob("rank-1.txt"))
    assert "resumed from step 20 (world size 2)" in out
    assert re.search(r"final loss [\d.]+", out)
    attempts = json.loads((tmp_path / "runs" / "hang1" / "attempts.json").read_text())
    assert [a["state"] for a in attempts] == ["failed", "succeeded"]
    assert attempts[0]["host"] == "local-1" and attempts[0]["rank"] == 1
    assert attempts[0]["cause"].startswith("hang: ")
    result = json.loads((tmp_path / "runs" / "hang1" / "result.json").read_text())
    assert len(result["attempts"]) == 2
    assert not wait_no_job_processes("hang1", within=30)


def test_without_restarts_a_hang_ends_the_job_with_125(tmp_path: Path) -> None:
    hang = ("--hang-rank", "0", "--hang-at", "15")
    lockstep = (str(SCRIPTS / "lockstep.py"), "--steps", "40")
    code, _, err = _run(tmp_path, "hang2", "--hang-timeout", "4", script=hang, program=lockstep)
    assert code == 125, err[-4000:]
    assert "root cause: hang: no rank made progress" in err
    assert "rank 0 on local-0 is stuck in hang_forever" in err
    assert "attempts" not in err  # one attempt: no attempts table
    assert not wait_no_job_processes("hang2", within=30)


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("--max-restarts", "-1", "--max-restarts: must be 0 or more"),
        ("--min-nodes", "3", "--min-nodes: 3 is more than the 2 hosts of the cluster"),
        ("--min-nodes", "0", "--min-nodes: must be at least 1"),
        ("--host-timeout", "0", "--host-timeout: must be more than 0 s"),
        ("--hang-timeout", "-5", "--hang-timeout: must be more than 0 s"),
        ("--restart-backoff", "-1", "--restart-backoff: must be 0 or more seconds"),
    ],
)
def test_bad_fault_options_are_named(tmp_path: Path, option: str, value: str, message: str) -> None:
    code, _, err = _run(tmp_path, "bad", option, value, script=())
    assert code == 2
    assert message in " ".join(err.split()), err
    assert "Traceback" not in err
