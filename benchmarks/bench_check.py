"""The pre-flight checklist on 16 testbed hosts (netns + real sshd; needs root,
exit 77 otherwise; waits while tests hold the testbed).

Measures, median of ``--runs``:

* ``corral check --json`` end to end (the CLI process, wall clock) with every
  check including the collective smoke test (16 ranks, gloo), and without the
  smoke test; per-check and per-phase times from the report;
* a baseline in the same run: the same host-side facts gathered the way a
  hand-written pre-flight script does it, one ``ssh -F ssh_config tbK`` after
  another (OpenSSH, same program text). Ratio = corral without the smoke test /
  that loop;
* the floor of the smoke test on this machine, in the same run: every host at
  once runs ``ssh tbK python -c 'import torch.distributed'`` (one login and one
  torch import per host, which any real all-reduce needs) and nothing else.
  The testbed's hosts share this machine's CPUs, so that floor grows with the
  host count; on real hosts each import runs on its own CPUs;
* the full checklist on ``--small`` (2) of the hosts: each host's own cost,
  which is what 16 real hosts working in parallel would see;
* at scale (``--scale``, 64 hosts; 0 skips it): once, on a fresh testbed of that
  many hosts, the full checklist with the smoke test (one rank per host, gloo's
  full mesh): whether every host joined within the window sized from the measured
  torch imports, the wall time, the window and the median import time. The hosts
  share this machine's CPUs, so 64 torch imports on it take minutes.

Target: the full checklist <= 3 s wall on 16 hosts; at scale, it passes.

    python benchmarks/bench_check.py [--hosts 16] [--runs 3] [--scale 64]
    python benchmarks/bench_check.py --scale-only   # only the figure at scale, merged
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchlib import (
    Runs,
    bench_env,
    corral_cli,
    exit_on_sigterm,
    finish,
    log,
    median,
    metric,
    output_tail,
    ratio,
    shared_tmpdir,
    write_result,
)

NAME = "check"
TARGET_S = 3.0
REPO = Path(__file__).resolve().parents[1]


def _skip(reason: str) -> int:
    print(f"skipped: {reason}")
    write_result(NAME, {"status": "skipped", "reason": reason})
    return 77


def _corral_check(
    tb: Any, workdir: str, smoke: bool, hostfile: Path | None = None, timeout: float = 300.0
) -> dict[str, Any]:
    argv, _ = corral_cli()
    cmd = [
        *argv,
        "check",
        "--hosts",
        str(hostfile or tb.hostfile),
        "--ssh-config",
        str(tb.ssh_config),
        "--workdir",
        workdir,
        "--code-dir",
        workdir,
        "--checkpoint-dir",
        "/srv/corral/bench-ckpt",
        "--min-free-gb",
        "0.1",
        "--json",
    ]
    if not smoke:
        cmd.append("--no-smoke-test")
    started = time.perf_counter()
    proc = subprocess.run(
        cmd, capture_output=True, text=True, env=bench_env(), cwd=workdir, timeout=timeout
    )
    wall = time.perf_counter() - started
    try:
        report = json.loads(proc.stdout)
    except ValueError:
        tail = "\n".join(output_tail(proc.stderr or proc.stdout))
        raise RuntimeError(
            f"{shlex.join(cmd)} exited {proc.returncode} without a report:\n{tail}"
        ) from None
    return {
        "argv": cmd,
        "output_tail": output_tail(proc.stderr) if proc.returncode != 0 else [],
        "wall_s": wall,
        "exit_code": proc.returncode,
        "overall": report["overall_status"],
        "report_s": report["duration_s"],
        "phases_s": report.get("phases_s", {}),
        "checks_s": {c["name"]: c["duration_s"] for c in report["checks"]},
        "statuses": {c["name"]: c["status"] for c in report["checks"]},
        "collective": next(c for c in report["checks"] if c["name"] == "collective")["data"],
    }


def _sequential_loop(tb: Any, names: list[str], workdir: str) -> float:
    """The same facts, gathered one host after another with the OpenSSH client."""
    from corral.remote.python import program, shell_command, stdin_payload

    params = {
        "launcher": "torchrun",
        "workdir": workdir,
        "code_dir": workdir,
        "checkpoint_dir": "/srv/corral/bench-ckpt",
        "master_addr": tb.host(names[0]).address,
    }
    text = program(
        ["corral.agent.fingerprint", "corral.agent.hostfacts"],
        "corral.agent.hostfacts:main",
        params,
    )
    started = time.perf_counter()
    for name in names:
        out = subprocess.run(
            tb.ssh_argv(name, shell_command(sys.executable)),
            input=stdin_payload(text),
            capture_output=True,
            timeout=120,
        )
        if out.returncode != 0 or not out.stdout.startswith(b"{"):
            raise RuntimeError(f"{name}: {out.stderr[-300:]!r}")
    return time.perf_counter() - started


def _floor(tb: Any, names: list[str]) -> float:
    """Every host at once: one ssh login and one ``import torch.distributed``."""
    started = time.perf_counter()
    procs = [
        subprocess.Popen(
            tb.ssh_argv(name, sys.executable, "-c", _shell_quote("import torch.distributed")),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        for name in names
    ]
    for name, proc in zip(names, procs, strict=True):
        _, err = proc.communicate(timeout=300)
        if proc.returncode != 0:
            raise RuntimeError(f"{name}: {err.decode(errors='replace')[-300:]}")
    return time.perf_counter() - started


def _at_scale(hosts: int, top: Path) -> dict[str, Any]:
    """One full checklist on a fresh testbed of ``hosts`` hosts (brought down after)."""
    from corral.testbed import Testbed

    tb = Testbed(top / "testbed-scale")
    try:
        up = tb.up(hosts)
        log(f"{hosts} hosts up in {up.seconds:.1f} s")
        run = _corral_check(tb, str(REPO / "examples"), smoke=True, timeout=1500.0)
    finally:
        tb.down()
    data = run["collective"]
    imports = sorted(data.get("import_s", {}).values())
    run.update(
        hosts=hosts,
        up_s=up.seconds,
        joined=len(data.get("joined_hosts", [])),
        join_window_s=data.get("join_window_s"),
        import_median_s=median(imports),
        import_max_s=imports[-1] if imports else None,
    )
    log(
        f"{hosts} hosts: {run['overall']} in {run['wall_s']:.1f} s, {run['joined']} joined "
        f"within {run['join_window_s']} s (torch import median {run['import_median_s']} s)"
    )
    return run


def _scale_metric(run: dict[str, Any]) -> dict[str, Any]:
    hosts = run["hosts"]
    return metric(
        f"full checklist incl. smoke test, {hosts} hosts (once, {os.cpu_count()} CPUs shared)",
        run["wall_s"],
        "s",
        f"passes, all {hosts} joined",
        run["exit_code"] == 0 and run["joined"] == hosts,
    )


def _scale_only(hosts: int) -> int:
    """Measure only at scale and merge it into an existing ``results/check.json``."""
    from benchlib import RESULTS_DIR

    path = RESULTS_DIR / f"{NAME}.json"
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        doc = {"title": "Pre-flight checklist on testbed hosts", "status": "ok", "metrics": []}
    top = shared_tmpdir("corral-bench-check-")
    try:
        from corral.testbed import Testbed, exclusive

        with exclusive():
            leftover = Testbed.running()
            if leftover is not None:
                leftover.down()
            run = _at_scale(hosts, top)
    finally:
        shutil.rmtree(top, ignore_errors=True)
    doc.pop("name", None)
    doc.pop("date", None)
    doc.pop("machine", None)
    doc.pop("corral", None)
    doc["scale"] = run
    doc.setdefault("config", {})["scale"] = hosts
    doc["metrics"] = [m for m in doc.get("metrics", []) if "hosts (once," not in m["metric"]]
    doc["metrics"].append(_scale_metric(run))
    runs = Runs()
    runs.check_records(f"checklist on {hosts} hosts", [run], timing="wall_s")
    return finish(NAME, doc, runs)


def _shell_quote(text: str) -> str:
    return shlex.quote(text)


def main(argv: list[str] | None = None) -> int:
    """Bring up the testbed, measure, take it down, write ``results/check.json``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=16)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--small", type=int, default=2, help="hosts of the per-host measurement")
    parser.add_argument(
        "--scale", type=int, default=64, help="hosts of the one run at scale (0: skip it)"
    )
    parser.add_argument(
        "--scale-only", action="store_true", help="only the run at scale, merged into the result"
    )
    args = parser.parse_args(argv)
    exit_on_sigterm()
    from corral.testbed import Testbed, exclusive, missing_requirements

    problems = missing_requirements()
    if problems:
        return _skip("; ".join(problems))
    if args.scale_only:
        return _scale_only(args.scale)
    top = shared_tmpdir("corral-bench-check-")
    with exclusive():
        leftover = Testbed.running()
        if leftover is not None:
            leftover.down()
        tb = Testbed(top / "testbed")
        workdir = str(REPO / "examples")
        full: list[dict[str, Any]] = []
        lean: list[dict[str, Any]] = []
        loops: list[float] = []
        floors: list[float] = []
        small: list[dict[str, Any]] = []
        scale: dict[str, Any] | None = None
        try:
            tb.up(args.hosts)
            names = [h.name for h in tb.hosts]
            few = top / "hosts-small"
            few.write_text("".join(f"{n}\n" for n in names[: args.small]))
            _corral_check(tb, workdir, smoke=False)  # warm the page cache and sshd
            for run in range(args.runs):
                lean.append(_corral_check(tb, workdir, smoke=False))
                loops.append(_sequential_loop(tb, names, workdir))
                full.append(_corral_check(tb, workdir, smoke=True))
                floors.append(_floor(tb, names))
                small.append(_corral_check(tb, workdir, smoke=True, hostfile=few))
                log(
                    f"run {run + 1}: full {full[-1]['wall_s']:.2f} s "
                    f"({full[-1]['overall']}), without smoke {lean[-1]['wall_s']:.2f} s, "
                    f"ssh loop {loops[-1]:.2f} s, floor {floors[-1]:.2f} s, "
                    f"{args.small} hosts {small[-1]['wall_s']:.2f} s"
                )
            tb.down()
            if args.scale > 0:
                scale = _at_scale(args.scale, top)
        finally:
            tb.down()
            shutil.rmtree(top, ignore_errors=True)
    full_s = median(r["wall_s"] for r in full)
    lean_s = median(r["wall_s"] for r in lean)
    loop_s = median(loops)
    gather_s = median(r["phases_s"].get("gather") for r in lean)
    smoke_s = median(r["phases_s"].get("collective") for r in full)
    per_check = {name: median(r["checks_s"][name] for r in full) for name in full[0]["checks_s"]}
    bus = median(r["collective"].get("bus_bandwidth_gbps") for r in full)
    floor_s = median(floors)
    small_s = median(r["wall_s"] for r in small)
    runs = Runs()
    runs.check_records("full checklist", full, timing="wall_s")
    runs.check_records("checklist without the smoke test", lean, timing="wall_s")
    runs.check_records(f"checklist on {args.small} hosts", small, timing="wall_s")
    all_ok = not runs.failures
    metrics = [
        metric(
            f"full checklist incl. smoke test, {args.hosts} hosts",
            full_s,
            "s",
            f"<= {TARGET_S:g} s",
            full_s is not None and full_s <= TARGET_S and all_ok,
            baseline=floor_s,
            baseline_desc=(
                f"floor: {args.hosts} concurrent ssh logins + torch imports on this "
                f"{os.cpu_count()}-CPU machine"
            ),
            ratio_value=ratio(full_s, floor_s),
        ),
        metric(
            f"full checklist incl. smoke test, {args.small} hosts (each host's own cost)",
            small_s,
            "s",
            f"<= {TARGET_S:g} s",
            small_s is not None and small_s <= TARGET_S and all_ok,
        ),
        metric(
            f"checklist without smoke test, {args.hosts} hosts",
            lean_s,
            "s",
            "ratio < 1.0x",
            lean_s is not None and loop_s is not None and lean_s < loop_s,
            baseline=loop_s,
            baseline_desc="same host-side facts, sequential ssh loop",
            ratio_value=ratio(lean_s, loop_s),
        ),
        metric("smoke test (all-reduce, gloo) alone", smoke_s, "s", "-", None),
    ]
    if scale is not None:
        metrics.append(_scale_metric(scale))
    status_code = finish(
        NAME,
        {
            "title": f"Pre-flight checklist on {args.hosts} testbed hosts",
            "status": "ok",
            "config": {
                "hosts": args.hosts,
                "small": args.small,
                "runs": args.runs,
                "cpus": os.cpu_count(),
                "scale": args.scale,
            },
            "samples": {
                "full": full,
                "without_smoke": lean,
                "ssh_loop_s": loops,
                "floor_s": floors,
                "small": small,
            },
            "scale": scale,
            "medians": {
                "full_s": full_s,
                "without_smoke_s": lean_s,
                "ssh_loop_s": loop_s,
                "gather_s": gather_s,
                "smoke_s": smoke_s,
                "floor_s": floor_s,
                "small_hosts": args.small,
                "small_full_s": small_s,
                "bus_bandwidth_gbps": bus,
                "per_check_s": per_check,
            },
            "metrics": metrics,
            "met": bool(metrics[0]["met"]),
        },
        runs,
    )
    print(
        f"checklist on {args.hosts} hosts: full {full_s} s (smoke {smoke_s} s), "
        f"without smoke {lean_s} s, sequential ssh loop {loop_s} s, floor {floor_s} s, "
        f"{args.small} hosts {small_s} s"
    )
    return status_code


if __name__ == "__main__":
    sys.exit(main())
