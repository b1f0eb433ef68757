"""Diagnosis on ``local:N`` (real gloo on CPU): how fast corral names a straggler and
writes a hang report.

Measures, median of ``--runs``:

* straggler detection latency: ``local:2``, rank 1 sleeps ``--delay`` s more inside
  ``sdk.section("compute")`` from step ``--slow-from`` on; the steps from the
  delay's start to the named line (``straggler: rank 1 on local-1, ... for N
  steps``); target <= 20 steps. A run of equal ranks names nobody (checked).
* hang report latency beyond ``--hang-timeout``: ``local:3``, rank 2 skips one
  all-reduce; from the ranks' last step line to ``hang/report.md`` on disk, minus
  the hang timeout (the detector's 1 s poll, the stack dumps and the forensics);
  target <= 5 s.

    python benchmarks/bench_diagnose.py [--runs 2] [--hang-timeout 3]
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchlib import BENCH_DIR, bench_env, corral_cli, finish, log, median, metric

NAME = "diagnose"
WORKLOAD = BENCH_DIR / "workloads" / "diagnose_job.py"
STEPS_TARGET = 20
HANG_TARGET_S = 5.0


def _corral(
    run_dir: Path, job: str, hosts: str, *args: str, extra: tuple[str, ...] = ()
) -> list[str]:
    cli, _ = corral_cli()
    return [
        *cli, "run", "--hosts", hosts, "--launcher", "python", "--master-port", "0",
        "--run-dir", str(run_dir), "--job-id", job, "--grace", "3", "--no-preflight", *extra,
        "--", str(WORKLOAD), *args,
    ]  # fmt: skip


def straggler_run(run_dir: Path, job: str, slow: bool, slow_from: int, delay: float) -> int | None:
    """Steps from the delay's start to the named line (None: not named)."""
    args = ["--steps", "40"]
    if slow:
        args += ["--slow-rank", "1", "--slow-from", str(slow_from), "--delay", str(delay)]
    done = subprocess.run(
        _corral(run_dir, job, "local:2", *args),
        capture_output=True, text=True, timeout=300, env=bench_env(),
    )  # fmt: skip
    out = done.stdout + done.stderr
    found = re.search(
        r"straggler: rank (\d+) on (\S+), compute [\d.]+x \S+ \S+ for (\d+) steps", out
    )
    if done.returncode != 0:
        raise RuntimeError(f"job {job} failed ({done.returncode}): {out[-2000:]}")
    return int(found[3]) if found else None


def hang_run(run_dir: Path, job: str, timeout: float) -> tuple[float | None, bool]:
    """(seconds from the last step line to report.md, beyond ``timeout``; odd one named)."""
    proc = subprocess.Popen(
        _corral(run_dir, job, "local:3", "--steps", "12", "--skip-rank", "2", "--skip-at", "5",
                extra=("--hang-timeout", f"{timeout:g}")),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=bench_env(),
    )  # fmt: skip
    assert proc.stdout is not None
    last_step = None
    report = run_dir / job / "hang" / "report.md"
    seen = ""
    for line in proc.stdout:
        seen += line
        if re.search(r"\] step \d+$", line.rstrip()):
            last_step = time.time()
    proc.wait(timeout=120)
    if last_step is None or not report.exists():
        return None, False
    beyond = report.stat().st_mtime - last_step - timeout
    return beyond, "odd one out: rank 2 on local-2" in seen


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--hang-timeout", type=float, default=3.0)
    parser.add_argument("--slow-from", type=int, default=10)
    parser.add_argument("--delay", type=float, default=0.2)
    args = parser.parse_args()
    spans: list[float | None] = []
    hangs: list[float | None] = []
    named_ok = True
    with tempfile.TemporaryDirectory(prefix="corral-bench-diagnose-") as tmp:
        run_dir = Path(tmp) / "runs"
        for i in range(args.runs):
            span = straggler_run(run_dir, f"slow{i}", True, args.slow_from, args.delay)
            log(f"run {i}: straggler named after {span} steps")
            spans.append(None if span is None else float(span))
            beyond, odd = hang_run(run_dir, f"hang{i}", args.hang_timeout)
            log(f"run {i}: hang report {beyond} s beyond the timeout; odd one named: {odd}")
            hangs.append(beyond)
            named_ok = named_ok and odd
        equal = straggler_run(run_dir, "equal", False, args.slow_from, args.delay)
        log(f"equal ranks: {'nobody named' if equal is None else 'NAMED'}")
    steps = median(spans)
    hang_s = median(hangs)
    metrics = [
        metric(
            "straggler detection latency", steps, "steps", f"<= {STEPS_TARGET} steps",
            None if steps is None else steps <= STEPS_TARGET,
        ),
        metric(
            "hang report latency beyond --hang-timeout", hang_s, "s", f"<= {HANG_TARGET_S:g} s",
            None if hang_s is None else hang_s <= HANG_TARGET_S and named_ok,
        ),
        metric("equal ranks named", 0.0 if equal is None else 1.0, "lines", "0", equal is None),
    ]  # fmt: skip
    met = all(m["met"] for m in metrics)
    status_code = finish(
        NAME,
        {
            "title": "Diagnosis: straggler detection and hang report latency (local, gloo)",
            "status": "ok",
            "config": vars(args),
            "samples": {"straggler_steps": spans, "hang_beyond_s": hangs},
            "metrics": metrics,
            "target": f"<= {STEPS_TARGET} steps; <= {HANG_TARGET_S:g} s",
            "met": met,
        },
    )
    print(f"straggler named after {steps} steps; hang report {hang_s} s beyond the timeout")
    return status_code


if __name__ == "__main__":
    sys.exit(main())
