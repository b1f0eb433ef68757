"""What a synchronous checkpoint replica costs a save (3-host netns testbed; needs
root, exit 77 otherwise; waits while tests hold the testbed).

The training example (``examples/train_ddp.py``, gloo, ``--launcher python``, one
rank per host, ``--ballast-mb 200`` so each checkpoint is about 200 MB,
``--steps 20 --checkpoint-every 5 --log-every 1 --sleep-per-step 0.1``,
checkpoints in each host's private ``/srv/corral``) runs ``--runs`` times
without and with ``--replicate-checkpoints``. With it, rank 0's save returns
only once the coordinator's replica holds the checkpoint (copied over SSH from
the sender corral keeps running on tb1).

Per save: the time it added to its step (the gap from ``step k/`` to
``step k+1/`` after a save, minus the median gap between other steps). Baseline:
the same save without a replica, in the same run of this benchmark. Also the
copy's throughput: checkpoint size / (time with replica - time without).

    python benchmarks/bench_replica.py [--runs 2] [--ballast-mb 200]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from bench_faults import (
    RUN_TIMEOUT,
    Corral,
    _cleanup,
    _corral_args,
    _save_extra,
    _steps_in,
    _train_args,
    _wait_job_gone,
)
from benchlib import (
    Runs,
    exit_on_sigterm,
    finish,
    log,
    median,
    metric,
    ratio,
    shared_tmpdir,
    write_result,
)

NAME = "replica"
STEPS = 20
EVERY = 5


def _skip(reason: str) -> int:
    print(f"skipped: {reason}")
    write_result(NAME, {"status": "skipped", "reason": reason})
    return 77


def one_run(tb: Any, top: Path, replicate: bool, run_no: int, ballast_mb: float) -> dict[str, Any]:
    """One training job; what each rank-0 save added to its step."""
    tag = "replicated" if replicate else "local"
    work = top / f"{tag}-{run_no}"
    work.mkdir(parents=True)
    job = f"bench-replica-{tag}-{run_no}-{os.getpid()}"
    extra = ["--replicate-checkpoints"] if replicate else []
    train = _train_args(
        None,
        "--steps",
        str(STEPS),
        "--checkpoint-every",
        str(EVERY),
        "--ballast-mb",
        f"{ballast_mb:g}",
    )
    run = Corral([*_corral_args(tb, work, job, *extra), "--", *train], work)
    code = run.finish(RUN_TIMEOUT)
    result: dict[str, Any] = {
        "job_id": job,
        "replicate": replicate,
        "exit_code": code,
        "save_extra_s": _save_extra(run.lines, None, EVERY),
        "argv": run.argv,
    }
    if code != 0:
        result["stderr_tail"] = run.lines.tail("err", 15)
    replica = work / "runs" / job / "checkpoints"
    kept = _steps_in(replica.glob("ckpt-*.pt")) if replicate else []
    if kept:
        result["checkpoint_bytes"] = (replica / f"ckpt-{kept[-1]:08d}.pt").stat().st_size
        result["replica_steps"] = kept
    if code != 0:
        result["stderr_tail"] = run.lines.tail("err")
    result["left_after_exit"] = len(_wait_job_gone(job, 30))
    return result


def main(argv: list[str] | None = None) -> int:
    """Bring up a testbed, run the jobs, take it down, write ``results/replica.json``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--ballast-mb", type=float, default=200.0)
    args = parser.parse_args(argv)
    exit_on_sigterm()
    from corral.testbed import Testbed, exclusive, missing_requirements

    problems = missing_requirements()
    if problems:
        return _skip("; ".join(problems))
    rows: dict[bool, list[dict[str, Any]]] = {False: [], True: []}
    top = shared_tmpdir("corral-bench-replica-")
    with exclusive():
        leftover = Testbed.running()
        if leftover is not None:
            leftover.down()
        tb = Testbed(top / "testbed")
        try:
            tb.up(3)
            for run_no in range(args.runs):
                for replicate in (False, True):
                    started = time.monotonic()
                    res = one_run(tb, top, replicate, run_no, args.ballast_mb)
                    res["wall_s"] = time.monotonic() - started
                    res["cleanup_killed"], res["cleanup_left"] = _cleanup(tb, res["job_id"])
                    rows[replicate].append(res)
                    log(f"{'replicated' if replicate else 'local'} run {run_no + 1}: {res}")
        finally:
            tb.down()
            shutil.rmtree(top, ignore_errors=True)
    local = median(x for r in rows[False] for x in r["save_extra_s"])
    synced = median(x for r in rows[True] for x in r["save_extra_s"])
    size = median(r.get("checkpoint_bytes") for r in rows[True])
    copy_s = None if synced is None or local is None else synced - local
    throughput = size / copy_s / 1e6 if size and copy_s and copy_s > 0 else None
    runs = Runs()
    runs.check_records("run without a replica", rows[False])
    runs.check_records("run with the replica", rows[True])
    bad = runs.failures
    left = sum(
        int(r["left_after_exit"]) + int(r["cleanup_left"]) for rs in rows.values() for r in rs
    )
    mb = (size or 0) / 1e6
    metrics = [
        metric(
            f"rank-0 save of a {mb:.0f} MB checkpoint, time added to its step, waiting for "
            "the coordinator's replica",
            synced,
            "s",
            "report",
            None,
            baseline=local,
            baseline_desc="the same save without --replicate-checkpoints",
            ratio_value=ratio(synced, local),
        ),
        metric(
            "copy throughput to the coordinator: size / (added time - baseline) (info)",
            throughput,
            "MB/s",
            "-",
            None,
        ),
        metric(
            "failed runs / job processes left", len(bad) + left, "count", "0", not bad and not left
        ),
    ]
    status_code = finish(
        NAME,
        {
            "title": "Synchronous checkpoint replica: cost per save (3-host netns testbed)",
            "status": "ok",
            "config": {
                "runs": args.runs,
                "ballast_mb": args.ballast_mb,
                "steps": STEPS,
                "checkpoint_every": EVERY,
            },
            "samples": {"local": rows[False], "replicated": rows[True]},
            "medians": {
                "save_extra_local_s": local,
                "save_extra_replicated_s": synced,
                "checkpoint_bytes": size,
                "copy_mb_per_s": throughput,
            },
            "metrics": metrics,
            "met": not bad and not left,
        },
        runs,
    )
    print(
        f"save of {mb:.0f} MB: +{local} s without a replica, +{synced} s waiting for it "
        f"({throughput} MB/s)"
    )
    return status_code


if __name__ == "__main__":
    sys.exit(main())
