"""What ``sdk.report`` + ``sdk.section`` cost a training step, inside a live job.

``corral``'s own engine runs ``workloads/sdk_overhead.py`` on ``local:1``
(``--launcher python``, the rank's real control socket and node agent, this
process as the coordinator). The workload runs one loop body in four modes
(no SDK call, ``report`` every step, ``section`` every step, both), paced to
``--rate`` steps per second in blocks of ``--block`` steps, ``--rounds`` rounds
in a rotating order. Metrics (median over the rounds):

* **report + section, training-thread time per step** (the headline, target
  <= 5 us): the extra wall time of a block of steps in mode ``both`` over
  ``plain``, per step (mean block, so blocks slowed by the sender thread count
  too): what a step is delayed by;
* **report + section, CPU per step** (target <= 5 us): the rank process's extra
  CPU time per step, every thread counted (the sender thread's encoding and
  sends too): the whole cost, wherever it runs;
* the CPU of ``report`` and ``section`` alone (info);
* **reports lost**: every report must reach the coordinator as a ``progress``
  event, in order (target 0; the job must succeed).

    python benchmarks/bench_sdk.py [--steps 6000] [--rounds 5] [--rate 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchlib import ROOT, WORKLOADS, Runs, bench_env, finish, log, median, metric

sys.path.insert(0, str(ROOT / "src"))  # the corral of this tree, installed or not

NAME = "sdk"
WORKLOAD = WORKLOADS / "sdk_overhead.py"
TARGET_US = 5.0


def run_job(args: argparse.Namespace, tmp: Path) -> tuple[dict[str, Any], list[int], str]:
    """Run the workload as a corral job: (its samples, the steps of every progress
    event the coordinator got, the job's end state and reason)."""
    from corral.cluster.hostfile import load_cluster
    from corral.job.engine import Job
    from corral.job.events import JobEvent, Progress
    from corral.job.options import CheckPolicy
    from corral.plan.spec import JobSpec

    out = tmp / "samples.json"
    env = bench_env()
    os.environ["PYTHONPATH"] = env["PYTHONPATH"]  # the agent: this tree's corral
    spec = JobSpec(
        script=str(WORKLOAD),
        args=(
            "--out", str(out), "--steps", str(args.steps), "--rounds", str(args.rounds),
            "--block", str(args.block), "--rate", str(args.rate),
        ),
        launcher="python",
        job_id="bench-sdk",
        master_port=0,
        workdir=str(tmp),
        run_dir=str(tmp / "runs"),
        env={"PYTHONPATH": env["PYTHONPATH"]},  # the rank: this tree's corral
    )  # fmt: skip
    job = Job(spec, load_cluster("local:1"), checks=CheckPolicy(enabled=False))
    steps: list[int] = []

    def on_event(event: JobEvent) -> None:
        if isinstance(event, Progress) and isinstance(event.step, int):
            steps.append(event.step)

    job.subscribe(on_event)
    result = asyncio.run(asyncio.wait_for(job.run(), 600))
    state = f"{result.state.value}{': ' + result.reason if result.reason else ''}"
    samples = json.loads(out.read_text()) if out.exists() else {}
    if not state.startswith("succeeded"):  # the rank's last lines say why
        for log_file in sorted((tmp / "runs").glob("**/*.log")):
            tail = log_file.read_text(errors="replace").splitlines()[-10:]
            state += f"\n{log_file.name}:\n" + "\n".join(tail)
    return samples, steps, state


def per_step_us(samples: dict[str, list[dict[str, Any]]], mode: str, steps: int) -> dict[str, Any]:
    """Extra CPU and training-thread time per step of ``mode`` over ``plain``, in us,
    per round and their medians."""
    cpu = [
        (run["cpu"] - plain["cpu"]) / steps * 1e6
        for run, plain in zip(samples[mode], samples["plain"], strict=True)
    ]
    wall = [  # the mean block: a block the reporter's sends slowed counts too
        (statistics.fmean(run["blocks"]) - statistics.fmean(plain["blocks"]))
        / (steps / len(run["blocks"]))
        * 1e6
        for run, plain in zip(samples[mode], samples["plain"], strict=True)
    ]
    return {"cpu_us": cpu, "wall_us": wall, "cpu": median(cpu), "wall": median(wall)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=6000, help="steps per mode and round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--block", type=int, default=100)
    parser.add_argument("--rate", type=float, default=2000.0, help="steps per second")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="corral-bench-sdk-") as tmp:
        samples, steps, state = run_job(args, Path(tmp))
    runs = Runs()
    argv = ["corral run --hosts local:1 --launcher python --", str(WORKLOAD)]
    argv += ["--steps", str(args.steps), "--rounds", str(args.rounds), "--rate", str(args.rate)]
    ok = state.startswith("succeeded") and bool(samples)
    runs.check("the SDK job", argv, 0 if ok else 1, output=state)
    if not ok:
        doc = {"title": "SDK cost per step", "status": "failed", "reason": state.splitlines()[0]}
        return finish(NAME, doc, runs)
    reported = int(samples["reported"])
    expected = list(range(reported + 1))
    lost = len(set(expected) - set(steps))
    in_order = steps == expected
    log(f"{len(steps)} progress events for {reported + 1} reports; in order: {in_order}")
    names = ("report", "section", "both")
    modes = {m: per_step_us(samples["samples"], m, args.steps) for m in names}
    for mode, found in modes.items():
        log(f"{mode}: CPU {found['cpu_us']} us/step, training thread {found['wall_us']} us/step")
    both = modes["both"]
    cond = f"local:1, python launcher, {args.rate:g} steps/s, median of {args.rounds} rounds"
    target = f"<= {TARGET_US:g} us"
    metrics = [
        metric(
            f"sdk.report + sdk.section per step, training thread (mean block; {cond})",
            both["wall"], "us", target, both["wall"] <= TARGET_US,
        ),
        metric(
            "sdk.report + sdk.section per step, CPU of the rank (every thread: "
            "the sender's encoding and sends too)",
            both["cpu"], "us", target, both["cpu"] <= TARGET_US,
        ),
        metric("sdk.report alone, CPU (info)", modes["report"]["cpu"], "us", "-", None),
        metric("sdk.section alone, CPU (info)", modes["section"]["cpu"], "us", "-", None),
        metric(
            "reports lost or out of order on the way to the coordinator",
            float(lost + (0 if in_order else 1)), "count", "0", lost == 0 and in_order,
        ),
    ]  # fmt: skip
    met = all(m["met"] for m in metrics if m["met"] is not None)
    code = finish(
        NAME,
        {
            "title": "SDK cost per step (report + section inside a live job)",
            "status": "ok",
            "config": vars(args),
            "samples": {"per_mode": modes, "progress_events": len(steps), "reports": reported + 1},
            "medians": {m: {"cpu_us": v["cpu"], "wall_us": v["wall"]} for m, v in modes.items()},
            "metrics": metrics,
            "ratio": None,
            "target": f"<= {TARGET_US:g} us per step",
            "met": met,
        },
        runs,
    )
    print(
        f"report + section: {both['wall']:.2f} us per step on the training thread, "
        f"{both['cpu']:.2f} us of CPU in all; reports lost: {lost}"
    )
    return code or (0 if lost == 0 and in_order else 1)


if __name__ == "__main__":
    sys.exit(main())
