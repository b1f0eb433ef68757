"""``--rebalance`` with calibration weights on ``local:2``: a rank delayed inside
``sdk.section("compute")`` is named a straggler, and when its failure restarts the job,
the next attempt's weights have moved work away from its node. The ranks step in
lockstep as DDP ranks do, over a standard-library barrier (the subject is corral's
straggler evidence and weights, not gloo; importing torch costs each rank ~2 CPU-s)."""

from __future__ import annotations

import re
from datetime import datetime, timezone
from pathlib import Path

from corral.throughput.model import Calibration, RankRate, save_calibration

from .conftest import SCRIPTS, run_corral, wait_no_job_processes

WEIGHTS = re.compile(r"attempt (\d) weights ([0-9.]+),([0-9.]+)")


def _even_calibration(path: Path) -> Path:
    """A calibration measuring local-0 and local-1 equally fast (weights 0.5, 0.5)."""
    hosts = ["local-0", "local-1"]
    ranks = [
        RankRate(rank=i, host=h, local_rank=0, examples_per_s=1000.0, share=0.5,
                 examples=10000.0, seconds=10.0, reports=20)
        for i, h in enumerate(hosts)
    ]  # fmt: skip
    calibration = Calibration(
        measured_performance=dict.fromkeys(hosts, 1000.0),
        workload_distribution=dict.fromkeys(hosts, 0.5),
        calibration_notes="set by the test",
        when=datetime(2026, 11, 24, tzinfo=timezone.utc),
        job_id="calibrate-test",
        seconds=10.0,
        hosts=hosts,
        ranks=ranks,
        script=None,
        workload="reference",
    )
    return save_calibration(calibration, path)


def test_a_compute_straggler_moves_work_away_from_its_node_at_the_restart(
    tmp_path: Path,
) -> None:
    cal = _even_calibration(tmp_path / "cal.json")
    done = run_corral(
        "run", "--hosts", "local:2", "--launcher", "python", "--master-port", "0",
        "--run-dir", str(tmp_path / "runs"), "--job-id", "rebal1", "--grace", "3",
        "--calibration", str(cal), "--rebalance", "--max-restarts", "1",
        "--restart-backoff", "0", "--no-preflight",
        "--", str(SCRIPTS / "lockstep.py"), "--steps", "20", "--slow-rank", "1", "--delay", "0.06",
        "--fail-at", "12",
        cwd=tmp_path,
    )  # fmt: skip
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    assert re.search(r"straggler: rank 1 on local-1, compute [\d.]+x the median", out), out[-4000:]
    assert "moves work away from local-1 (--rebalance)" in out, out[-4000:]
    assert "rebalanced workload weights from a straggler for the next attempt" in out
    weights = {int(m[1]): (float(m[2]), float(m[3])) for m in WEIGHTS.finditer(out)}
    assert weights[0] == (0.5, 0.5), out[-4000:]
    assert weights[1][1] < weights[1][0], weights  # local-1 carries less than local-0 now
    assert not wait_no_job_processes("rebal1", within=30)
