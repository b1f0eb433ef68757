"""Teardown latency: from a rank's death to corral's exit, with every process gone.

``workloads/teardown_job.py`` runs on ``local:2 x 2``; every rank loops and rank 1
exits with code 7 at a time it records (``time.time()`` written just before it
exits). Measured: that timestamp to the moment ``corral run`` has exited (wall
clock in this parent). Then, with psutil: every process of corral's tree
snapshotted while the job ran must be gone, and no process may carry this job's
``CORRAL_JOB_ID`` in its environment (or the job id on its command line). The
exit code (7) and the root cause named in ``result.json`` (rank 1) are recorded.

Configurations: ``python`` and ``torchrun`` launchers with ranks sleeping in
10 ms steps, and the ``python`` launcher with ranks in a gloo allreduce loop.

Baseline, same run, same script: the rank processes (or the two torchrun
processes) started directly with ``subprocess``; this parent polls for the first
one to exit and sends a plain SIGTERM to the others (their process groups), and
the time is taken when all of them are gone. A bare ``python -c pass``
start + exit is recorded as a reference too.

    python benchmarks/bench_teardown.py [--runs 5] [--torchrun-runs 3] [--gloo-runs 3]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil
from benchlib import (
    PYTHON,
    WORKLOADS,
    Runs,
    alive,
    bench_env,
    corral_cli,
    exit_on_sigterm,
    finish,
    free_port,
    job_processes,
    kill_popen,
    log,
    median,
    metric,
    output_tail,
    ratio,
    read_stamp,
    seconds_text,
    tree,
)

NAME = "teardown"
NODES = 2
NPROC = 2
WORLD = NODES * NPROC
FAIL_RANK = 1
FAIL_CODE = 7
TARGET_S = 2.0
SCRIPT = WORKLOADS / "teardown_job.py"
READY_TIMEOUT = 90.0
EXIT_TIMEOUT = 60.0
POLL = 0.002


def _script_args(stamp_dir: Path, mode: str) -> list[str]:
    # With torch loaded, a rank's own interpreter shutdown takes ~1 s; the gloo
    # configuration therefore dies with os._exit so that only teardown is timed.
    hard = ["--hard-exit"] if mode == "gloo" else []
    return [
        *hard,
        str(stamp_dir),
        "--mode",
        mode,
        "--fail-rank",
        str(FAIL_RANK),
        "--code",
        str(FAIL_CODE),
        "--fail-after",
        "0.5",
    ]


def _wait_ready(stamp_dir: Path, procs: list[subprocess.Popen[bytes]]) -> bool:
    """Wait until every rank wrote its ready stamp (False on timeout or early exit)."""
    deadline = time.monotonic() + READY_TIMEOUT
    while time.monotonic() < deadline:
        if all((stamp_dir / f"ready-{r}").exists() for r in range(WORLD)):
            return True
        if any(p.poll() is not None for p in procs):
            # the failing rank may already have gone; the others must be ready
            return all((stamp_dir / f"ready-{r}").exists() for r in range(WORLD))
        time.sleep(0.01)
    return False


def _wait_gone(procs: list[psutil.Process], timeout: float) -> float | None:
    """Time (time.time()) when all of ``procs`` are gone; None on timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not alive(procs):
            return time.time()
        time.sleep(POLL)
    return None


def _describe(procs: list[psutil.Process]) -> list[str]:
    out = []
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            out.append(f"{proc.pid} {' '.join(proc.cmdline())[:160]}")
    return out


def run_corral(work: Path, launcher: str, mode: str, round_no: int) -> dict[str, Any]:
    """One ``corral run``; returns timings and what survived."""
    stamp_dir = work / "stamps"
    stamp_dir.mkdir(parents=True)
    run_dir = work / "runs"
    job_id = f"bench-teardown-{launcher}-{mode}-{round_no}-{os.getpid()}"
    cli, _ = corral_cli()
    argv = [
        *cli,
        "run",
        "--hosts",
        f"local:{NODES}",
        "--nproc-per-node",
        str(NPROC),
        "--master-port",
        "0",
        "--launcher",
        launcher,
        "--run-dir",
        str(run_dir),
        "--job-id",
        job_id,
        "--",
        str(SCRIPT),
        *_script_args(stamp_dir, mode),
    ]
    result: dict[str, Any] = {"job_id": job_id, "argv": argv}
    with open(work / "corral.out", "wb") as out, open(work / "corral.err", "wb") as err:
        launched = time.time()
        proc = subprocess.Popen(
            argv, stdout=out, stderr=err, env=bench_env(), cwd=work, start_new_session=True
        )
        try:
            ready = _wait_ready(stamp_dir, [proc])
            snapshot = tree(proc.pid)[1:] if ready else []
            result["ready"] = ready
            result["ready_s"] = time.time() - launched
            result["processes_seen"] = len(snapshot)
            try:
                code: int | None = proc.wait(timeout=EXIT_TIMEOUT)
            except subprocess.TimeoutExpired:
                code = None
            exited = time.time()
            at_exit = alive(snapshot)
            tagged = job_processes(job_id)
            gone = _wait_gone(snapshot, 15.0) if at_exit else exited
        finally:
            kill_popen(proc)
    failed_at = read_stamp(stamp_dir / f"exit-{FAIL_RANK}")
    result.update(
        {
            "exit_code": code,
            "survivors_at_exit": len(at_exit) + len(tagged),
            "survivors": _describe(at_exit) + [str(t) for t in tagged],
            "teardown_s": exited - failed_at if failed_at else None,
            "all_gone_s": max(exited, gone) - failed_at if failed_at and gone else None,
        }
    )
    with contextlib.suppress(OSError, ValueError, KeyError, IndexError):
        doc = json.loads((run_dir / job_id / "result.json").read_text())
        cause = doc["failures"][0]
        result["root_cause"] = {"host": cause["host"], "rank": cause["rank"], "code": cause["code"]}
    if code != FAIL_CODE or "root_cause" not in result:
        result["stderr_tail"] = output_tail(work / "corral.err")
    return result


def check_run(runs: Runs, label: str, res: dict[str, Any]) -> None:
    """One corral run: exit code 7, rank 1 named as the root cause, a teardown time."""
    runs.check(
        label,
        res["argv"],
        res["exit_code"],
        expect_code=FAIL_CODE,
        output=res.get("stderr_tail"),
        timings={"teardown time (the failing rank's exit stamp)": res["teardown_s"]},
        cause=res.get("root_cause"),
        expect_cause={"rank": FAIL_RANK},
    )


def _rank_env(rank: int, port: int) -> dict[str, str]:
    env = bench_env()
    env.update(
        {
            "RANK": str(rank),
            "LOCAL_RANK": str(rank % NPROC),
            "WORLD_SIZE": str(WORLD),
            "LOCAL_WORLD_SIZE": str(NPROC),
            "NODE_RANK": str(rank // NPROC),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
        }
    )
    return env


def _torchrun_argv(node_rank: int, port: int, rdzv_id: str) -> list[str]:
    return [
        PYTHON,
        "-m",
        "torch.distributed.run",
        f"--nnodes={NODES}",
        f"--nproc-per-node={NPROC}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint=127.0.0.1:{port}",
        f"--rdzv-id={rdzv_id}",
        f"--rdzv-conf=is_host={1 if node_rank == 0 else 0}",
        "--max-restarts=0",
        "--monitor-interval=0.1",
        "--local-addr=127.0.0.1",
    ]


def run_baseline(work: Path, launcher: str, mode: str, round_no: int) -> dict[str, Any]:
    """The same processes started by hand; first exit -> SIGTERM to the rest."""
    stamp_dir = work / "stamps"
    stamp_dir.mkdir(parents=True)
    port = free_port()
    args = _script_args(stamp_dir, mode)
    procs: list[subprocess.Popen[bytes]] = []
    result: dict[str, Any] = {}
    with open(work / "baseline.log", "wb") as sink:
        try:
            if launcher == "python":
                for rank in range(WORLD):
                    procs.append(
                        subprocess.Popen(
                            [PYTHON, "-u", str(SCRIPT), *args],
                            stdout=sink,
                            stderr=sink,
                            env=_rank_env(rank, port),
                            cwd=work,
                            start_new_session=True,
                        )
                    )
            else:
                rdzv_id = f"bench-teardown-baseline-{round_no}-{os.getpid()}"
                for node_rank in range(NODES):
                    procs.append(
                        subprocess.Popen(
                            [*_torchrun_argv(node_rank, port, rdzv_id), str(SCRIPT), *args],
                            stdout=sink,
                            stderr=sink,
                            env=bench_env(),
                            cwd=work,
                            start_new_session=True,
                        )
                    )
            ready = _wait_ready(stamp_dir, procs)
            snapshot = [p for proc in procs for p in tree(proc.pid)]
            result["ready"] = ready
            deadline = time.monotonic() + EXIT_TIMEOUT
            while time.monotonic() < deadline and all(p.poll() is None for p in procs):
                time.sleep(POLL)
            noticed = time.time()
            for proc in procs:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGTERM)
            gone = _wait_gone(snapshot, 30.0)
            for proc in procs:
                proc.wait(timeout=10)
        finally:
            for proc in procs:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)
                kill_popen(proc)
    failed_at = read_stamp(stamp_dir / f"exit-{FAIL_RANK}")
    result["noticed_s"] = noticed - failed_at if failed_at else None
    result["teardown_s"] = gone - failed_at if failed_at and gone else None
    return result


def bare_python(runs: int) -> list[float]:
    """Seconds for ``python -c pass`` to start and exit."""
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run([PYTHON, "-c", "pass"], check=False)
        times.append(time.perf_counter() - start)
    return times


def main(argv: list[str] | None = None) -> int:
    """Run every configuration, write ``results/teardown.json``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="rounds of python/sleep")
    parser.add_argument("--torchrun-runs", type=int, default=3, help="rounds of torchrun/sleep")
    parser.add_argument("--gloo-runs", type=int, default=3, help="rounds of the gloo configuration")
    args = parser.parse_args(argv)
    exit_on_sigterm()
    configs = [
        (launcher, mode, n)
        for launcher, mode, n in [
            ("python", "sleep", args.runs),
            ("torchrun", "sleep", args.torchrun_runs),
            ("python", "gloo", args.gloo_runs),
        ]
        if n > 0
    ]
    checked = Runs()
    log(f"teardown: {configs}; corral via {corral_cli()[1]}")
    top = Path(tempfile.mkdtemp(prefix="corral-bench-teardown-"))
    samples: dict[str, dict[str, list[dict[str, Any]]]] = {}
    try:
        for launcher, mode, runs in configs:
            key = f"{launcher}/{mode}"
            samples[key] = {"corral": [], "baseline": []}
            for round_no in range(runs):
                work = top / f"{launcher}-{mode}-{round_no}"
                base = run_baseline(work / "baseline", launcher, mode, round_no)
                samples[key]["baseline"].append(base)
                res = run_corral(work / "corral", launcher, mode, round_no)
                samples[key]["corral"].append(res)
                shutil.rmtree(work, ignore_errors=True)
                check_run(checked, f"{key} round {round_no + 1}", res)
                log(
                    f"{key} round {round_no + 1}: corral {seconds_text(res['teardown_s'])} "
                    f"(exit {res['exit_code']}, survivors {res['survivors_at_exit']}), "
                    f"plain SIGTERM {seconds_text(base['teardown_s'])}"
                )
        bare = bare_python(5)
    finally:
        shutil.rmtree(top, ignore_errors=True)

    metrics = []
    medians: dict[str, Any] = {"bare_python_start_exit_s": median(bare)}
    survivors = 0
    wrong = 0
    all_met = True
    for key, runs_of in samples.items():
        corral_s = median(r["teardown_s"] for r in runs_of["corral"])
        gone_s = median(r["all_gone_s"] for r in runs_of["corral"])
        base_s = median(r["teardown_s"] for r in runs_of["baseline"])
        medians[key] = {
            "corral_teardown_s": corral_s,
            "corral_all_gone_s": gone_s,
            "baseline_teardown_s": base_s,
        }
        survivors += sum(r["survivors_at_exit"] for r in runs_of["corral"])
        wrong += sum(
            1
            for r in runs_of["corral"]
            if r["exit_code"] != FAIL_CODE or (r.get("root_cause") or {}).get("rank") != FAIL_RANK
        )
        met = corral_s is not None and corral_s <= TARGET_S
        all_met = all_met and met
        metrics.append(
            metric(
                f"teardown latency, {key} (rank death -> corral exit)",
                corral_s,
                "s",
                f"<= {TARGET_S:g} s",
                met,
                baseline=base_s,
                baseline_desc="same processes by hand; first exit -> plain SIGTERM",
                ratio_value=ratio(corral_s, base_s),
            )
        )
    metrics.append(
        metric(
            "processes of the job alive at corral's exit (all runs)",
            float(survivors),
            "processes",
            "0",
            survivors == 0,
        )
    )
    metrics.append(
        metric(
            "runs with wrong exit code or root cause (all runs)",
            float(wrong),
            "runs",
            "0",
            wrong == 0,
        )
    )
    headline = medians[next(iter(samples))] if samples else {}
    for row in metrics:
        print(f"{row['metric']}: {row['value']} {row['unit']} (baseline {row['baseline']})")
    return finish(
        NAME,
        {
            "title": "Teardown latency",
            "status": "ok",
            "config": {
                "hosts": f"local:{NODES}",
                "nproc_per_node": NPROC,
                "fail_rank": FAIL_RANK,
                "fail_code": FAIL_CODE,
                "grace_s": "corral default",
                "configurations": [f"{la}/{mo} x{n}" for la, mo, n in configs],
            },
            "samples": {**samples, "bare_python_start_exit_s": bare},
            "medians": medians,
            "metrics": metrics,
            "ratio": ratio(headline.get("corral_teardown_s"), headline.get("baseline_teardown_s")),
            "target": f"<= {TARGET_S:g} s, no survivors",
            "met": all_met and survivors == 0 and wrong == 0,
        },
        checked,
    )


if __name__ == "__main__":
    sys.exit(main())
