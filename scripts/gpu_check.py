"""``make gpu-check``: exercise corral's GPU paths on whatever GPUs this machine has.

With N >= 1 NVIDIA GPUs (found through NVML: ``pip install 'corral[gpu]'``):

1. ``nvml``: the pre-flight's GPU health check (``corral check --json``, the ``gpu`` row);
2. ``ddp-1gpu``: ``corral run --hosts local:1 --nproc-per-node 1`` with
   ``examples/train_ddp.py`` (one rank training on CUDA: a world of one needs no
   process group);
3. ``nccl-ddp``: the same with one rank per GPU and ``--env CORRAL_BACKEND=nccl``
   (needs >= 2 GPUs: DDP's NCCL all-reduce across GPUs; NCCL refuses two ranks on
   one GPU);
4. ``fsdp2-bf16-1gpu`` / ``fsdp2-bf16``: ``examples/actors_fsdp.py --backend fsdp --bf16
   --device cuda`` through the actors backend with one worker, and with one worker per
   GPU (needs >= 2 GPUs: parameters sharded across them);
5. ``calibrate``: ``corral calibrate --json`` (the reference model on CUDA, CUDA timing);
6. ``bench-launch`` / ``bench-teardown``: ``benchmarks/bench_launch.py`` and
   ``bench_teardown.py`` (their workloads' own backend, gloo: ranks may share a GPU).

Each step ends ``ok`` (exit 0 and its figure read from its output), ``FAIL`` (a
non-zero exit, a timeout, or no figure: the reason, and the step's command and last
output lines are printed) or ``SKIPPED`` (it needs more GPUs than this machine has:
the reason is given). One summary table, then exit 1 when a step failed.

Without a GPU it says so, checks its own plumbing (the steps it would run, the NVML
probe's "no GPUs", ``corral plan`` of the NCCL run) and exits 0.

On a machine that reaches no package registry, ``--wheelhouse DIR`` (a directory of
``make wheelhouse``) first installs corral and its dependencies into this interpreter
(``pip install --no-index --find-links DIR``: never an index), the one with CUDA torch,
so that the local nodes, started with this interpreter, import the installed corral.

    python scripts/gpu_check.py [--steps 30] [--quick] [--dry-run] [--wheelhouse DIR]
"""

from __future__ import annotations

import argparse
import json
import shlex
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
TAIL_LINES = 12
TWO_NCCL = 'NCCL refuses two ranks on one GPU ("Duplicate GPU detected")'


@dataclass
class Step:
    """One command of the check, the GPUs it needs and how to read its figure."""

    name: str
    argv: list[str]
    timeout: float
    figure: Callable[[str], str] = lambda _out: ""
    min_gpus: int = 1
    needs: str = ""  # why it needs min_gpus (said when it is skipped)
    why: Callable[[str], str] = lambda _out: ""  # a failure's reason read from its stdout
    result: str = "not run"
    seconds: float = 0.0
    detail: str = ""
    tail: list[str] = field(default_factory=list)

    @property
    def failed(self) -> bool:
        """Whether the step ran and failed."""
        return self.result.startswith("FAIL")


def _gpus() -> tuple[int, str, str]:
    """``(count, card name, state)`` through NVML (state: the probe's word)."""
    try:
        from corral.agent.gpuprobe import close_nvml, open_nvml
    except ImportError:
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


def _failed_checks(out: str) -> str:
    """Why ``corral check --json`` failed: each failing check's error."""
    report = _json_tail(out) or {}
    failed = [c for c in report.get("checks", []) if c.get("status") == "fail"]
    return "; ".join(f"{c.get('name')}: {c.get('error') or c.get('summary')}" for c in failed)


def _last_line(out: str) -> str:
    lines = [ln for ln in out.strip().splitlines() if ln.strip()]
    return lines[-1][:100] if lines else ""


def _calibration(out: str) -> str:
    """``corral calibrate --json``: the calibration file, ``{"hardware_calibration":
    {"ranks": [{"examples_per_s": ...}, ...]}}``."""
    data = _json_tail(out) or {}
    data = data.get("hardware_calibration", data) if isinstance(data, dict) else {}
    ranks = data.get("ranks") or []
    found = [r.get("examples_per_s") for r in ranks if isinstance(r, dict)]
    rates: list[float] = [float(r) for r in found if isinstance(r, int | float) and r > 0]
    return f"{len(ranks)} rank(s), {min(rates):.0f}-{max(rates):.0f} examples/s" if rates else ""


def _ddp(name: str, ranks: int, train_steps: int, min_gpus: int, needs: str = "") -> Step:
    argv = [*CORRAL, "run", "--hosts", "local:1", "--nproc-per-node", str(ranks)]
    argv += ["--master-port", "0", "--env", "CORRAL_BACKEND=nccl", "--"]
    argv += ["examples/train_ddp.py", "--steps", str(train_steps), "--checkpoint-every", "0"]
    return Step(name, argv, 600, _last_line, min_gpus, needs)


def _fsdp(
    name: str, workers: int, train_steps: int, workdir: Path, min_gpus: int, needs: str = ""
) -> Step:
    argv = [PY, "examples/actors_fsdp.py", "--hosts", "local:1", "--workers-per-host"]
    argv += [str(workers), "--backend", "fsdp", "--bf16", "--device", "cuda"]
    argv += ["--steps", str(train_steps), "--checkpoint-dir", str(workdir / name)]
    return Step(name, argv, 600, _last_line, min_gpus, needs)


def steps(n: int, train_steps: int, quick: bool, workdir: Path) -> list[Step]:
    """The commands for ``n`` GPUs (n >= 1; the multi-GPU steps use max(n, 2))."""
    many = max(n, 2)
    hosts = ["--hosts", "local:1", "--nproc-per-node", str(n)]
    rounds = "1" if quick else "3"
    return [
        Step(
            "nvml",
            [*CORRAL, "check", *hosts, "--json", "--no-smoke-test"],
            120,
            _gpu_row,
            why=_failed_checks,
        ),
        _ddp("ddp-1gpu", 1, train_steps, 1),
        _ddp("nccl-ddp", many, train_steps, 2, f"one NCCL rank per GPU: {TWO_NCCL}"),
        _fsdp("fsdp2-bf16-1gpu", 1, train_steps, workdir, 1),
        _fsdp(
            "fsdp2-bf16",
            many,
            train_steps,
            workdir,
            2,
            f"parameters sharded across GPUs, one NCCL worker each: {TWO_NCCL}",
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


def run_step(step: Step, gpus: int) -> None:
    """Run one step (never raises): ``SKIPPED`` with the reason when it needs more GPUs
    than ``gpus``; else ``ok`` with its figure, or ``FAIL`` with the reason and the
    last lines of its output."""
    if gpus < step.min_gpus:
        step.result = "SKIPPED"
        step.detail = f"needs >= {step.min_gpus} GPUs ({step.needs}); this machine has {gpus}"
        return
    started = time.monotonic()
    try:
        proc = subprocess.run(
            step.argv, cwd=ROOT, capture_output=True, text=True, timeout=step.timeout, check=False
        )
    except subprocess.TimeoutExpired as exc:
        step.result, step.detail = "FAIL", f"no end within {step.timeout:g} s"
        step.tail = _tail(_text(exc.stdout) + "\n" + _text(exc.stderr))
    except OSError as exc:
        step.result, step.detail = "FAIL", str(exc)
    else:
        out = proc.stdout + "\n" + proc.stderr
        if proc.returncode != 0:
            step.result = f"FAIL (exit {proc.returncode})"
            step.detail = step.why(proc.stdout) or _last_line(out)
            step.tail = _tail(out)
        elif not (figure := step.figure(proc.stdout)):
            step.result = "FAIL (no figure)"
            step.detail = f"exit 0 but no figure in its output (last line: {_last_line(out)!r})"
            step.tail = _tail(out)
        else:
            step.result, step.detail = "ok", figure
    step.seconds = time.monotonic() - started


def _text(data: str | bytes | None) -> str:
    return data.decode(errors="replace") if isinstance(data, bytes) else data or ""


def _tail(out: str) -> list[str]:
    return [ln for ln in out.strip().splitlines() if ln.strip()][-TAIL_LINES:]


def table(rows: list[Step], title: str) -> str:
    """The summary: one line per step."""
    width = max([len(s.name) for s in rows] + [4])
    lines = [title, f"{'step':<{width}}  {'result':<16} {'seconds':>8}  figure"]
    for s in rows:
        lines.append(f"{s.name:<{width}}  {s.result:<16} {s.seconds:>8.1f}  {s.detail}")
    return "\n".join(lines)


def failures(rows: list[Step]) -> str:
    """Each failed step's command and last output lines."""
    out = []
    for s in rows:
        if s.failed:
            out.append(f"{s.name}: {s.result}: {s.detail}\n  command: {shlex.join(s.argv)}")
            out += [f"    {line}" for line in s.tail]
    return "\n".join(out)


def run_all(todo: list[Step], gpus: int, title: str) -> int:
    """Run (or skip) every step, print the table and the failures; 1 when one failed."""
    for s in todo:
        if gpus >= s.min_gpus:
            print(f"gpu-check: {s.name} ...", flush=True)
        run_step(s, gpus)
        print(f"gpu-check: {s.name} {s.result} in {s.seconds:.1f} s {s.detail}", flush=True)
    print(table(todo, title))
    failed = failures(todo)
    if failed:
        print("\ngpu-check: failed steps:\n" + failed)
    return 1 if any(s.failed for s in todo) else 0


def dry_run(train_steps: int, why: str) -> int:
    """No GPU: check the plumbing (the step list, NVML's answer, the NCCL run's plan)."""
    print(f"gpu-check: {why}: CPU dry run of the plumbing")
    with tempfile.TemporaryDirectory(prefix="corral-gpu-check-") as tmp:
        planned = steps(1, train_steps, True, Path(tmp))
        for s in planned:
            s.result = "skipped (no GPU)"
            s.detail = " ".join(Path(a).name if a == PY else a for a in s.argv)[:100]
        nvml = planned[0]
        run_step(nvml, 1)
        plan = Step(
            "plan",
            [*CORRAL, "plan", "--hosts", "local:1", "--nproc-per-node", "1", "--",
             "examples/train_ddp.py"],
            120, lambda out: f"{len(out.splitlines())} line(s) of plan",
        )  # fmt: skip
        run_step(plan, 1)
        print(table([*planned, plan], "gpu-check (dry run, no GPU):"))
        failed = failures([nvml, plan])
        if failed:
            print("\ngpu-check: failed steps:\n" + failed)
        return 0 if nvml.result == "ok" and plan.result == "ok" else 1


def install_wheelhouse(wheelhouse: Path, python: str = PY) -> None:
    """Install corral (again, whatever version is there) and its dependencies into
    ``python`` from ``wheelhouse`` alone (``--no-index``: no registry is asked).
    SystemExit with pip's reason when it cannot."""
    wheels = sorted(wheelhouse.glob("corral-*.whl"))
    if not wheels:
        raise SystemExit(f"gpu-check: no corral wheel in {wheelhouse}: run `make wheelhouse`")
    wheel = str(wheels[-1])
    # --isolated: no pip.conf or PIP_* variable adds an index or other links
    pip = [python, "-m", "pip", "--isolated", "install", "--no-index", "--find-links"]
    pip.append(str(wheelhouse))
    for argv in (
        [*pip, "--no-deps", "--force-reinstall", wheel],  # this checkout's corral
        [*pip, f"{wheel}[gpu]"],  # its dependencies and NVML's bindings
    ):
        print(f"gpu-check: {shlex.join(argv)}", flush=True)
        done = subprocess.run(argv, capture_output=True, text=True, check=False)
        if done.returncode == 0:
            continue
        why = _last_line(done.stderr) or _last_line(done.stdout)
        if "externally-managed-environment" in done.stderr + done.stdout:
            why = (
                f"{python} is externally managed (PEP 668): make a venv that sees its "
                f"torch, `{python} -m venv --system-site-packages .gpu-venv`, and run "
                "make gpu-check PYTHON=.gpu-venv/bin/python WHEELHOUSE=..."
            )
        raise SystemExit(f"gpu-check: installing from {wheelhouse} failed: {why}")
    print(f"gpu-check: corral installed into {python} from {wheelhouse} (no index)")


def main(argv: list[str] | None = None) -> int:
    """Run every step on this machine's GPUs (or the dry run) and print the summary."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=30, help="training steps of each run")
    p.add_argument("--quick", action="store_true", help="one benchmark round, short calibration")
    p.add_argument("--dry-run", action="store_true", help="the no-GPU plumbing check only")
    p.add_argument(
        "--wheelhouse",
        type=Path,
        help="install corral from this directory of `make wheelhouse` first (no index)",
    )
    args = p.parse_args(argv)
    if args.wheelhouse is not None:
        install_wheelhouse(args.wheelhouse)
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
        return run_all(todo, count, f"gpu-check on {count}x {card}:")


if __name__ == "__main__":
    sys.exit(main())
