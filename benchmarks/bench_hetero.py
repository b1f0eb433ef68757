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
* **training time** of three arms in turn (the order rotated per repetition),
  through ``corral.job.engine.Job`` in this process: the uniform split (no
  weights); the *proportional* split (the calibration's weights alone: batches in
  proportion to the per-example rates, the split before issue 33 item 6); the
  *calibrated* split (``corral run --calibration FILE``: the weights and the step
  overheads, ``CORRAL_STEP_OVERHEADS``, so that whole step times are equal). Every
  rank's ``Progress`` events (its ``sdk.report`` per step: loss, examples, busy)
  are timestamped where they were made. Training time = from the moment both ranks
  reported step 1 to the last rank's last step (59 steps; start-up and gloo's
  first step excluded); also each run's median step (less blurred by this
  machine's load) and its *stalls* (training time - 59 median steps);
* **tb2's CPU by process**: every 0.2 s the CPU seconds of each process in tb2's
  half-CPU cgroup (sshd, corral's agent, the rank) and the group's throttled time
  (``cpu.stat``), over each run's training window: whether corral's own agent takes
  the rank's CPU inside the quota;
* **loss**: the global batch loss per step (the ranks' losses weighted by their
  examples) and rank 0's final full-dataset loss (``final loss X``) of both runs.

Headline: speedup = uniform / calibrated training time (target >= 1.4x; the ideal
for speeds 1 and 0.5 is 1.5x). Also the calibration's cost and the relative
difference of the final loss (target <= 5 %, the split must not change the
result). A plot of per-rank step time and throughput over time, uniform vs
calibrated, and the loss curves, goes to ``docs/hetero-split.png`` and
``results/hetero.png``.

    python benchmarks/bench_hetero.py [--runs 3] [--steps 60] [--seconds 12] [--period-us N]
        [--instance N]   # the testbed instance (its own lock: beside the tests' instance 0)
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import re
import shlex
import shutil
import subprocess
import sys
import threading
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
ARMS = ("uniform", "proportional", "calibrated")
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
        raise RuntimeError(
            f"corral calibrate failed ({done.returncode}): {shlex.join(argv)}\n"
            f"{done.stderr[-2000:]}"
        )
    cal = json.loads(out.read_text())["hardware_calibration"]
    return {
        "wall_s": wall,
        "file": str(out),
        "rates": cal["measured_performance"],
        "shares": cal["workload_distribution"],
        "notes": cal["calibration_notes"],
        "fixed_s": {r["host"]: r.get("step_fixed_s") for r in cal["ranks"]},
        "per_example_rates": {r["host"]: r["examples_per_s"] for r in cal["ranks"]},
    }


# -- what runs in tb2's half-CPU cgroup --------------------------------------------------


def _kind(cmdline: Sequence[str], name: str) -> str:
    """What a process of the cgroup is: the rank, corral's agent, sshd, or other."""
    line = " ".join(cmdline)
    if EXAMPLE in line:
        return "rank"
    if "corral.agent" in line:
        return "agent"
    return "sshd" if name.startswith("sshd") else "other"


class CgroupMeter:
    """Samples, every ``every`` seconds, the CPU seconds of each process in a CPU-quota
    cgroup (tb2's: its sshd and all it starts: agent, rank) and the group's throttling
    (``cpu.stat``), so a run's CPU inside the quota splits into the rank's and corral's."""

    def __init__(self, group: Any, every: float = 0.2) -> None:
        self.group, self.every = group, every
        self.samples: list[tuple[float, dict[int, tuple[str, float]], dict[str, int]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> CgroupMeter:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _stat(self, pid: int | None) -> dict[str, int]:
        """The group's ``cpu.stat`` and its network namespace's TCP retransmissions and
        retransmission timeouts (``/proc/PID/net`` is the namespace of ``pid``)."""
        out: dict[str, int] = {}
        try:
            text = (self.group.path / "cpu.stat").read_text()
            out = {k: int(v) for k, v in (line.split() for line in text.splitlines() if line)}
        except (OSError, ValueError):
            pass
        for name, keys in (("snmp", ("RetransSegs",)), ("netstat", ("TCPTimeouts",))):
            try:
                lines = Path(f"/proc/{pid}/net/{name}").read_text().splitlines()
            except OSError:
                continue
            for head, values in zip(lines[::2], lines[1::2], strict=False):
                table = dict(zip(head.split()[1:], values.split()[1:], strict=False))
                out |= {k: int(table[k]) for k in keys if k in table}
        return out

    def _loop(self) -> None:
        import psutil

        while not self._stop.is_set():
            procs: dict[int, tuple[str, float]] = {}
            for pid in self.group.pids():
                try:
                    proc = psutil.Process(pid)
                    cpu = proc.cpu_times()
                    procs[pid] = (_kind(proc.cmdline(), proc.name()), cpu.user + cpu.system)
                except psutil.Error:
                    continue
            self.samples.append((time.time(), procs, self._stat(next(iter(procs), None))))
            self._stop.wait(self.every)

    def between(self, start: float, end: float) -> dict[str, float]:
        """CPU seconds by kind from ``start`` to ``end`` (wall clock), and the group's
        throttled periods and seconds (v2 ``cpu.stat``) over the same samples."""
        inside = [s for s in self.samples if start <= s[0] <= end]
        if len(inside) < 2:
            return {}
        first, last = inside[0], inside[-1]
        out: dict[str, float] = {"seconds": last[0] - first[0]}
        for pid, (kind, cpu) in last[1].items():
            out[kind] = out.get(kind, 0.0) + cpu - first[1].get(pid, (kind, 0.0))[1]
        # cgroup v2's throttled_usec, v1's throttled_time (ns): seconds the quota held it
        scales = (
            ("nr_throttled", "cgroup_nr_throttled", 1),
            ("throttled_usec", "cgroup_throttled_s", 1e6),
            ("throttled_time", "cgroup_throttled_s", 1e9),
            ("RetransSegs", "tcp_retransmits", 1),
            ("TCPTimeouts", "tcp_timeouts", 1),
        )
        for key, name, scale in scales:
            if key in first[2] and key in last[2]:
                out[name] = (last[2][key] - first[2][key]) / scale
        return out


# -- one training run -------------------------------------------------------------------


async def _run_job(
    tb: Any, work: Path, job_id: str, steps: int, weights: Sequence[float], env: dict[str, str]
) -> Any:
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
        env=env,
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


def train(
    tb: Any,
    work: Path,
    job_id: str,
    steps: int,
    split: tuple[Sequence[float], dict[str, str]],
    meters: dict[str, CgroupMeter],
) -> dict[str, Any]:
    """One run of the example (``split``: its weights and the env of their step
    overheads); its per-rank step series, summary figures and tb2's CPU by process."""
    from corral.contract import STEP_OVERHEADS_ENV

    weights, env = split
    load = os.getloadavg()[0]
    result, progress, wall = asyncio.run(_run_job(tb, work, job_id, steps, weights, env))
    state = str(getattr(result.state, "value", result.state))
    if result.exit_code != 0:
        cause = result.root_cause
        why = f": {cause.message}" if cause is not None else ""
        raise RuntimeError(f"{job_id} ended {state} (exit {result.exit_code}){why}")
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
    # the step (both ranks done) each time: the later rank's report of it
    ends = [max(s[k]["t"] for s in series.values()) for k in range(len(series[0]))]
    steps_s = [b - a for a, b in itertools.pairwise(ends)]
    step_s = median(steps_s) or 0.0
    busy = {r: median(i["busy"] for i in s) or 1.0 for r, s in series.items()}
    # a spike: (step, how long, each rank's forward pass then over its median: a rank
    # descheduled while computing shows there, a wait in the all-reduce does not)
    spikes = [
        (series[0][k + 1]["step"], round(d, 3),
         [round((s[k + 1]["busy"] or 0.0) / busy[r], 1) for r, s in sorted(series.items())])
        for k, d in enumerate(steps_s) if d > 2 * step_s
    ]  # fmt: skip
    train_s = last_done - first_done
    return {
        "job_id": job_id,
        "weights": list(weights),
        "overheads": env.get(STEP_OVERHEADS_ENV),
        "load": [load, os.getloadavg()[0]],
        "train_s": train_s,
        "median_step_s": step_s,
        "stall_s": train_s - (len(series[0]) - 1) * step_s,
        "spikes": spikes,  # (when, how long): steps over twice the median
        "cpu": {host: m.between(first_done, last_done) for host, m in meters.items()},
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
    PLOT_RESULT.parent.mkdir(parents=True, exist_ok=True)
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
    parser.add_argument(
        "--instance", type=int, default=0, help="the testbed instance (its own lock and names)"
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
    with exclusive(args.instance):  # waits while tests (or a benchmark) use that testbed
        return _measure(args)


def _splits(cal_file: str, hostfile: Path) -> dict[str, tuple[tuple[float, ...], dict[str, str]]]:
    """The arms: uniform, the calibration's proportional weights alone (the split
    before issue 33 item 6), and with its step overheads (``corral run --calibration``)."""
    from corral.cluster import load_cluster
    from corral.throughput.resolve import overheads_env, resolve_overheads, resolve_weights

    cluster = load_cluster(str(hostfile))
    weights = resolve_weights(cal_file, cluster, 1)
    overheads = overheads_env(resolve_overheads(cal_file, cluster, 1))
    return {"uniform": ((), {}), "proportional": (weights, {}), "calibrated": (weights, overheads)}


def _measure(args: argparse.Namespace) -> int:
    from corral.testbed import CpuQuota, Testbed

    leftover = Testbed.running(args.instance)
    if leftover is not None:
        leftover.down()
    top = shared_tmpdir("corral-bench-hetero-")
    hostfile = top / "hosts"
    hostfile.write_text("".join(f"{h} slots=1\n" for h in HOSTS))
    tb = Testbed(top / "testbed", instance=args.instance)
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
        meters = {host: CgroupMeter(group) for host, group in zip(HOSTS, groups, strict=True)}
        with meters["tb1"], meters["tb2"]:
            for rep in range(args.runs):
                runs.append(_repetition(tb, top, hostfile, rep, args, meters))
    finally:
        for group in groups:
            group.close()
        tb.down()
        shutil.rmtree(top, ignore_errors=True)
    return _report(args, runs)


def _repetition(
    tb: Any,
    top: Path,
    hostfile: Path,
    rep: int,
    args: argparse.Namespace,
    meters: dict[str, CgroupMeter],
) -> dict[str, Any]:
    """One calibration and a run of every arm, in an order rotated per repetition."""
    cal = calibrate(tb, top, hostfile, rep, args.seconds)
    log(
        f"run {rep + 1}: calibration {cal['wall_s']:.1f} s, shares {cal['shares']}, "
        f"fixed step cost {cal['fixed_s']}"
    )
    splits = _splits(cal["file"], hostfile)
    order = [*ARMS[rep % len(ARMS) :], *ARMS[: rep % len(ARMS)]]
    done: dict[str, Any] = {"calibration": cal}
    for kind in order:
        done[kind] = run = train(tb, top, f"hetero-{kind}-{rep}", args.steps, splits[kind], meters)
        log(
            f"run {rep + 1} {kind}: {run['train_s']:.2f} s, median step "
            f"{run['median_step_s'] * 1000:.1f} ms, stalls {run['stall_s']:.2f} s "
            f"(spikes {run['spikes']}), final loss "
            f"{run['final_loss']}, CPU s {_cpu_text(run['cpu'])}, load {run['load']}"
        )
    for kind in ARMS[1:]:
        done[f"speedup_{kind}"] = done["uniform"]["train_s"] / done[kind]["train_s"]
        done[f"step_speedup_{kind}"] = (
            done["uniform"]["median_step_s"] / done[kind]["median_step_s"]
        )
    done["speedup"] = done["speedup_calibrated"]
    return done


def _cpu_text(cpu: dict[str, dict[str, float]]) -> str:
    return "; ".join(
        f"{host}: " + ", ".join(f"{k} {v:.2f}" for k, v in by.items()) for host, by in cpu.items()
    )


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


def _per_step(cpu: dict[str, float], kind: str, steps: int) -> float | None:
    value = cpu.get(kind)
    return None if value is None else value / steps


def _detail_metrics(runs: list[dict[str, Any]], steps: int) -> list[dict[str, Any]]:
    """Where the time goes (info rows): the split before item 6, per-step medians (less
    blurred by this machine's load than whole runs), stalls, and the CPU inside tb2's
    half-CPU quota by process (is corral's agent taking the rank's CPU?)."""
    rows = [
        metric(
            f"training time of {steps} steps, proportional split (rates only, before the "
            "fixed step cost; info)",
            median(r["proportional"]["train_s"] for r in runs),
            "s",
            "-",
            None,
            baseline=median(r["uniform"]["train_s"] for r in runs),
            baseline_desc="uniform split (ratio: median of the paired speedups)",
            ratio_value=median(r["speedup_proportional"] for r in runs),
        )
    ]
    for kind in ARMS[1:]:
        rows.append(
            metric(
                f"median step, {kind} split (info)",
                median(r[kind]["median_step_s"] for r in runs),
                "s",
                "-",
                None,
                baseline=median(r["uniform"]["median_step_s"] for r in runs),
                baseline_desc="uniform split's median step (ratio: median of the paired "
                "per-step speedups)",
                ratio_value=median(r[f"step_speedup_{kind}"] for r in runs),
            )
        )
    for kind in ARMS:
        rows.append(
            metric(
                f"stalls, {kind} split: training time - {steps} median steps (info)",
                median(r[kind]["stall_s"] for r in runs),
                "s",
                "-",
                None,
            )
        )
    for host in HOSTS:
        cpu = "half a CPU" if QUOTA[host] else "one CPU"
        for who in ("agent", "sshd", "rank", "cgroup_throttled_s"):
            values = [_per_step(r[k]["cpu"][host], who, steps) for r in runs for k in ARMS]
            if all(v is None for v in values):
                continue
            what = "time its cgroup was throttled" if who.startswith("cgroup") else f"{who} CPU"
            rows.append(
                metric(
                    f"{host} ({cpu}): {what} per step, all arms (info)",
                    median(values),
                    "s",
                    "-",
                    None,
                )
            )
        busy = [
            r[k]["cpu"][host].get("rank", 0.0) / r[k]["cpu"][host]["seconds"]
            for r in runs
            for k in ARMS
            if r[k]["cpu"][host].get("seconds")
        ]
        rows.append(
            metric(
                f"{host} ({cpu}): the rank's CPU per second of training, all arms (info)",
                median(busy),
                "CPU-s/s",
                "-",
                None,
            )
        )
    return rows


def _shown(path: Path) -> str:
    """``path`` relative to the repository where it is inside it."""
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def _report(args: argparse.Namespace, runs: list[dict[str, Any]]) -> int:
    uni_s = median(r["uniform"]["train_s"] for r in runs)
    cal_s = median(r["calibrated"]["train_s"] for r in runs)
    # paired: each repetition runs its arms back to back (order rotated), so the median
    # of the pairs' speedups is less blurred by this machine's load changing between
    # repetitions than the ratio of the two medians
    speedup = median(r["speedup"] for r in runs)
    cal_cost = median(r["calibration"]["wall_s"] for r in runs)
    diffs = [_loss_diff(r) for r in runs]
    loss_diff = max(
        (d["final_loss_rel"] for d in diffs if d["final_loss_rel"] is not None), default=None
    )
    tail_diff = max(d["last_steps_mean_rel"] for d in diffs if d["last_steps_mean_rel"] is not None)
    left = sum(r[k]["left_processes"] for r in runs for k in ARMS)
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
        *_detail_metrics(runs, per_step),
    ]
    for r in runs:  # the plot has the series; keep the JSON readable
        for kind in ARMS:
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
                "plot": [_shown(PLOT_DOC), _shown(PLOT_RESULT)],
            },
            "samples": {"runs": runs, "loss_differences": diffs},
            "medians": {
                "proportional_train_s": median(r["proportional"]["train_s"] for r in runs),
                "proportional_speedup": median(r["speedup_proportional"] for r in runs),
                "step_speedup_calibrated": median(r["step_speedup_calibrated"] for r in runs),
                "step_speedup_proportional": median(r["step_speedup_proportional"] for r in runs),
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
