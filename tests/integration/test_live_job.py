"""A corral job that keeps running (local:2, each rank prints a line then sleeps),
seen from the side: its per-rank logs fill while it runs, and a second corral's
pre-flight names it as busy, never as stale, while a real orphan of an ended job
is stale with its kill command."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from .conftest import (
    corral_argv,
    job_processes,
    run_corral,
    wait_for_output,
    wait_no_job_processes,
)

RANK_SCRIPT = """\
import os, time
print(f"live line from rank {os.environ['RANK']}", flush=True)
time.sleep(600)
"""


@dataclass
class LiveJob:
    job_id: str
    run_dir: Path
    proc: subprocess.Popen[str]

    def alive(self) -> bool:
        """The coordinator and both ranks still run."""
        ranks = [p for p in job_processes(self.job_id) if "rank.py" in " ".join(p.cmdline())]
        return self.proc.poll() is None and len(ranks) == 2


@pytest.fixture(scope="module")
def live_job(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveJob]:
    root = tmp_path_factory.mktemp("live")
    (root / "rank.py").write_text(RANK_SCRIPT)
    job_id = f"live-{uuid.uuid4().hex[:8]}"
    argv = corral_argv(
        "run",
        "--hosts",
        "local:2",
        "--launcher",
        "python",
        "--master-port",
        "0",
        "--no-preflight",
        "--run-dir",
        str(root / "runs"),
        "--job-id",
        job_id,
        "--",
        str(root / "rank.py"),
    )
    proc = subprocess.Popen(
        argv,
        cwd=root,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    try:
        seen = wait_for_output(proc, r"live line from rank \d[\s\S]*live line from rank \d")
        assert "rank 0" in seen and "rank 1" in seen
        yield LiveJob(job_id, root / "runs", proc)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        finally:
            for left in wait_no_job_processes(job_id, 30):
                left.kill()


def test_rank_logs_fill_while_the_rank_runs(live_job: LiveJob) -> None:
    job_dir = live_job.run_dir / live_job.job_id
    files = {
        job_dir / "logs" / "local-0.0.log": b"live line from rank 0\n",
        job_dir / "logs" / "local-1.1.log": b"live line from rank 1\n",
        job_dir / "nodes" / "local-0" / "logs" / "rank-0.log": b"live line from rank 0\n",
        job_dir / "nodes" / "local-1" / "logs" / "rank-1.log": b"live line from rank 1\n",
    }
    for _ in range(300):  # bounded polling (the line is on corral's stdout already)
        if all(p.exists() and p.read_bytes() == line for p, line in files.items()):
            break
        time.sleep(0.1)
    assert {p.name: p.read_bytes() for p in files} == {p.name: v for p, v in files.items()}
    assert live_job.alive()  # written while the ranks still run, not at their exit


def test_a_running_job_is_busy_and_an_orphan_of_an_ended_job_is_stale(
    live_job: LiveJob, tmp_path: Path
) -> None:
    # the job's agents (local ones have no CORRAL_JOB_ID of their own) and its ranks
    live = {p.pid for p in psutil.Process(live_job.proc.pid).children(recursive=True)}
    assert len(live) >= 4 and {p.pid for p in job_processes(live_job.job_id)} <= live
    # an orphan of an ended job: its job's agent is gone, its parent exited
    gone = f"gone-{uuid.uuid4().hex[:8]}"
    spawner = (
        "import os, subprocess, sys\n"
        "p = subprocess.Popen(['sleep', '600'], start_new_session=True,\n"
        "                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,\n"
        "                     stderr=subprocess.DEVNULL,\n"
        "                     env={**os.environ, 'CORRAL_JOB_ID': sys.argv[1]})\n"
        "print(p.pid)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", spawner, gone],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    orphan = int(out.stdout)
    try:
        # the stale check's facts are gathered before the collective smoke test, whose
        # ranks (importing torch) this check does not need
        proc = run_corral(
            "check", "--hosts", "local:2", "--launcher", "python", "--no-smoke-test", "--json",
            cwd=tmp_path,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        report = json.loads(proc.stdout)
    finally:
        os.kill(orphan, signal.SIGKILL)
    check = next(c for c in report["checks"] if c["name"] == "stale")
    killed = {int(p) for p in re.findall(r"\b\d+\b", check["fix_command"] or "")}
    assert orphan in killed
    assert not live & killed, check["fix_command"]
    details = " ".join(h["detail"] for h in check["hosts"].values())
    assert f"ended corral job(s) {gone}" in details or gone in details
    assert f"busy: job {live_job.job_id} is running here" in details
    # each PID named once over the two local nodes (one machine)
    listed: list[int] = []
    for host in check["data"].values():
        listed += [p["pid"] for p in host["corral"]]
        listed += [pid for b in host["busy"] for pid in b["pids"]]
    assert listed.count(orphan) == 1
    assert all(listed.count(pid) == 1 for pid in live), listed
    assert live_job.alive()
