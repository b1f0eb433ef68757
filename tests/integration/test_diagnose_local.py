"""Diagnosis on ``local:N``: a straggler is named while the job trains (ranks in
lockstep over a standard-library barrier), and a rank that skipped a real gloo
all-reduce is named in the hang report (by its stack, and by torch's flight recorder)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from .conftest import REPO, SCRIPTS, run_corral, wait_no_job_processes

_WORKLOAD = REPO / "benchmarks" / "workloads" / "diagnose_job.py"  # the benchmark's
_LOCKSTEP = SCRIPTS / "lockstep.py"  # its straggler case, standard library only


def _run(
    tmp_path: Path,
    job: str,
    hosts: str,
    *script: str,
    extra: tuple[str, ...] = (),
    workload: Path = _WORKLOAD,
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
        str(workload),
        *script,
        cwd=tmp_path,
    )
    return result.returncode, result.stdout + result.stderr


def test_a_delayed_rank_is_named_with_its_host_and_equal_ranks_are_not(tmp_path: Path) -> None:
    # the detector reads the ranks' sections: a standard-library rank in lockstep shows
    # it (a rank importing torch costs ~2 CPU-s); the hangs below need gloo's
    code, out = _run(
        tmp_path, "strag1", "local:2", "--steps", "40", "--slow-rank", "1", "--slow-from", "10",
        workload=_LOCKSTEP,
    )  # fmt: skip
    assert code == 0, out[-4000:]
    found = re.search(
        r"straggler: rank 1 on local-1, compute ([\d.]+)x the median for (\d+) steps", out
    )
    assert found, out[-4000:]
    assert float(found[1]) >= 1.5 and int(found[2]) <= 20
    assert "straggler: rank 0" not in out
    assert "stragglers: rank 1 on local-1 (compute" in out  # the summary
    code, out = _run(tmp_path, "strag2", "local:2", "--steps", "30", workload=_LOCKSTEP)
    assert code == 0, out[-4000:]
    assert "straggler:" not in out


@pytest.mark.torch  # the ranks import torch (checked before the test)
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


@pytest.mark.torch  # the ranks import torch (checked before the test)
def test_a_gloo_hang_report_names_the_collective_from_the_flight_recorder(
    tmp_path: Path,
) -> None:
    """Two gloo ranks, rank 1 never enters the all-reduce of step 4: the hang report
    reads both ranks' flight recorder dumps (taken by corral's rank wrapper) with
    torch's analyser and names that all-reduce, its sequence id and rank 1."""
    code, out = _run(
        tmp_path,
        "fr1",
        "local:2",
        *("--steps", "6", "--skip-rank", "1", "--skip-at", "3"),
        extra=("--hang-timeout", "3"),
        workload=SCRIPTS / "fr_skip.py",
    )
    assert code == 125, out[-4000:]
    assert "deprecated" not in out.lower(), out[-4000:]  # torch's names, not the old ones
    hang = tmp_path / "runs" / "fr1" / "hang"
    report = json.loads((hang / "report.json").read_text())
    flight = report["flight_recorder"]
    assert flight is not None, report["flight_recorder_error"]
    assert (flight["collective"], flight["sequence"], flight["missing_ranks"]) == (
        "gloo:all_reduce",
        4,
        [1],
    )
    assert report["summary"].startswith("flight recorder: gloo:all_reduce #4"), report["summary"]
    assert re.search(r"root cause: hang: .*gloo:all_reduce #4 .*rank 1 never entered it", out)
    last = {entry["rank"]: entry["entries"] for entry in report["last_collectives"]}
    assert [e["seq"] for e in last[1]] == [1, 2, 3]
    assert last[0][-1]["op"] == "gloo:all_reduce" and last[0][-1]["input_sizes"] == [[8]]
    assert "never entered by ranks: 1" in (hang / "report.md").read_text()
    assert not wait_no_job_processes("fr1", within=30)
