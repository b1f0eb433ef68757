"""Across SSH hosts (the netns testbed): launch latency and teardown latency.

Brings up its own 2-host testbed (network namespaces + real sshd; needs root,
exit 77 otherwise; waits while tests hold the testbed) and measures:

* **launch**: time to the first training step (``workloads/first_step.py``: gloo
  init + one allreduce) under ``corral run --launcher torchrun`` on tb1+tb2 vs
  the same two torchrun commands started by hand, each through its own
  ``ssh -F ssh_config tbN`` (the way people do it today), in ABBA order;
  target: the median of the rounds' ratios corral / by hand <= 1.05x.
* **teardown**: ``workloads/teardown_job.py`` on tb1+tb2 (python launcher, 2
  ranks each); rank 2 (on tb2) exits 7 at a recorded time; measured until
  ``corral run`` has exited, then every process of the job must be gone on
  both hosts (the testbed shares the PID namespace, so psutil sees them);
  target <= 5 s.

    python benchmarks/bench_ssh.py [--rounds 4] [--runs 3]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchlib import (
    PYTHON,
    WORKLOADS,
    Runs,
    bench_env,
    corral_cli,
    exit_on_sigterm,
    finish,
    job_processes,
    kill_popen,
    log,
    median,
    metric,
    output_tail,
    ratio,
    read_stamp,
    shared_tmpdir,
    write_result,
)

NAME = "ssh"
HOSTS = ("tb1", "tb2")
LAUNCH_TARGET = 1.05  # issue 34: the median of the paired rounds
TEARDOWN_TARGET_S = 5.0
TIMEOUT = 120.0
PORT = 29555


def _skip(reason: str) -> int:
    print(f"skipped: {reason}")
    write_result(NAME, {"status": "skipped", "reason": reason})
    return 77


def _hostfile(work: Path, slots: int) -> Path:
    path = work / "hosts"
    path.write_text("".join(f"{h} slots={slots}\n" for h in HOSTS))
    return path


def by_hand(tb: Any, work: Path, round_no: int) -> dict[str, Any]:
    """Two torchrun commands, each started over its own ssh session."""
    work.mkdir(parents=True)
    stamp = work / "first-step"
    rdzv = f"bench-ssh-{round_no}-{int(time.time())}"
    procs = []
    with open(work / "out.log", "wb") as sink:
        launched = time.time()
        for node_rank, host in enumerate(HOSTS):
            remote = (
                f"cd {work} && exec {PYTHON} -m torch.distributed.run --nnodes=2 "
                f"--nproc-per-node=1 --rdzv-backend=c10d --rdzv-endpoint=tb1:{PORT} "
                f"--rdzv-id={rdzv} --rdzv-conf=is_host={1 - min(node_rank, 1)} "
                f"--max-restarts=0 --monitor-interval=0.1 --local-addr={host} "
                f"{WORKLOADS / 'first_step.py'} {stamp}"
            )
            procs.append(
                subprocess.Popen(
                    ["ssh", "-F", str(tb.ssh_config), "-o", "BatchMode=yes", host, remote],
                    stdout=sink,
                    stderr=sink,
                    stdin=subprocess.DEVNULL,
                )
            )
        try:
            codes: list[int | None] = [p.wait(timeout=TIMEOUT) for p in procs]
        except subprocess.TimeoutExpired:
            codes = [None] * len(procs)
        finally:
            for proc in procs:
                kill_popen(proc)
    stepped = read_stamp(stamp)
    result = {
        "first_step_s": stepped - launched if stepped else None,
        "exit_codes": codes,
        "argv": procs[0].args if procs else [],
    }
    if stepped is None or any(c != 0 for c in codes):
        result["output_tail"] = output_tail(work / "out.log")
    return result


def with_corral(tb: Any, work: Path) -> dict[str, Any]:
    """One ``corral run --launcher torchrun`` over SSH."""
    work.mkdir(parents=True)
    stamp = work / "first-step"
    cli, _ = corral_cli()
    argv = [
        *cli,
        "run",
        "--hosts",
        str(_hostfile(work, 1)),
        "--ssh-config",
        str(tb.ssh_config),
        "--launcher",
        "torchrun",
        "--master-port",
        str(PORT),
        "--run-dir",
        str(work / "runs"),
        "--",
        str(WORKLOADS / "first_step.py"),
        str(stamp),
    ]
    with open(work / "out.log", "wb") as sink:
        launched = time.time()
        proc = subprocess.Popen(argv, stdout=sink, stderr=sink, env=bench_env(), cwd=work)
        try:
            code: int | None = proc.wait(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            code = None
        finally:
            kill_popen(proc)
    stepped = read_stamp(stamp)
    result = {
        "first_step_s": stepped - launched if stepped else None,
        "exit_codes": [code],
        "argv": argv,
    }
    if stepped is None or code != 0:
        result["output_tail"] = output_tail(work / "out.log")
    return result


def teardown(tb: Any, work: Path, run_no: int) -> dict[str, Any]:
    """Rank 2 on tb2 exits 7; time until corral exits; survivors on any host."""
    work.mkdir(parents=True)
    stamps = work / "stamps"
    stamps.mkdir()
    job = f"bench-ssh-teardown-{run_no}-{os.getpid()}"
    cli, _ = corral_cli()
    argv = [
        *cli,
        "run",
        "--hosts",
        str(_hostfile(work, 2)),
        "--ssh-config",
        str(tb.ssh_config),
        "--launcher",
        "python",
        "--master-port",
        "0",
        "--job-id",
        job,
        "--run-dir",
        str(work / "runs"),
        "--",
        str(WORKLOADS / "teardown_job.py"),
        str(stamps),
        "--fail-rank",
        "2",
        "--code",
        "7",
    ]
    with open(work / "out.log", "wb") as sink:
        proc = subprocess.Popen(argv, stdout=sink, stderr=sink, env=bench_env(), cwd=work)
        try:
            code: int | None = proc.wait(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            code = None
        ended = time.time()
        kill_popen(proc)
    died = read_stamp(stamps / "exit-2")
    survivors = job_processes(job)
    result = {
        "teardown_s": ended - died if died else None,
        "exit_code": code,
        "survivors": len(survivors),
        "argv": argv,
    }
    if code != 7 or died is None:
        result["output_tail"] = output_tail(work / "out.log")
    return result


def main(argv: list[str] | None = None) -> int:
    """Bring up a testbed, measure, take it down, write ``results/ssh.json``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args(argv)
    exit_on_sigterm()
    from corral.testbed import exclusive, missing_requirements

    problems = missing_requirements()
    if problems:
        return _skip("; ".join(problems))
    with exclusive():  # waits while tests (or another benchmark) use the testbed
        return _measure(args)


def _measure(args: argparse.Namespace) -> int:
    from corral.testbed import Testbed

    leftover = Testbed.running()
    if leftover is not None:
        leftover.down()
    top = shared_tmpdir("corral-bench-ssh-")
    tb = Testbed(top / "testbed")
    tb.up(len(HOSTS))
    hand: list[dict[str, Any]] = []
    corral: list[dict[str, Any]] = []
    downs: list[dict[str, Any]] = []
    runs = Runs()
    try:
        for round_no in range(args.rounds):
            order = ("hand", "corral") if round_no % 2 == 0 else ("corral", "hand")
            for method in order:
                work = top / f"{method}-{round_no}"
                res = by_hand(tb, work, round_no) if method == "hand" else with_corral(tb, work)
                (hand if method == "hand" else corral).append(res)
                log(f"round {round_no + 1} {method}: first step {res['first_step_s']}")
                time.sleep(1.0)  # let the rendezvous port leave TIME_WAIT quietly
        for run_no in range(args.runs):
            res = teardown(tb, top / f"teardown-{run_no}", run_no)
            downs.append(res)
            log(f"teardown run {run_no + 1}: {res}")
    finally:
        tb.down()
        shutil.rmtree(top, ignore_errors=True)
    runs.check_records("corral round", corral, timing="first_step_s")
    runs.check_records("by hand round", hand, timing="first_step_s")
    runs.check_records("teardown run", downs, expect_code=7, timing="teardown_s")
    corral_s = median(r["first_step_s"] for r in corral)
    hand_s = median(r["first_step_s"] for r in hand)
    launch_ratio = ratio(corral_s, hand_s)
    # each round's two runs are adjacent in time: less exposed to load drift
    paired = [
        ratio(c["first_step_s"], h["first_step_s"]) for c, h in zip(corral, hand, strict=True)
    ]
    down_s = median(r["teardown_s"] for r in downs)
    survivors = sum(r["survivors"] for r in downs)
    wrong = sum(r["exit_code"] != 7 for r in downs)
    paired_ratio = median(paired)  # the headline
    launch_met = paired_ratio is not None and paired_ratio <= LAUNCH_TARGET
    down_met = down_s is not None and down_s <= TEARDOWN_TARGET_S and not survivors
    metrics = [
        metric(
            "time to first step over SSH, torchrun tb1+tb2",
            corral_s,
            "s",
            f"median paired ratio <= {LAUNCH_TARGET:.2f}x",
            launch_met,
            baseline=hand_s,
            baseline_desc="same torchrun commands started by hand with ssh, in the same rounds",
            ratio_value=paired_ratio,
        ),
        metric(
            "teardown over SSH, rank on tb2 exits -> corral exit",
            down_s,
            "s",
            f"<= {TEARDOWN_TARGET_S:g} s",
            down_met,
        ),
        metric(
            "job processes left on any host / wrong exit codes",
            survivors + wrong,
            "count",
            "0",
            survivors + wrong == 0,
        ),
    ]
    status_code = finish(
        NAME,
        {
            "title": "Launch and teardown across SSH hosts (netns testbed)",
            "status": "ok",
            "config": {"hosts": list(HOSTS), "rounds": args.rounds, "teardown_runs": args.runs},
            "samples": {
                "corral": corral,
                "by_hand": hand,
                "paired_ratios": paired,
                "teardown": downs,
            },
            "medians": {
                "corral_first_step_s": corral_s,
                "by_hand_first_step_s": hand_s,
                "teardown_s": down_s,
                "paired_ratio": paired_ratio,
                "ratio_of_medians": launch_ratio,
            },
            "metrics": metrics,
            "ratio": paired_ratio,
            "target": f"launch <= {LAUNCH_TARGET:.2f}x, teardown <= {TEARDOWN_TARGET_S:g} s",
            "met": launch_met and down_met,
        },
        runs,
    )
    print(
        f"launch over SSH: corral {corral_s} s vs by hand {hand_s} s -> {launch_ratio}x "
        f"(per-round median {paired_ratio}x)"
    )
    print(f"teardown over SSH: {down_s} s, survivors {survivors}, wrong exit codes {wrong}")
    return status_code


if __name__ == "__main__":
    sys.exit(main())
