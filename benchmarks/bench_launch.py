"""Launch overhead: time to the first training step, corral vs torchrun by hand.

Workload ``workloads/first_step.py``: init the gloo process group, one allreduce
(the "first step"); rank 0 records ``time.time()`` right after it in a file.

* **corral**: ``corral run --hosts local:2 --nproc-per-node 1 --launcher torchrun
  --master-port 0 -- first_step.py STAMP`` (one process, as a user types it);
* **by hand**: the same two torchrun commands started concurrently with
  ``subprocess`` (``python -m torch.distributed.run --nnodes=2 --nproc-per-node=1
  --rdzv-backend=c10d --rdzv-endpoint=127.0.0.1:PORT --rdzv-id=ID
  --rdzv-conf=is_host=1|0 --max-restarts=0 --monitor-interval=0.1
  --local-addr=127.0.0.1 first_step.py STAMP``), the flags corral's plan uses.

* **baseline** (``--baseline SRC``): ``corral run`` as above with the corral of
  ``SRC`` first on ``PYTHONPATH`` (the ``src`` folder of a checkout of the code to
  compare with, e.g. ``git worktree add /tmp/before COMMIT``: ``/tmp/before/src``),
  a third run in every round: each change is measured against the code before it
  in the same rounds, at the same load.

Time to first step = recorded timestamp - this parent's ``time.time()`` just
before starting. The CPU time of every process of the job (``RUSAGE_CHILDREN``)
is recorded too: unlike wall time it barely depends on the machine's load.
The methods alternate (ABBA order; with a baseline each round rotates the three)
for ``--rounds`` rounds each; the headline is the median of the rounds' ratios
corral / by hand (the runs of a round are adjacent in time, so load drift moves
them alike), with the medians, their ratio and the time until everything has
exited. The load average is logged before and after.

    python benchmarks/bench_launch.py [--rounds 10] [--nproc-per-node 1] [--baseline SRC]
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchlib import (
    PYTHON,
    ROOT,
    WORKLOADS,
    Runs,
    bench_env,
    corral_cli,
    exit_on_sigterm,
    finish,
    free_port,
    kill_popen,
    log,
    median,
    metric,
    output_tail,
    ratio,
    read_stamp,
    seconds_text,
)

NAME = "launch"
NODES = 2
TARGET_RATIO = 1.05  # issue 34: the median of >= 10 paired rounds
TIMEOUT = 90.0
SCRIPT = WORKLOADS / "first_step.py"


def torchrun_argv(node_rank: int, nproc: int, port: int, rdzv_id: str) -> list[str]:
    """One node's torchrun command, as typed by hand."""
    return [
        PYTHON,
        "-m",
        "torch.distributed.run",
        f"--nnodes={NODES}",
        f"--nproc-per-node={nproc}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint=127.0.0.1:{port}",
        f"--rdzv-id={rdzv_id}",
        f"--rdzv-conf=is_host={1 if node_rank == 0 else 0}",
        "--max-restarts=0",
        "--monitor-interval=0.1",
        "--local-addr=127.0.0.1",
    ]


def by_hand(work: Path, nproc: int, round_no: int) -> dict[str, Any]:
    """Two torchrun processes started concurrently."""
    work.mkdir(parents=True)
    stamp = work / "first-step"
    port = free_port()
    rdzv_id = f"bench-launch-{round_no}-{int(time.time())}"
    procs: list[subprocess.Popen[bytes]] = []
    cpu0 = children_cpu()
    with open(work / "out.log", "wb") as sink:
        launched = time.time()
        try:
            for node_rank in range(NODES):
                procs.append(
                    subprocess.Popen(
                        [*torchrun_argv(node_rank, nproc, port, rdzv_id), str(SCRIPT), str(stamp)],
                        stdout=sink,
                        stderr=sink,
                        env=bench_env(),
                        cwd=work,
                        start_new_session=True,
                    )
                )
            deadline = time.monotonic() + TIMEOUT
            codes: list[int | None] = [
                p.wait(timeout=max(0.1, deadline - time.monotonic())) for p in procs
            ]
            ended = time.time()
        except subprocess.TimeoutExpired:
            codes, ended = [None] * len(procs), time.time()
        finally:
            for proc in procs:
                kill_popen(proc)
    stepped = read_stamp(stamp)
    argv = [*torchrun_argv(0, nproc, port, rdzv_id), str(SCRIPT), str(stamp)]
    return _result(launched, stepped, ended, codes, work / "out.log", children_cpu() - cpu0, argv)


def with_corral(work: Path, nproc: int, round_no: int, src: Path | None = None) -> dict[str, Any]:
    """One ``corral run --launcher torchrun`` (``src``: with that corral source tree)."""
    work.mkdir(parents=True)
    stamp = work / "first-step"
    cli, _ = corral_cli()
    argv = [
        *cli,
        "run",
        "--hosts",
        f"local:{NODES}",
        "--nproc-per-node",
        str(nproc),
        "--launcher",
        "torchrun",
        "--master-port",
        "0",
        "--run-dir",
        str(work / "runs"),
        "--",
        str(SCRIPT),
        str(stamp),
    ]
    cpu0 = children_cpu()
    env = bench_env() if src is None else source_env(src)
    with open(work / "out.log", "wb") as sink:
        launched = time.time()
        proc = subprocess.Popen(
            argv, stdout=sink, stderr=sink, env=env, cwd=work, start_new_session=True
        )
        try:
            code: int | None = proc.wait(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            code = None
        finally:
            ended = time.time()
            kill_popen(proc)
    cpu = children_cpu() - cpu0
    return _result(launched, read_stamp(stamp), ended, [code], work / "out.log", cpu, argv)


def source_env(src: Path) -> dict[str, str]:
    """The environment with the corral of ``src`` first on ``PYTHONPATH``, not ours."""
    env = bench_env()
    ours = str(ROOT / "src")
    rest = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != ours]
    env["PYTHONPATH"] = os.pathsep.join([str(src), *rest])
    return env


def baseline_source(value: str) -> Path:
    """``--baseline``: a corral source folder (``SRC/corral/__init__.py`` exists, or
    ``SRC/src/corral``: a checkout's root), compiled as :func:`corral_cli` compiles
    ours."""
    src = Path(value).resolve()
    if not (src / "corral" / "__init__.py").is_file() and (src / "src" / "corral").is_dir():
        src = src / "src"
    if not (src / "corral" / "__init__.py").is_file():
        raise argparse.ArgumentTypeError(f"{value}: no corral package in it (give its src)")
    subprocess.run(
        [PYTHON, "-m", "compileall", "-q", "-j", "0", str(src)],
        stdout=subprocess.DEVNULL,
        check=False,
    )
    return src


def _order(round_no: int, baseline: bool) -> tuple[str, ...]:
    """The methods of round ``round_no``: ABBA, or the three rotated."""
    if not baseline:
        return ("hand", "corral") if round_no % 2 == 0 else ("corral", "hand")
    methods = ("hand", "corral", "base")
    shift = round_no % 3
    return methods[shift:] + methods[:shift]


def children_cpu() -> float:
    """CPU seconds of every reaped descendant so far (user + system)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _result(
    launched: float,
    stepped: float | None,
    ended: float,
    codes: list[int | None],
    out: Path,
    cpu: float,
    argv: list[str],
) -> dict[str, Any]:
    result: dict[str, Any] = {
        "exit_codes": codes,
        "cpu_s": cpu,
        "first_step_s": stepped - launched if stepped else None,
        "total_s": ended - launched,
        "argv": argv,
    }
    if stepped is None or any(c != 0 for c in codes):
        result["output_tail"] = output_tail(out)
    return result


def main(argv: list[str] | None = None) -> int:
    """Alternate the methods, write ``results/launch.json``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--nproc-per-node", type=int, default=1)
    parser.add_argument(
        "--baseline",
        type=baseline_source,
        metavar="SRC",
        help="corral source folder of the code to compare with, a third run each round",
    )
    args = parser.parse_args(argv)
    exit_on_sigterm()
    nproc = args.nproc_per_node
    base: Path | None = args.baseline
    load_before = os.getloadavg()
    log(
        f"launch: local:{NODES} x {nproc}, {args.rounds} rounds; corral via {corral_cli()[1]}"
        + (f"; baseline {base}" if base else "")
        + f"; load {_load(load_before)}"
    )
    top = Path(tempfile.mkdtemp(prefix="corral-bench-launch-"))
    hand_runs: list[dict[str, Any]] = []
    corral_runs: list[dict[str, Any]] = []
    base_runs: list[dict[str, Any]] = []
    runs = Runs()
    try:
        for round_no in range(args.rounds):
            for method in _order(round_no, base is not None):
                work = top / f"{method}-{round_no}"
                if method == "hand":
                    res = by_hand(work, nproc, round_no)
                    hand_runs.append(res)
                elif method == "corral":
                    res = with_corral(work, nproc, round_no)
                    corral_runs.append(res)
                else:
                    res = with_corral(work, nproc, round_no, base)
                    base_runs.append(res)
                shutil.rmtree(work, ignore_errors=True)
                log(
                    f"round {round_no + 1} {method}: "
                    f"first step {seconds_text(res['first_step_s'])},"
                    f" all exited {res['total_s']:.3f} s, {res['cpu_s']:.2f} CPU-s"
                    f" (exit {res['exit_codes']})"
                )
    finally:
        shutil.rmtree(top, ignore_errors=True)
    load_after = os.getloadavg()
    log(f"launch: load {_load(load_after)} at the end")
    # every run must have ended with 0 and rank 0 must have stamped its first step
    runs.check_records("corral round", corral_runs, timing="first_step_s")
    runs.check_records("by hand round", hand_runs, timing="first_step_s")
    runs.check_records("baseline round", base_runs, timing="first_step_s")

    corral_s = median(r["first_step_s"] for r in corral_runs)
    hand_s = median(r["first_step_s"] for r in hand_runs)
    corral_total = median(r["total_s"] for r in corral_runs)
    hand_total = median(r["total_s"] for r in hand_runs)
    corral_cpu = median(r["cpu_s"] for r in corral_runs)
    hand_cpu = median(r["cpu_s"] for r in hand_runs)
    step_ratio = ratio(corral_s, hand_s)
    # each round's two runs are adjacent in time: their ratio is less exposed to load drift
    paired = [
        ratio(c["first_step_s"], h["first_step_s"])
        for c, h in zip(corral_runs, hand_runs, strict=True)
    ]
    paired_ratio = median(paired)  # the headline: each round's two runs, then the median
    met = paired_ratio is not None and paired_ratio <= TARGET_RATIO
    metrics = [
        metric(
            f"time to first step, torchrun local:{NODES}x{nproc}",
            corral_s,
            "s",
            f"median paired ratio <= {TARGET_RATIO:.2f}x",
            met,
            baseline=hand_s,
            baseline_desc="same torchrun commands started by hand, in the same rounds",
            ratio_value=paired_ratio,
        ),
        metric(
            f"time to job end, torchrun local:{NODES}x{nproc} (info)",
            corral_total,
            "s",
            "-",
            None,
            baseline=hand_total,
            baseline_desc="same torchrun commands started by hand",
            ratio_value=ratio(corral_total, hand_total),
        ),
        metric(
            f"CPU time of the whole job, torchrun local:{NODES}x{nproc} (info)",
            corral_cpu,
            "CPU-s",
            "-",
            None,
            baseline=hand_cpu,
            baseline_desc="same torchrun commands started by hand",
            ratio_value=ratio(corral_cpu, hand_cpu),
        ),
    ]
    print(
        f"launch: first step corral {seconds_text(corral_s)}, by hand {seconds_text(hand_s)}, "
        f"per-round median ratio {_x(paired_ratio)} (ratio of the medians {_x(step_ratio)}; "
        f"target <= {TARGET_RATIO:.2f})"
    )
    compared = _against_baseline(corral_runs, hand_runs, base_runs, f"local:{NODES}x{nproc}")
    metrics += compared.pop("metrics", [])
    return finish(
        NAME,
        {
            "title": "Launch overhead",
            "status": "ok",
            "config": {
                "hosts": f"local:{NODES}",
                "nproc_per_node": nproc,
                "launcher": "torchrun",
                "rounds": args.rounds,
                "order": "rotating (by hand, corral, baseline)"
                if base
                else "ABBA (by hand first in even rounds)",
                "by_hand_argv": [*torchrun_argv(0, nproc, 0, "ID"), str(SCRIPT), "STAMP"],
                "baseline_src": str(base) if base else None,
                "load_before": _load(load_before),
                "load_after": _load(load_after),
            },
            "baseline": compared or None,
            "samples": {"corral": corral_runs, "by_hand": hand_runs, "paired_ratios": paired},
            "medians": {
                "corral_first_step_s": corral_s,
                "by_hand_first_step_s": hand_s,
                "corral_total_s": corral_total,
                "by_hand_total_s": hand_total,
                "corral_cpu_s": corral_cpu,
                "by_hand_cpu_s": hand_cpu,
                "overhead_s": corral_s - hand_s if corral_s and hand_s else None,
                "paired_ratio": paired_ratio,
                "ratio_of_medians": step_ratio,
            },
            "metrics": metrics,
            "ratio": paired_ratio,
            "target": f"<= {TARGET_RATIO:.2f}x",
            "met": met,
        },
        runs,
    )


def _against_baseline(
    corral_runs: list[dict[str, Any]],
    hand_runs: list[dict[str, Any]],
    base_runs: list[dict[str, Any]],
    what: str,
) -> dict[str, Any]:
    """The baseline's figures (empty without one): its per-round ratio to the runs by
    hand, this corral's to it, and their metrics (info rows); printed."""
    if not base_runs:
        return {}
    first = "first_step_s"
    base_s = median(r[first] for r in base_runs)
    to_hand = median(ratio(b[first], h[first]) for b, h in zip(base_runs, hand_runs, strict=True))
    to_base = median(ratio(c[first], b[first]) for c, b in zip(corral_runs, base_runs, strict=True))
    print(
        f"launch: baseline first step {seconds_text(base_s)}, per-round median ratio to by "
        f"hand {_x(to_hand)}; this corral / the baseline, per-round median {_x(to_base)}"
    )
    return {
        "samples": base_runs,
        "first_step_s": base_s,
        "cpu_s": median(r["cpu_s"] for r in base_runs),
        "paired_ratio": to_hand,
        "corral_to_baseline": to_base,
        "metrics": [
            metric(
                f"time to first step, baseline corral, torchrun {what} (info)",
                base_s,
                "s",
                "-",
                None,
                baseline=median(r[first] for r in hand_runs),
                baseline_desc="same torchrun commands started by hand, in the same rounds",
                ratio_value=to_hand,
            ),
            metric(
                f"time to first step, corral / baseline corral, torchrun {what} (info)",
                median(r[first] for r in corral_runs),
                "s",
                "-",
                None,
                baseline=base_s,
                baseline_desc="the baseline's corral run in the same rounds",
                ratio_value=to_base,
            ),
        ],
    }


def _load(values: tuple[float, float, float]) -> str:
    return " ".join(f"{v:.2f}" for v in values)


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


if __name__ == "__main__":
    sys.exit(main())
