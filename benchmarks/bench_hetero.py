"""Heterogeneous split on a 2-host netns testbed: uniform vs calibrated, same run.

Brings up its own 2-host testbed (network namespaces + real sshd; needs root, exit
77 otherwise; waits while tests hold the testbed). tb2's sshd goes into a cgroup
capped at half a CPU (``corral.testbed.CpuQuota``), so everything started on tb2
over SSH (agent, rank) runs at about half speed; tb1's into one without a limit.
Both groups have the largest CPU weight, so other work on this machine does not
blur the difference. One rank per host (``--launcher python``, gloo on CPU, one
torch thread per rank), ``examples/train_ddp.py --batch-size 8192 --examples 8192
--hidden 512 --steps 60`` (about 0.13 s of data loading and forward/backward per
step on one core against a 1 MB all-reduce: compute dominates). Each repetition
(``--runs``, default 3; medians) measures:

* **calibration cost**: wall time of ``corral calibrate --hosts FILE --seconds S
  -o FILE -- examples/train_ddp.py <same args, more steps>`` (``--seconds`` 12),
  the whole command (SSH, start-up, the window, teardown);
* **training time**, uniform split (no weights) and calibrated split (the
  calibration's ``resolve_weights``, i.e. ``corral run --calibration FILE``), in
  turn (ABBA order across repetitions), through ``corral.job.engine.Job`` in this
  process: every rank's ``Progress`` events (its ``sdk.report`` per step: loss,
  examples, busy) timestamped as they arrive. Training time = from the moment
  both ranks reported step 1 to the last rank's last step (59 steps; start-up and
  gloo's first step excluded);
* **loss**: the global batch loss per step (the ranks' losses weighted by their
  examples) and rank 0's final full-dataset loss (``final loss X``) of both runs.

Headline: speedup = uniform / calibrated training time (target >= 1.4x; the ideal
for speeds 1 and 0.5 is 1.5x). Also the calibration's cost and the relative
difference of the final loss (target <= 5 %, the split must not change the
result). A plot of per-rank step time and throughput over time, uniform vs
calibrated, and the loss curves, goes to ``docs/hetero-split.png`` and
``results/hetero.png``.

    python benchmarks/bench_hetero.py [--runs 3] [--steps 60] [--seconds 12] [--period-us N]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchlib import (
    PYTHON,
    RESULTS_DIR,
    ROOT,
    bench_env,
    corral_cli,
    exit_on_sigterm,
    finish,
    job_processes,
    log,
    median,
    metric,
    ratio,
    shared_tmpdir,
    write_result,
)

NAME = "hetero"
HOSTS = ("tb1", "tb2")
QUOTA = {"tb1": None, "tb2": 0.5}  # of one CPU; None: no limit
EXAMPLE = str(ROOT / "examples" / "train_ddp.py")
BATCH = 8192  # global batch = the data set (--examples): one step is one epoch
HIDDEN = 512  # the MLP's width: ~0.13 s of compute per step on one core against a
# 1 MB all-reduce, so compute dominates the per-step overheads
PERIOD_US = 20_000  # the quota's period: throttling spread over the ~20-30 ms steps
SMOOTH = 5  # the plot's step time and throughput: means over this many steps
SPEEDUP_TARGET = 1.4
LOSS_TARGET = 0.05  # relative difference of the final loss
CAL_TIMEOUT = 240.0
RUN_TIMEOUT = 300.0
PLOT_DOC = ROOT / "docs" / "hetero-split.png"
PLOT_RESULT = RESULTS_DIR / "hetero.png"
FINAL_RE = re.compile(rb"final loss (\d+\.\d+)")


def _skip(reason: str) -> int:
    print(f"skipped: {reason}")
    write_result(NAME, {"status": "skipped", "reason": reason})
    return 77


def _train_args(steps: int) -> list[str]:
    return [
        "--steps", str(steps), "--batch-size", str(BATCH), "--hidden", str(HIDDEN),
        "--examples", str(BATCH),
        "--checkpoint-every", "0",
    ]  # fmt: skip


# -- calibration ------------------------------------------------------------------------


def calibrate(tb: Any, work: Path, hostfile: Path, rep: int, seconds: float) -> dict[str, Any]:
    """``corral calibrate`` of the example on both hosts: its wall time and result."""
    import json

    out = work / f"calibration-{rep}.json"
    argv = [
        *corral_cli()[0],
        "calibrate",
        "--hosts",
        str(hostfile),
        "--ssh-config",
        str(tb.ssh_config),
        "--python",
        PYTHON,
        "--nproc-per-node",
        "1",
        "--seconds",
        f"{seconds:g}",
        "--run-dir",
        str(work / "runs"),
        "--job-id",
        f"hetero-cal-{rep}",
        "-o",
        str(out),
        "--",
        EXAMPLE,
        *_train_args(10**7),  # runs until corral stops it
    ]
    began = time.monotonic()
    done = subprocess.run(
        argv, capture_output=True, text=True, env=bench_env(), timeout=CAL_TIMEOUT, cwd=work
    )
    wall = time.monotonic() - began
    if done.returncode != 0:
        raise RuntimeError(f"corral calibrate failed ({done.returncode}): {done.stderr[-2000:]}")
    cal = json.loads(out.read_text())["hardware_calibration"]
    return {
        "wall_s": wall,
        "file": str(out),
        "rates": cal["measured_performance"],
        "shares": cal["workload_distribution"],
        "notes": cal["calibration_notes"],
    }


# -- one training run -------------------------------------------------------------------


async def _run_job(tb: Any, work: Path, job_id: str, steps: int, weights: Sequence[float]) -> Any:
    from corral.cluster import load_cluster
    from corral.job.engine import Job
    from corral.job.events import JobEvent, Progress
    from corral.job.options import CheckPolicy
    from corral.plan.spec import JobSpec
    from corral.transport.options import SshOptions

    spec = JobSpec(
        script=EXAMPLE,
        args=tuple(_train_args(steps)),
        launcher="python",
        job_id=job_id,
        python=PYTHON,
        nproc_per_node=1,
        master_port=0,
        workdir=str(ROOT),
        timeout=RUN_TIMEOUT,
        run_dir=str(work / "runs"),
        workload_weights=tuple(weights),
    )
    job = Job(
        spec,
        load_cluster(str(work / "hosts")),
        ssh=SshOptions(config=str(tb.ssh_config)),
        checks=CheckPolicy(enabled=False),
    )
    progress: list[dict[str, Any]] = []

    def on_event(event: JobEvent) -> None:
        if isinstance(event, Progress) and event.step is not None:
            progress.append(
                {"t": event.time, "rank": event.rank, "host": event.host, "step": event.step}
                | {k: event.metrics.get(k) for k in ("loss", "examples", "busy")}
            )

    job.subscribe(on_event)
    began = time.time()
    result = await job.run()
    return result, progress, time.time() - began


def train(tb: Any, work: Path, job_id: str, steps: int, weights: Sequence[float]) -> dict[str, Any]:
    """One run of the example; its per-rank step series and summary figures."""
    result, progress, wall = asyncio.run(_run_job(tb, work, job_id, steps, weights))
    state = str(getattr(result.state, "value", result.state))
    if result.exit_code != 0:
        raise RuntimeError(f"{job_id} ended {state} (exit {result.exit_code})")
    ranks: dict[int, list[dict[str, Any]]] = {}
    for item in progress:
        ranks.setdefault(int(item["rank"]), []).append(item)
    series = {r: sorted(items, key=lambda i: int(i["step"])) for r, items in ranks.items()}
    last = {r: items[-1] for r, items in series.items()}
    if sorted(series) != [0, 1] or any(int(i["step"]) != steps for i in last.values()):
        raise RuntimeError(f"{job_id}: incomplete progress {[len(s) for s in series.values()]}")
    first_done = max(items[0]["t"] for items in series.values())
    last_done = max(i["t"] for i in last.values())
    log_file = work / "runs" / job_id / "logs" / f"{HOSTS[0]}.0.log"  # rank 0's output
    found = FINAL_RE.search(log_file.read_bytes())
    return {
        "job_id": job_id,
        "weights": list(weights),
        "train_s": last_done - first_done,
        "job_wall_s": wall,
        "final_loss": float(found.group(1)) if found else None,
        "global_loss": _global_loss(series),
        "ranks": {
            str(r): {
                "host": items[0]["host"],
                "t": [i["t"] - first_done for i in items],
                "step": [int(i["step"]) for i in items],
                "examples": [i["examples"] for i in items],
                "busy": [i["busy"] for i in items],
                "loss": [i["loss"] for i in items],
            }
            for r, items in series.items()
        },
        "left_processes": len(job_processes(job_id)),
    }


def _global_loss(series: dict[int, list[dict[str, Any]]]) -> list[float]:
    """Per step: the ranks' batch losses weighted by their examples (the global batch)."""
    by_step: dict[int, list[tuple[float, float]]] = {}
    for items in series.values():
        for i in items:
            if i["loss"] is not None and i["examples"]:
                by_step.setdefault(int(i["step"]), []).append((i["loss"], i["examples"]))
    return [
        sum(loss * n for loss, n in pairs) / sum(n for _, n in pairs)
        for _, pairs in sorted(by_step.items())
    ]


def step_times(
    rank: dict[str, Any], window: int = 1
) -> tuple[list[float], list[float], list[float]]:
    """(time, step time, examples/s) of one rank's steps after its first, each over
    ``window`` consecutive steps (reports can arrive a few at a time)."""
    t, ex = rank["t"], rank["examples"]
    ends = list(range(window, len(t), window))
    times = [(t[i] - t[i - window]) / window for i in ends]
    done = [sum(ex[i - window + 1 : i + 1]) for i in ends]
    rates = [n / (d * window) if d > 0 else float("nan") for n, d in zip(done, times, strict=True)]
    return [t[i] for i in ends], times, rates


# -- the plot ---------------------------------------------------------------------------


def plot(uniform: dict[str, Any], calibrated: dict[str, Any], runs: list[dict[str, Any]]) -> None:
    """Per-rank step time and throughput over time, uniform vs calibrated; loss curves
    and every repetition's training time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"tb1": "tab:blue", "tb2": "tab:orange"}
    fig, axes = plt.subplots(3, 2, figsize=(12, 11))
    for col, (label, run) in enumerate(
        (("uniform split", uniform), ("calibrated split", calibrated))
    ):
        for rank in run["ranks"].values():
            t, times, rates = step_times(rank, SMOOTH)
            host = rank["host"]
            cpu = "half a CPU" if QUOTA[host] else "one CPU"
            name = f"{host} ({cpu}), {rank['examples'][-1]:.0f} ex/step"
            axes[0][col].plot(
                t, [x * 1000 for x in times], ".-", ms=3, lw=0.8, color=colors[host], label=name
            )
            axes[1][col].plot(t, rates, ".-", ms=3, lw=0.8, color=colors[host], label=name)
        axes[0][col].set_title(
            f"{label}: {run['train_s']:.1f} s for {len(run['global_loss']) - 1} steps"
        )
        axes[0][col].set_ylabel(f"step time (ms, mean of {SMOOTH})")
        axes[1][col].set_ylabel(f"throughput (examples/s, mean of {SMOOTH})")
        axes[1][col].set_xlabel("time since step 1 (s)")
        for row in (0, 1):
            axes[row][col].grid(alpha=0.3)
            axes[row][col].legend(fontsize=8, loc="upper right")
            axes[row][col].set_ylim(bottom=0)
    for row in (0, 1):  # same scale both sides; a window of reports that arrived
        # together (near-zero duration) is not allowed to flatten the rest
        values = sorted(
            y for c in (0, 1) for line in axes[row][c].get_lines() for y in line.get_ydata()
        )
        top = 1.3 * values[int(0.95 * (len(values) - 1))] if values else 1.0
        for c in (0, 1):
            axes[row][c].set_ylim(0, top)
    loss_ax = axes[2][0]
    for label, run, style in (("uniform", uniform, "-"), ("calibrated", calibrated, "--")):
        loss_ax.plot(range(1, len(run["global_loss"]) + 1), run["global_loss"], style, label=label)
    loss_ax.set_yscale("log")
    loss_ax.set_xlabel("step")
    loss_ax.set_ylabel("global batch loss")
    loss_ax.set_title("loss curves (same steps, same global batch)")
    loss_ax.grid(alpha=0.3)
    loss_ax.legend()
    bar_ax = axes[2][1]
    xs = range(len(runs))
    bar_ax.bar([x - 0.2 for x in xs], [r["uniform"]["train_s"] for r in runs], 0.4, label="uniform")
    bar_ax.bar(
        [x + 0.2 for x in xs], [r["calibrated"]["train_s"] for r in runs], 0.4, label="calibrated"
    )
    for x, r in zip(xs, runs, strict=True):
        bar_ax.text(x, r["uniform"]["train_s"], f"{r['speedup']:.2f}x", ha="center", va="bottom")
    bar_ax.set_xticks(list(xs), [f"run {x + 1}" for x in xs])
    bar_ax.set_ylabel("training time (s)")
    bar_ax.set_title("every repetition (speedup = uniform / calibrated)")
    bar_ax.legend(loc="lower right")
    fig.suptitle(
        "examples/train_ddp.py on tb1 (one CPU) + tb2 (half a CPU, cgroup quota), 1 rank each, "
        f"global batch {BATCH}",
        fontsize=11,
    )
    fig.tight_layout()
    PLOT_DOC.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(PLOT_DOC, dpi=90)
    plt.close(fig)
    shutil.copyfile(PLOT_DOC, PLOT_RESULT)


# -- main -------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    """Bring up a testbed, measure, take it down, write ``results/hetero.json``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="repetitions (medians)")
    parser.add_argument("--steps", type=int, default=60, help="training steps per run")
    parser.add_argument("--seconds", type=float, default=12.0, help="calibration window")
    parser.add_argument(
        "--period-us", type=int, default=PERIOD_US, help="the CPU quota's period (microseconds)"
    )
    args = parser.parse_args(argv)
    exit_on_sigterm()
    try:
        import torch  # noqa: F401
    except ImportError:
        return _skip("torch is not installed")
    from corral.testbed import exclusive, missing_requirements

    problems = missing_requirements()
    if problems:
        return _skip("; ".join(problems))
    with exclusive():  # waits while tests (or another benchmark) use the testbed
        return _measure(args)


def _measure(args: argparse.Namespace) -> int:
    from corral.cluster import load_cluster
    from corral.testbed import CpuQuota, Testbed
    from corral.throughput.resolve import resolve_weights

    leftover = Testbed.running()
    if leftover is not None:
        leftover.down()
    top = shared_tmpdir("corral-bench-hetero-")
    hostfile = top / "hosts"
    hostfile.write_text("".join(f"{h} slots=1\n" for h in HOSTS))
    tb = Testbed(top / "testbed")
    tb.up(len(HOSTS))
    groups: list[CpuQuota] = []
    runs: list[dict[str, Any]] = []
    try:
        try:
            for host in HOSTS:
                name = f"corral-bench-{os.getpid()}-{host}"
                groups.append(CpuQuota(name, QUOTA[host], period_us=args.period_us))
                groups[-1].add(tb.sshd_pid(host))
        except OSError as exc:
            return _skip(f"cannot make a CPU-quota cgroup (needs root, cgroup cpu): {exc}")
        for rep in range(args.runs):
            cal = calibrate(tb, top, hostfile, rep, args.seconds)
            log(f"run {rep + 1}: calibration {cal['wall_s']:.1f} s, shares {cal['shares']}")
            weights = resolve_weights(cal["file"], load_cluster(str(hostfile)), 1)
            order = ("uniform", "calibrated") if rep % 2 == 0 else ("calibrated", "uniform")
            done: dict[str, Any] = {"calibration": cal}
            for kind in order:
                split = weights if kind == "calibrated" else ()
                done[kind] = train(tb, top, f"hetero-{kind}-{rep}", args.steps, split)
                log(
                    f"run {rep + 1} {kind}: {done[kind]['train_s']:.2f} s, final loss "
                    f"{done[kind]['final_loss']}"
                )
            done["speedup"] = done["uniform"]["train_s"] / done["calibrated"]["train_s"]
            runs.append(done)
    finally:
        for group in groups:
            group.close()
        tb.down()
        shutil.rmtree(top, ignore_errors=True)
    return _report(args, runs)


def _loss_diff(run: dict[str, Any], tail: int = 10) -> dict[str, float | None]:
    uni, cal = run["uniform"], run["calibrated"]
    final = (
        ratio(abs(cal["final_loss"] - uni["final_loss"]), uni["final_loss"])
        if (uni["final_loss"] is not None and cal["final_loss"] is not None)
        else None
    )
    mean_u = sum(uni["global_loss"][-tail:]) / tail
    mean_c = sum(cal["global_loss"][-tail:]) / tail
    return {"final_loss_rel": final, "last_steps_mean_rel": abs(mean_c - mean_u) / mean_u}


def _report(args: argparse.Namespace, runs: list[dict[str, Any]]) -> int:
    uni_s = median(r["uniform"]["train_s"] for r in runs)
    cal_s = median(r["calibrated"]["train_s"] for r in runs)
    # paired: each repetition runs its uniform and calibrated jobs back to back (ABBA
    # order), so the median of the pairs' speedups is less blurred by this machine's load
    # changing between repetitions than the ratio of the two medians
    speedup = median(r["speedup"] for r in runs)
    cal_cost = median(r["calibration"]["wall_s"] for r in runs)
    diffs = [_loss_diff(r) for r in runs]
    loss_diff = max(
        (d["final_loss_rel"] for d in diffs if d["final_loss_rel"] is not None), default=None
    )
    tail_diff = max(d["last_steps_mean_rel"] for d in diffs if d["last_steps_mean_rel"] is not None)
    left = sum(r[k]["left_processes"] for r in runs for k in ("uniform", "calibrated"))
    speed_met = speedup is not None and speedup >= SPEEDUP_TARGET
    loss_met = loss_diff is not None and loss_diff <= LOSS_TARGET
    shares = [r["calibration"]["shares"]["tb2"] for r in runs]
    # the plot shows the repetition with the median speedup
    mid = sorted(runs, key=lambda r: r["speedup"])[len(runs) // 2]
    plot(mid["uniform"], mid["calibrated"], runs)
    per_step = args.steps - 1
    metrics = [
        metric(
            f"training time of {per_step} steps, calibrated split (tb2 at half a CPU)",
            cal_s,
            "s",
            f"speedup >= {SPEEDUP_TARGET}x (ideal 1.5x)",
            speed_met,
            baseline=uni_s,
            baseline_desc="uniform split, same steps and global batch (ratio: median of "
            "the repetitions' paired speedups)",
            ratio_value=speedup,
        ),
        metric(
            f"calibration cost: corral calibrate --seconds {args.seconds:g}, whole command",
            cal_cost,
            "s",
            "report",
            None,
        ),
        metric(
            "final full-dataset loss, calibrated vs uniform: max relative difference",
            loss_diff,
            "",
            f"<= {LOSS_TARGET:.0%}",
            loss_met,
        ),
        metric(
            "tb2's measured share of the work (median; ideal 0.333)",
            median(shares),
            "",
            "-",
            None,
        ),
        metric("job processes left on any host", left, "count", "0", left == 0),
    ]
    for r in runs:  # the plot has the series; keep the JSON readable
        for kind in ("uniform", "calibrated"):
            for rank in r[kind]["ranks"].values():
                _, times, _ = step_times(rank)
                rank["median_step_s"] = median(times)
                rank["median_busy_s"] = median(b for b in rank["busy"] if b is not None)
                rank["examples_per_step"] = rank["examples"][-1]
                for key in ("t", "step", "examples", "busy", "loss"):
                    del rank[key]
    status_code = finish(
        NAME,
        {
            "title": "Heterogeneous split: uniform vs calibrated (tb2 at half a CPU)",
            "status": "ok",
            "config": {
                "hosts": list(HOSTS),
                "quota_cpus": QUOTA,
                "runs": args.runs,
                "steps": args.steps,
                "global_batch": BATCH,
                "calibration_seconds": args.seconds,
                "quota_period_us": args.period_us,
                "script": ["examples/train_ddp.py", *_train_args(args.steps)],
                "plot": [str(PLOT_DOC.relative_to(ROOT)), str(PLOT_RESULT.relative_to(ROOT))],
            },
            "samples": {"runs": runs, "loss_differences": diffs},
            "medians": {
                "uniform_train_s": uni_s,
                "calibrated_train_s": cal_s,
                "speedup": speedup,
                "paired_speedup": median(r["speedup"] for r in runs),
                "calibration_wall_s": cal_cost,
                "tb2_share": median(shares),
                "last_steps_loss_rel_max": tail_diff,
            },
            "metrics": metrics,
            "ratio": speedup,
            "target": f">= {SPEEDUP_TARGET}x",
            "met": speed_met,
        },
    )
    print(f"uniform {uni_s:.2f} s, calibrated {cal_s:.2f} s -> speedup {speedup:.2f}x")
    print(f"calibration {cal_cost:.1f} s; final loss differs by at most {loss_diff}")
    return status_code


if __name__ == "__main__":
    sys.exit(main())
