"""``make gpu-check``: exercise corral's GPU paths on whatever GPUs this machine has.

With N >= 1 NVIDIA GPUs (found through NVML: ``pip install 'corral[gpu]'``):

1. ``nvml``: the pre-flight's GPU health check (``corral check --json``, the ``gpu`` row);
2. ``nccl-ddp``: ``corral run --hosts local:1 --nproc-per-node N`` with
   ``examples/train_ddp.py`` (NCCL, one rank per GPU; one rank with one GPU);
3. ``fsdp2-bf16``: ``examples/actors_fsdp.py --backend fsdp --bf16 --device cuda``
   through the actors backend (one worker per GPU);
4. ``calibrate``: ``corral calibrate --json`` (the reference model on CUDA, CUDA timing);
5. ``bench-launch`` / ``bench-teardown``: ``benchmarks/bench_launch.py`` and
   ``bench_teardown.py`` with one rank per GPU (their workloads' own backend);

then prints one summary table (step, result, seconds, figure) and exits 1 when a
step failed. Without a GPU it says so, checks its own plumbing (the steps it
would run, the NVML probe's "no GPUs", ``corral plan`` of the NCCL run) and exits 0.

    python scripts/gpu_check.py [--steps 30] [--quick] [--dry-run]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
CORRAL = [PY, "-m", "corral"]


@dataclass
class Step:
    """One command of the check and how to read its figure from its output."""

    name: str
    argv: list[str]
    timeout: float
    figure: Callable[[str], str] = lambda _out: ""
    result: str = "not run"
    seconds: float = 0.0
    detail: str = ""
    env: dict[str, str] = field(default_factory=dict)


def _gpus() -> tuple[int, str, str]:
    """``(count, card name, state)`` through NVML (state: the probe's word)."""
    sys.path.insert(0, str(ROOT / "src"))
    from corral.agent.gpuprobe import close_nvml, open_nvml

    nvml, state, detail = open_nvml()
    if nvml is None:
        return 0, "", detail or state
    try:
        count = nvml.count()
        name = nvml.device(0)["name"] if count else ""
        return count, name, state
    finally:
        close_nvml(nvml)


def _json_tail(out: str) -> Any:
    """The last JSON document printed (a ``--json`` output)."""
    start = out.find("{")
    while start != -1:
        try:
            return json.loads(out[start:])
        except ValueError:
            start = out.find("{", start + 1)
    return None


def _gpu_row(out: str) -> str:
    report = _json_tail(out) or {}
    row = next((c for c in report.get("checks", []) if c.get("name") == "gpu"), None)
    return "" if row is None else f"{row['status']}: {row.get('summary', '')}"


def _last_line(out: str) -> str:
    lines = [ln for ln in out.strip().splitlines() if ln.strip()]
    return lines[-1][:100] if lines else ""


def _calibration(out: str) -> str:
    data = _json_tail(out) or {}
    ranks = data.get("ranks") or []
    rates = [r.get("throughput") or r.get("examples_per_s") for r in ranks if isinstance(r, dict)]
    rates = [r for r in rates if r]
    return f"{len(ranks)} rank(s), {min(rates):.0f}-{max(rates):.0f} examples/s" if rates else ""


def steps(n: int, train_steps: int, quick: bool, workdir: Path) -> list[Step]:
    """The commands for ``n`` GPUs (n >= 1)."""
    hosts = ["--hosts", "local:1", "--nproc-per-node", str(n)]
    rounds = "1" if quick else "3"
    return [
        Step("nvml", [*CORRAL, "check", *hosts, "--json", "--no-smoke-test"], 120, _gpu_row),
        Step(
            "nccl-ddp",
            [
                *CORRAL,
                "run",
                *hosts,
                "--master-port",
                "0",
                "--",
                "examples/train_ddp.py",
                "--steps",
                str(train_steps),
                "--checkpoint-every",
                "0",
            ],
            600,
            _last_line,
        ),
        Step(
            "fsdp2-bf16",
            [
                PY,
                "examples/actors_fsdp.py",
                "--hosts",
                "local:1",
                "--workers-per-host",
                str(n),
                "--backend",
                "fsdp",
                "--bf16",
                "--device",
                "cuda",
                "--steps",
                str(train_steps),
                "--checkpoint-dir",
                str(workdir / "fsdp"),
            ],
            600,
            _last_line,
        ),
        Step(
            "calibrate",
            [
                *CORRAL,
                "calibrate",
                *hosts,
                "--seconds",
                "10" if quick else "20",
                "--json",
                "--run-dir",
                str(workdir / "runs"),
            ],
            300,
            _calibration,
        ),
        Step(
            "bench-launch",
            [PY, "benchmarks/bench_launch.py", "--rounds", rounds, "--nproc-per-node", str(n)],
            600,
            _last_line,
        ),
        Step(
            "bench-teardown",
            [
                PY,
                "benchmarks/bench_teardown.py",
                "--runs",
                rounds,
                "--torchrun-runs",
                rounds,
                "--gloo-runs",
                rounds,
            ],
            600,
            _last_line,
        ),
    ]


def run_step(step: Step) -> None:
    """Run one step (never raises): its result, time and figure."""
    started = time.monotonic()
    try:
        proc = subprocess.run(
            step.argv, cwd=ROOT, capture_output=True, text=True, timeout=step.timeout, check=False
        )
    except subprocess.TimeoutExpired:
        step.result, step.detail = "FAIL", f"no end within {step.timeout:g} s"
    except OSError as exc:
        step.result, step.detail = "FAIL", str(exc)
    else:
        out = proc.stdout + "\n" + proc.stderr
        step.result = "ok" if proc.returncode == 0 else f"FAIL (exit {proc.returncode})"
        step.detail = step.figure(proc.stdout) if proc.returncode == 0 else _last_line(out)
    step.seconds = time.monotonic() - started


def table(rows: list[Step], title: str) -> str:
    """The summary: one line per step."""
    width = max([len(s.name) for s in rows] + [4])
    lines = [title, f"{'step':<{width}}  {'result':<16} {'seconds':>8}  figure"]
    for s in rows:
        lines.append(f"{s.name:<{width}}  {s.result:<16} {s.seconds:>8.1f}  {s.detail}")
    return "\n".join(lines)


def dry_run(train_steps: int, why: str) -> int:
    """No GPU: check the plumbing (the step list, NVML's answer, the NCCL run's plan)."""
    print(f"gpu-check: {why}: CPU dry run of the plumbing")
    with tempfile.TemporaryDirectory(prefix="corral-gpu-check-") as tmp:
        planned = steps(1, train_steps, True, Path(tmp))
        for s in planned:
            s.result = "skipped (no GPU)"
            s.detail = " ".join(Path(a).name if a == PY else a for a in s.argv)[:100]
        nvml = planned[0]
        run_step(nvml)
        plan = Step(
            "plan",
            [*CORRAL, "plan", "--hosts", "local:1", "--nproc-per-node", "1", "--",
             "examples/train_ddp.py"],
            120, lambda out: f"{len(out.splitlines())} line(s) of plan",
        )  # fmt: skip
        run_step(plan)
        print(table([*planned, plan], "gpu-check (dry run, no GPU):"))
        return 0 if nvml.result == "ok" and plan.result == "ok" else 1


def main(argv: list[str] | None = None) -> int:
    """Run every step on this machine's GPUs (or the dry run) and print the summary."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=30, help="training steps of each run")
    p.add_argument("--quick", action="store_true", help="one benchmark round, short calibration")
    p.add_argument("--dry-run", action="store_true", help="the no-GPU plumbing check only")
    args = p.parse_args(argv)
    count, card, state = _gpus()
    if args.dry_run or count == 0:
        if count == 0 and state.startswith("NVML not installed") and Path("/dev/nvidia0").exists():
            print(f"gpu-check: this machine has NVIDIA devices but {state}", file=sys.stderr)
            return 2
        return dry_run(args.steps, "no GPUs on this machine" if count == 0 else "--dry-run")
    if shutil.which("nvidia-smi") is None:
        print("gpu-check: note: no nvidia-smi on PATH (NVML answers everything used here)")
    print(f"gpu-check: {count}x {card}")
    with tempfile.TemporaryDirectory(prefix="corral-gpu-check-") as tmp:
        todo = steps(count, args.steps, args.quick, Path(tmp))
        for s in todo:
            print(f"gpu-check: {s.name} ...", flush=True)
            run_step(s)
            print(f"gpu-check: {s.name} {s.result} in {s.seconds:.1f} s {s.detail}", flush=True)
    print(table(todo, f"gpu-check on {count}x {card}:"))
    return 0 if all(s.result == "ok" for s in todo) else 1


if __name__ == "__main__":
    sys.exit(main())
