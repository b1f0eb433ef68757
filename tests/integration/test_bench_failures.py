"""Benchmarks fail loudly: a benchmark whose measured corral runs fail exits non-zero,
says which run failed with its command and last stderr lines, and its result (and
``run_all``'s summary) says ``failed``, never ``ok`` or ``skipped``.

Real ``corral run`` processes (the python launcher, stdlib ranks; no torch); results
go to a temporary directory (``CORRAL_BENCH_RESULTS``), never ``benchmarks/results``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "benchmarks"


@pytest.fixture
def results(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    out = tmp_path / "results"
    out.mkdir()
    monkeypatch.setenv("CORRAL_BENCH_RESULTS", str(out))
    return out


@pytest.fixture
def run_all(results: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    monkeypatch.syspath_prepend(str(BENCH))
    for name in ("benchlib", "run_all"):
        sys.modules.pop(name, None)
    import run_all as module

    assert results == module.RESULTS_DIR
    yield module
    for name in ("benchlib", "run_all"):
        sys.modules.pop(name, None)


def test_teardown_benchmark_whose_corral_runs_fail_their_preflight_exits_nonzero(
    results: Path, tmp_path: Path
) -> None:
    """The GPU machine's case: every corral run failed its pre-flight and the benchmark
    printed a figure and exited 0. Here the pre-flight fails because the hosts'
    interpreter cannot start (``CORRAL_PYTHON``, the ``--python`` option's variable)."""
    env = {
        **_env(results),
        "CORRAL_PYTHON": str(tmp_path / "no-such-python3"),
    }
    one_round = ["--runs", "1", "--torchrun-runs", "0", "--gloo-runs", "0"]
    proc = subprocess.run(
        [sys.executable, str(BENCH / "bench_teardown.py"), *one_round],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    err = proc.stderr
    assert "[bench] teardown FAILED: 1 of 1 measured run(s) failed" in err
    assert "run python/sleep round 1: exit code 2, expected 7" in err
    assert "root cause rank None, expected 1" in err
    command = next(line for line in err.splitlines() if line.startswith("  command: "))
    assert " -m corral run --hosts local:2 " in command and "teardown_job.py" in command
    assert "error: pre-flight checks failed" in err  # the run's own last stderr lines
    assert "no-such-python3" in err
    last = err.strip().splitlines()[-1]
    assert last.startswith("teardown: FAILED: run python/sleep round 1: exit code 2")
    doc = json.loads((results / "teardown.json").read_text())
    assert doc["status"] == "failed" and doc["met"] is False
    (failed,) = doc["failed_runs"]
    assert failed["argv"][:4] == [sys.executable, "-m", "corral", "run"]
    assert any("pre-flight checks failed" in line for line in failed["tail"])


def _env(results: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    env["CORRAL_BENCH_RESULTS"] = str(results)
    return env


FAKE_BENCH = """
import subprocess, sys
from pathlib import Path
sys.path.insert(0, {bench!r})
from benchlib import Runs, bench_env, corral_cli, finish, metric

work = Path({work!r})
script = work / "fails.py"
script.write_text(
    "import sys\\n"
    "print('Permission denied: /data/shard-0 (rank boom)', file=sys.stderr)\\n"
    "sys.exit(1)\\n"
)
argv = [*corral_cli()[0], "run", "--hosts", "local:1", "--launcher", "python",
        "--no-preflight", "--master-port", "0", "--run-dir", str(work / "runs"),
        "--", str(script)]
proc = subprocess.run(argv, capture_output=True, text=True, env=bench_env(), cwd=work)
runs = Runs()
runs.check("only round", argv, proc.returncode, output=proc.stderr,
           timings={{"time to first step": None}})
print("fake: first step - s")
sys.exit(finish("fake", {{
    "title": "a benchmark fed a failing run", "status": "ok",
    "metrics": [metric("time to first step", None, "s", "<= 1.10x", None)],
}}, runs))
"""


def test_run_all_reports_a_benchmark_fed_a_failing_script_as_failed_with_its_run(
    run_all: ModuleType, results: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A script that exits 1 under corral: the benchmark exits 1 and ``run_all`` calls
    it failed (not skipped, although the run's stderr says "Permission denied"), with
    the failing run's command and last line in the summary."""
    for key in [k for k in os.environ if k.startswith("CORRAL_")]:
        if key != "CORRAL_BENCH_RESULTS":
            monkeypatch.delenv(key)
    work = tmp_path / "work"
    work.mkdir()
    bench = tmp_path / "bench_fake.py"
    bench.write_text(textwrap.dedent(FAKE_BENCH.format(bench=str(BENCH), work=str(work))))
    record = run_all.run_one("fake", bench, 240.0)
    assert record["exit_code"] == 1, record
    assert record["status"] == "failed", record
    assert record["reason"].startswith("1 of 1 measured run(s) failed")
    assert "no figure for 'time to first step'" in record["reason"]
    (failed,) = record["failed_runs"]
    assert failed["label"] == "only round"
    assert failed["problems"][0].startswith("exit code 1, expected 0")
    assert "no time to first step was measured" in failed["problems"]
    assert any("Permission denied: /data/shard-0 (rank boom)" in x for x in failed["tail"])
    assert failed["argv"][-1].endswith("fails.py")
    log = (results / "fake.log").read_text()
    assert "command: " in log and "fails.py" in log
    table = run_all.markdown([record], {"cpu_count": 2}, "2026-01-01")
    assert "- **fake**: failed: 1 of 1 measured run(s) failed" in table
    assert "run only round: exit code 1, expected 0" in table


def test_finish_marks_missing_or_zero_targeted_figures_failed(
    run_all: ModuleType, results: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """No run was checked, yet a targeted figure that is absent or a time of 0 fails
    the benchmark; an informational row without a value does not."""
    import benchlib

    ok = [
        benchlib.metric("teardown latency", 0.4, "s", "<= 2 s", True),
        benchlib.metric("placement (info)", None, "s", "-", None),
        benchlib.metric("processes left", 0.0, "count", "0", True),
    ]
    assert benchlib.finish("good", {"status": "ok", "metrics": ok}) == 0
    assert json.loads((results / "good.json").read_text())["status"] == "ok"
    zero = benchlib.metric("time to first step", 0.0, "s", "<= 1.10x", False)
    missing = benchlib.metric("calibrated throughput", None, "examples/s", ">= 1", None)
    assert benchlib.finish("bad", {"status": "ok", "metrics": [*ok, zero, missing]}) == 1
    doc = json.loads((results / "bad.json").read_text())
    assert doc["status"] == "failed"
    assert doc["reason"] == (
        "'time to first step' is 0 s: never measured; no figure for 'calibrated throughput'"
    )
    assert capsys.readouterr().err.strip().splitlines()[-1] == f"bad: FAILED: {doc['reason']}"
    assert benchlib.finish("skip", {"status": "skipped", "reason": "no GPU"}) == 77
