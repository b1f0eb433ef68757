"""Diagnosis on ``local:N`` (real gloo): a straggler is named while the job trains,
and a rank that skipped an all-reduce is named in the hang report."""

from __future__ import annotations

import json
import re
from pathlib import Path

from tests.conftest import require_torch

from .conftest import REPO, run_corral, wait_no_job_processes

require_torch()


def _run(
    tmp_path: Path, job: str, hosts: str, *script: str, extra: tuple[str, ...] = ()
) -> tuple[int, str]:
    result = run_corral(
        "run",
        "--hosts",
        hosts,
        "--launcher",
        "python",
        "--master-port",
        "0",
        "--run-dir",
        str(tmp_path / "runs"),
        "--job-id",
        job,
        "--grace",
        "3",
        *extra,
        "--",
        str(REPO / "benchmarks" / "workloads" / "diagnose_job.py"),  # the benchmark's workload
        *script,
        cwd=tmp_path,
    )
    return result.returncode, result.stdout + result.stderr


def test_a_delayed_rank_is_named_with_its_host_and_equal_ranks_are_not(tmp_path: Path) -> None:
    code, out = _run(
        tmp_path, "strag1", "local:2", "--steps", "40", "--slow-rank", "1", "--slow-from", "10"
    )
    assert code == 0, out[-4000:]
    found = re.search(
        r"straggler: rank 1 on local-1, compute ([\d.]+)x the median for (\d+) steps", out
    )
    assert found, out[-4000:]
    assert float(found[1]) >= 1.5 and int(found[2]) <= 20
    assert "straggler: rank 0" not in out
    assert "stragglers: rank 1 on local-1 (compute" in out  # the summary
    code, out = _run(tmp_path, "strag2", "local:2", "--steps", "30")
    assert code == 0, out[-4000:]
    assert "straggler:" not in out


def test_a_rank_that_skips_an_all_reduce_is_the_odd_one_out(tmp_path: Path) -> None:
    code, out = _run(
        tmp_path,
        "skip1",
        "local:3",
        "--steps",
        "12",
        "--skip-rank",
        "2",
        "--skip-at",
        "5",
        extra=("--hang-timeout", "3"),
    )
    assert code == 125, out[-4000:]
    assert re.search(
        r"odd one out: rank 2 on local-2 at barrier \(torch/distributed/[\w/]+\.py:\d+\) "
        r"from <module> \(diagnose_job\.py:\d+\); the others are at all_reduce",
        out,
    ), out[-4000:]
    assert re.search(r"root cause: hang: .*odd one out: rank 2 on local-2", out), out[-3000:]
    hang = tmp_path / "runs" / "skip1" / "hang"
    report = json.loads((hang / "report.json").read_text())
    assert [(o["host"], o["rank"]) for o in report["odd"]] == [("local-2", 2)]
    assert "odd one out: rank 2 on local-2" in (hang / "report.md").read_text()
    assert not wait_no_job_processes("skip1", within=30)
