"""``corral calibrate`` on ``local:N`` (real rank processes), and a job re-weighed at a
restart from its live throughput (the drift monitor as the engine's restart hook)."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import textwrap
import time
from pathlib import Path

import pytest

from corral.cluster import load_cluster
from corral.job.drift import DriftMonitor
from corral.job.engine import Job
from corral.job.events import JobEvent, LogLines, Message
from corral.job.options import CheckPolicy, RestartPolicy, SupervisionPolicy
from corral.plan.spec import JobSpec
from corral.throughput.model import load_calibration

from .conftest import (
    REPO,
    corral_argv,
    job_processes,
    run_corral,
    wait_for_output,
    wait_no_job_processes,
)

# Rank processes of node 1 (local-1) step half as fast as those of node 0, by sleeping:
# rates that do not depend on how busy this machine's CPUs are.
PACED = """
import os, time
from corral import sdk

assert sdk.calibrating(), "CORRAL_CALIBRATE is not set"
me = sdk.info()
delay = 0.05 if me.node_rank == 0 else 0.10
step = 0
while True:
    time.sleep(delay)
    step += 1
    sdk.report(step, examples=8)
"""


def _script(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return str(path)


def _calibrate(tmp_path: Path, job: str, *args: str) -> tuple[int, str, str]:
    done = run_corral(
        "calibrate",
        "--hosts",
        "local:2",
        "--run-dir",
        str(tmp_path / "runs"),
        "--job-id",
        job,
        *args,
        cwd=tmp_path,
        timeout=180,
    )
    return done.returncode, done.stdout, done.stderr


@pytest.mark.torch  # the ranks import it (found here without importing it)
def test_builtin_workload_gives_a_table_and_a_reusable_file(tmp_path: Path) -> None:
    # local-1 declares 8 MiB: the workload probes the largest micro-batch under it
    code, out, err = _calibrate(tmp_path, "cal-builtin", "--seconds", "2", "--mem-cap", "local-1=8")
    assert code == 0, err[-3000:]
    for word in ("host", "ex/s", "share", "fits", "local-0", "local-1", "█", "built-in workload"):
        assert word in out, out
    path = tmp_path / "runs" / "cal-builtin" / "calibration.json"
    latest = tmp_path / "runs" / "calibration-latest.json"
    cal = load_calibration(path)
    assert load_calibration(latest) == cal
    assert cal.hosts == ["local-0", "local-1"] and cal.workload == "reference"
    assert cal.script is None and cal.seconds == 2
    assert [(r.host, r.rank, r.local_rank) for r in cal.ranks] == [
        ("local-0", 0, 0),
        ("local-1", 1, 0),
    ]
    assert all(r.examples_per_s > 0 and r.reports >= 5 for r in cal.ranks)
    # a 3 x 512 MLP: 6 MiB of parameters and gradients, about 8 kB of activations an example
    fit = cal.ranks[1].fits
    assert cal.ranks[0].fits is None and fit is not None and 64 < fit < 1024, cal.ranks
    assert f"rank 1: a step fits a micro-batch of {fit}" in out
    assert sum(cal.workload_distribution.values()) == pytest.approx(1.0, abs=1e-4)
    assert cal.calibration_notes in out  # off a terminal nothing is wrapped
    assert f"--calibration {path}" in out
    assert not wait_no_job_processes("cal-builtin", within=15)


def test_a_script_reporting_examples_is_measured_per_rank(tmp_path: Path) -> None:
    script = _script(tmp_path, "paced.py", PACED)
    copy = tmp_path / "copy.json"
    code, out, err = _calibrate(
        tmp_path,
        "cal-script",
        "--nproc-per-node",
        "2",
        "--seconds",
        "6",
        "--json",
        "-o",
        str(copy),
        "--",
        script,
        "--flag",
    )
    assert code == 0, err[-3000:]
    doc = json.loads(out)  # --json: nothing else on stdout
    cal = doc["hardware_calibration"]
    assert cal["script"] == [script, "--flag"] and cal["workload"] == "script"
    assert [r["host"] for r in cal["ranks"]] == ["local-0", "local-0", "local-1", "local-1"]
    fast, slow = cal["workload_distribution"]["local-0"], cal["workload_distribution"]["local-1"]
    assert 0.58 < fast < 0.75 and fast + slow == pytest.approx(1.0, abs=1e-4), cal
    rates = [r["examples_per_s"] for r in cal["ranks"]]
    assert rates[0] / rates[2] == pytest.approx(2.0, rel=0.3), rates
    assert "Throughput differs" in cal["calibration_notes"]
    assert json.loads(copy.read_text()) == doc
    assert "local-0 total" not in out  # the table went nowhere near stdout
    assert not wait_no_job_processes("cal-script", within=15)


@pytest.mark.torch
def test_the_ddp_example_calibrates_as_documented(tmp_path: Path) -> None:
    code, out, err = _calibrate(
        tmp_path, "cal-example", "--seconds", "1", "--", str(REPO / "examples" / "train_ddp.py")
    )
    assert code == 0, err[-3000:]
    cal = load_calibration(tmp_path / "runs" / "cal-example" / "calibration.json")
    assert [r.host for r in cal.ranks] == ["local-0", "local-1"] and cal.workload == "script"
    assert all(r.examples_per_s > 0 and r.reports >= 5 for r in cal.ranks)
    assert "The script ended" not in cal.calibration_notes  # it ran until it was stopped
    assert "calibrating: training until corral calibrate stops this rank" in out
    assert "Waiting for master" not in out + err  # no process group: no master to wait for
    assert not wait_no_job_processes("cal-example", within=15)


# 40 steps, then done: over long before a 20 s window.
SHORT = """
import time
from corral import sdk

for step in range(1, 41):
    time.sleep(0.01)
    sdk.report(step, 40, examples=8)
"""


def test_a_script_that_ends_before_the_window_is_measured_and_said_so(tmp_path: Path) -> None:
    script = _script(tmp_path, "short.py", SHORT)
    code, out, err = _calibrate(tmp_path, "cal-short", "--seconds", "20", "--", script)
    assert code == 0, err[-3000:]
    cal = load_calibration(tmp_path / "runs" / "cal-short" / "calibration.json")
    assert all(r.examples_per_s > 0 for r in cal.ranks)
    assert "before the 20 s measuring window was over" in cal.calibration_notes
    assert "more steps while sdk.calibrating()" in cal.calibration_notes
    assert cal.calibration_notes in out and "none after the warm-up" not in err


def test_a_script_without_examples_is_named(tmp_path: Path) -> None:
    script = _script(tmp_path, "quiet.py", "from corral import sdk\nsdk.report(1, loss=0.5)\n")
    code, _out, err = _calibrate(tmp_path, "cal-quiet", "--seconds", "3", "--", script)
    assert code != 0
    assert "no examples reported by local-0:0, local-1:1" in err
    assert "sdk.report(step, examples=N)" in err and "Traceback" not in err


def test_a_failing_script_fails_with_its_root_cause(tmp_path: Path) -> None:
    script = _script(
        tmp_path,
        "boom.py",
        """
        from corral import sdk
        if sdk.info().rank == 1:
            raise RuntimeError("no data on this host")
        import time
        for step in range(1000):
            time.sleep(0.05)
            sdk.report(step, examples=4)
        """,
    )
    code, out, err = _calibrate(tmp_path, "cal-boom", "--seconds", "20", "--", script)
    assert code != 0
    assert "calibration job failed: rank 1 on local-1 exited with code 1" in err, err[-3000:]
    assert "RuntimeError: no data on this host" in err.splitlines()[-1]
    assert "root cause: rank 1 on local-1 exited with code 1" in out  # corral run's summary
    assert not wait_no_job_processes("cal-boom", within=15)


# Attempt 0: both ranks step in lockstep (0.1 s), rank 0 computing twice as fast
# (busy seconds), until rank 0 fails; attempt 1 prints the weights it was given.
LOCKSTEP = """
import os, sys, time
from corral import sdk

me = sdk.info()
if me.attempt == 0:
    busy = 0.02 if me.rank == 0 else 0.04
    end = time.time() + 5
    step = 0
    while time.time() < end:
        time.sleep(0.1)
        step += 1
        sdk.report(step, examples=10, busy=busy)
    sys.exit(7 if me.rank == 0 else 0)
print("weights", os.environ["CORRAL_WORKLOAD_WEIGHTS"], flush=True)
"""


def test_rebalance_applies_live_weights_at_the_restart(tmp_path: Path) -> None:
    script = _script(tmp_path, "lockstep.py", LOCKSTEP)
    cluster = load_cluster("local:2")
    spec = JobSpec(
        script=script,
        launcher="python",
        job_id="rebalance1",
        master_port=0,
        run_dir=str(tmp_path / "runs"),
        workload_weights=(0.5, 0.5),
    )
    job = Job(
        spec,
        cluster,
        checks=CheckPolicy(enabled=False),
        restarts=RestartPolicy(max_restarts=1, backoff=0),
        supervision=SupervisionPolicy(grace=3),
    )
    monitor = DriftMonitor(
        spec.workload_weights,
        cluster,
        None,
        emit=job.emit,
        rebalance=True,
        min_seconds=1,
        check_every=0.5,
    )
    job.subscribe(monitor.on_event)
    job.before_restart = monitor.respec
    events: list[JobEvent] = []
    job.subscribe(events.append)
    result = asyncio.run(job.run())
    assert result.exit_code == 0, [e for e in events if isinstance(e, Message)]
    printed = b"".join(e.data for e in events if isinstance(e, LogLines)).decode()
    assert printed.count("weights 0.666667,0.333333") == 2, printed
    texts = [e.text for e in events if isinstance(e, Message)]
    assert any("rank 1 (local-1) runs" in t and "below its calibrated share" in t for t in texts)
    assert any("rebalanced workload weights" in t for t in texts), texts
    plan = json.loads((tmp_path / "runs" / "rebalance1" / "plan.json").read_text())
    env = plan["nodes"][0]["env"]
    assert env["CORRAL_WORKLOAD_WEIGHTS"] == "0.666667,0.333333"


def test_bad_seconds_is_one_error_line(tmp_path: Path) -> None:
    code, out, err = _calibrate(tmp_path, "cal-bad", "--seconds", "0")
    assert code == 2 and out == ""
    assert err.strip() == "error: --seconds: must be 1 to 3600 (got 0)"


@pytest.mark.parametrize(
    ("cap", "message"),
    [
        ("local-1", "'local-1': expected HOST=MB with a positive number of MiB"),
        ("local-1=-4", "'local-1=-4': expected HOST=MB with a positive number of MiB"),
        ("tb9=64", "tb9 not in the cluster (hosts: local-0, local-1)"),
    ],
)
def test_a_bad_memory_cap_is_one_error_line(tmp_path: Path, cap: str, message: str) -> None:
    code, out, err = _calibrate(tmp_path, "cal-bad-cap", "--mem-cap", cap)
    assert code == 2 and out == ""
    assert err.strip() == f"error: --mem-cap: {message}"
    assert not (tmp_path / "runs").exists()


def test_ctrl_c_stops_every_rank_and_saves_nothing(tmp_path: Path) -> None:
    script = _script(tmp_path, "paced.py", PACED)
    runs = tmp_path / "runs"
    argv = corral_argv(
        "calibrate", "--hosts", "local:2", "--run-dir", str(runs), "--job-id", "cal-int",
        "--seconds", "120", "--", script,
    )  # fmt: skip
    proc = subprocess.Popen(
        argv, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        wait_for_output(proc, r"\[local-1:1\] |launcher python", timeout=60)
        deadline = time.monotonic() + 30
        while len(job_processes("cal-int")) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 130
    finally:
        proc.kill()
        proc.wait()
    assert not wait_no_job_processes("cal-int", within=15)
    assert not (runs / "cal-int" / "calibration.json").exists()
    assert not (runs / "calibration-latest.json").exists()
