"""Semi-synchronous training over a slow link: per-step DDP vs corral's DiLoCo.

Brings up a 2-host netns testbed (real sshd; needs root and tc, exit 77 otherwise;
waits while tests or another benchmark hold it) and throttles tb2's link to
``--rate-mbit`` (default 20 Mbit/s: tc tbf on tb2's bridge-side veth, so the traffic
into tb2; a ring all-reduce of two sends the same bytes each way, so every sync and
every DDP step waits for it). Each run is ``corral run --hosts tb1,tb2 --recovery
in-place --launcher python`` of ``workloads/ft_sync_bench.py`` (one rank per group,
gloo on CPU, one torch thread; a 3-layer MLP of ``--hidden`` units, about 140 KB of
weights at 160, ``--batch-size`` examples a step in all (512: a local step is short
against the throttled all-reduce, as on Ethernet between GPU hosts), ``--steps`` steps: the same
samples in both modes), in two modes:

* **DDP**: ``sdk.fault_tolerant(sync="ddp")``: torchft's quorum and gradient
  all-reduce every step;
* **DiLoCo**: ``sync="diloco"`` with H chosen by corral (``every=None``: the groups
  measure a sync's all-reduce over the throttled link and their step time and agree
  on ``H = ceil(sync / (0.1 * step))``); DiLoCo's default outer optimizer.

Measured per run (``--seeds`` seeds per mode, alternating DDP and DiLoCo): steps/s
of group 0 from its step ``warmup`` to the last (start-up and the first quorum left
out; DiLoCo's probe syncs counted), the H chosen, and the final loss of the model on
the whole data set (DiLoCo: after a final sync). Targets (issue 33 item 4): DiLoCo's
median steps/s >= 3x DDP's; each DiLoCo seed's final loss within the seed-to-seed
spread of DDP: not above DDP's mean by more than DDP's max - min (a lower loss
meets it).

    python benchmarks/bench_diloco.py [--seeds 2] [--steps 400] [--batch-size 512]
        [--rate-mbit 20]
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from benchlib import (
    PYTHON,
    ROOT,
    Runs,
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

NAME = "diloco"
HOSTS = ("tb1", "tb2")
WORKLOAD = str(ROOT / "benchmarks" / "workloads" / "ft_sync_bench.py")
SPEEDUP_TARGET = 3.0
RUN_TIMEOUT = 240.0
STEPS_RE = re.compile(r"\[tb1:0\] steps (\d+) in (\d+\.\d+) s")
EVERY_RE = re.compile(r"\[tb1:0\] every (\d+) syncs (\d+)")
LOSS_RE = re.compile(r"\[(tb\d):0\] final loss (\d+\.\d+)")
CHOSEN_RE = re.compile(r"\[tb1:0\] corral: diloco syncs every \d+ steps \(a sync's all-reduce "
                       r"(\d+\.\d+) ms, a local step (\d+\.\d+) ms")  # fmt: skip


def _skip(reason: str) -> int:
    print(f"skipped: {reason}")
    write_result(NAME, {"status": "skipped", "reason": reason})
    return 77


def _workload_args(args: argparse.Namespace, seed: int) -> list[str]:
    return [
        "--steps", str(args.steps), "--batch-size", str(args.batch_size),
        "--hidden", str(args.hidden), "--seed", str(seed),
    ]  # fmt: skip


def run_mode(
    tb: Any, work: Path, args: argparse.Namespace, mode: str, seed: int, runs: Runs
) -> dict[str, Any]:
    """One ``corral run`` of the workload on both hosts; its figures."""
    job = f"diloco-{mode}-{seed}"
    argv = [
        *corral_cli()[0],
        *("run", "--hosts", str(work / "hosts"), "--ssh-config", str(tb.ssh_config)),
        *("--python", PYTHON, "--launcher", "python", "--recovery", "in-place"),
        *("--no-preflight", "--master-port", "0", "--workdir", str(ROOT)),
        *("--run-dir", str(work / "runs"), "--job-id", job, "--"),
        WORKLOAD,
        *("--sync", mode, *_workload_args(args, seed)),
    ]
    began = time.monotonic()
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, env=bench_env(), cwd=work, timeout=RUN_TIMEOUT
        )
        code: int | None = done.returncode
        out = done.stdout + done.stderr
    except subprocess.TimeoutExpired as exc:
        code, out = None, str(exc.stdout or "") + str(exc.stderr or "")
    wall = time.monotonic() - began
    steps = STEPS_RE.search(out)
    every = EVERY_RE.search(out)
    losses = {host: float(v) for host, v in LOSS_RE.findall(out)}
    chosen = CHOSEN_RE.search(out)
    rate = int(steps.group(1)) / float(steps.group(2)) if steps else None
    problems = []
    if len(losses) != 2:
        problems.append(f"final loss of {sorted(losses)} only")
    elif abs(losses["tb1"] - losses["tb2"]) > 1e-6:
        problems.append(f"the groups ended with different models: {losses}")
    left = len(job_processes(job))
    if left:
        problems.append(f"{left} job process(es) left")
    runs.check(
        f"{mode} seed {seed}",
        argv,
        code,
        output=out,
        timings={"steps per second": rate},
        problems=problems,
    )
    result = {
        "mode": mode,
        "seed": seed,
        "exit_code": code,
        "wall_s": wall,
        "steps_per_s": rate,
        "every": int(every.group(1)) if every else None,
        "syncs": int(every.group(2)) if every else None,
        "final_loss": losses.get("tb1"),
        "sync_ms": float(chosen.group(1)) if chosen else None,
        "step_ms": float(chosen.group(2)) if chosen else None,
    }
    log(
        f"{mode} seed {seed}: {rate and round(rate, 2)} steps/s, H {result['every']}, "
        f"final loss {result['final_loss']} (wall {wall:.1f} s)"
    )
    return result


def main(argv: list[str] | None = None) -> int:
    """Bring up the testbed, throttle tb2, run both modes, write ``results/diloco.json``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--batch-size", type=int, default=512)
    parser.add_argument("--hidden", type=int, default=160)
    parser.add_argument("--rate-mbit", type=float, default=20.0)
    args = parser.parse_args(argv)
    exit_on_sigterm()
    from corral.testbed import Testbed, exclusive, missing_requirements

    problems = missing_requirements()
    if problems:
        return _skip("; ".join(problems))
    if shutil.which("tc") is None:
        return _skip("tc (iproute2) not installed")
    top = shared_tmpdir("corral-bench-diloco-")
    (top / "hosts").write_text("".join(f"{h} slots=1\n" for h in HOSTS))
    runs = Runs()
    results: list[dict[str, Any]] = []
    with exclusive():  # waits while tests (or another benchmark) use the testbed
        leftover = Testbed.running()
        if leftover is not None:
            leftover.down()
        tb = Testbed(top / "testbed")
        try:
            tb.up(len(HOSTS))
            veth = tb.host(HOSTS[1]).veth
            tbf = ["tc", "qdisc", "replace", "dev", veth, "root", "tbf"]
            rate = ["rate", f"{args.rate_mbit:g}mbit", "burst", "32kb", "latency", "400ms"]
            subprocess.run([*tbf, *rate], check=True)
            try:
                for seed in range(args.seeds):
                    order = ("ddp", "diloco") if seed % 2 == 0 else ("diloco", "ddp")
                    for mode in order:
                        results.append(run_mode(tb, top, args, mode, seed, runs))
            finally:
                subprocess.run(["tc", "qdisc", "del", "dev", veth, "root"], check=False)
        finally:
            tb.down()
            shutil.rmtree(top, ignore_errors=True)
    return _report(args, results, runs)


def _report(args: argparse.Namespace, results: list[dict[str, Any]], runs: Runs) -> int:
    ddp = [r for r in results if r["mode"] == "ddp"]
    diloco = [r for r in results if r["mode"] == "diloco"]
    ddp_rate = median(r["steps_per_s"] for r in ddp)
    diloco_rate = median(r["steps_per_s"] for r in diloco)
    speedup = ratio(diloco_rate, ddp_rate)
    ddp_losses = [r["final_loss"] for r in ddp if r["final_loss"] is not None]
    diloco_losses = [r["final_loss"] for r in diloco if r["final_loss"] is not None]
    spread = max(ddp_losses) - min(ddp_losses) if len(ddp_losses) > 1 else None
    mean_ddp = sum(ddp_losses) / len(ddp_losses) if ddp_losses else None
    # how much worse than DDP's mean (negative: better)
    worst = (
        max(v - mean_ddp for v in diloco_losses) if diloco_losses and mean_ddp is not None else None
    )
    speed_met = speedup is not None and speedup >= SPEEDUP_TARGET
    loss_met = worst is not None and spread is not None and worst <= spread
    every = median(r["every"] for r in diloco)
    metrics = [
        metric(
            f"DiLoCo steps/s, tb2's link at {args.rate_mbit:g} Mbit/s (H chosen by corral)",
            diloco_rate,
            "steps/s",
            f">= {SPEEDUP_TARGET:g}x DDP",
            speed_met,
            baseline=ddp_rate,
            baseline_desc="per-step DDP (torchft quorum + all-reduce every step), same link",
            ratio_value=speedup,
        ),
        metric(
            f"final loss after {args.steps} steps x {args.batch_size} samples: DiLoCo's "
            "worst seed minus DDP's mean (negative: lower than DDP's)",
            worst,
            "",
            "<= DDP's seed-to-seed spread",
            loss_met,
            baseline=spread,
            baseline_desc=f"DDP's spread over {len(ddp_losses)} seeds (max - min)",
        ),
        metric("H chosen by corral (median)", every, "steps", "-", None),
    ]
    code = finish(
        NAME,
        {
            "title": f"DiLoCo vs per-step DDP over a {args.rate_mbit:g} Mbit/s link (2 hosts)",
            "status": "ok",
            "config": {
                "hosts": list(HOSTS),
                "rate_mbit": args.rate_mbit,
                "steps": args.steps,
                "global_batch": args.batch_size,
                "hidden": args.hidden,
                "seeds": args.seeds,
                "workload": ["benchmarks/workloads/ft_sync_bench.py", *_workload_args(args, 0)],
            },
            "samples": results,
            "medians": {
                "ddp_steps_per_s": ddp_rate,
                "diloco_steps_per_s": diloco_rate,
                "speedup": speedup,
                "every": every,
                "ddp_final_losses": ddp_losses,
                "diloco_final_losses": diloco_losses,
            },
            "metrics": metrics,
            "ratio": speedup,
            "target": f">= {SPEEDUP_TARGET:g}x, loss within DDP's seed spread",
            "met": speed_met and loss_met,
        },
        runs,
    )
    print(
        f"DDP {ddp_rate} steps/s, DiLoCo {diloco_rate} steps/s (H {every}) -> {speedup}x; "
        f"final loss DDP {ddp_losses}, DiLoCo {diloco_losses}"
    )
    return code


if __name__ == "__main__":
    raise SystemExit(main())
