"""The link matrix (`corral check --links`) on 8 testbed hosts (netns + real sshd;
needs root, exit 77 otherwise; waits while tests hold the testbed).

Measures, median of ``--runs``:

* ``corral check --links --no-smoke-test --json`` end to end (CLI process, wall
  clock) and the links phase alone (every pair both ways in round-robin rounds,
  the ring, the helpers' start and stop); baseline in the same run: the
  streaming time the schedule plans (rounds x 2 directions + the ring, times the
  per-direction share), so the ratio is the overhead of starting helpers, pings
  and round trips;
* one host's link throttled by tc (tbf on its bridge-side veth, traffic into
  it): the bandwidth measured into that host versus tc's rate, and whether the
  check names that host (and only it).

Target: the links phase <= 30 s on 8 hosts; the throttled host named; its
measured bandwidth within 0.5x-1.5x of tc's rate.

    python benchmarks/bench_links.py [--hosts 8] [--runs 2] [--rate-mbit 80]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchlib import (
    bench_env,
    corral_cli,
    exit_on_sigterm,
    finish,
    log,
    median,
    metric,
    ratio,
    shared_tmpdir,
    write_result,
)

NAME = "links"
TARGET_S = 30.0
REPO = Path(__file__).resolve().parents[1]


def _skip(reason: str) -> int:
    print(f"skipped: {reason}")
    write_result(NAME, {"status": "skipped", "reason": reason})
    return 77


def _check(tb: Any, workdir: str) -> dict[str, Any]:
    argv, _ = corral_cli()
    cmd = [
        *argv,
        "check",
        "--hosts",
        str(tb.hostfile),
        "--ssh-config",
        str(tb.ssh_config),
        "--workdir",
        workdir,
        "--code-dir",
        workdir,
        "--no-smoke-test",
        "--links",
        "--json",
    ]
    started = time.perf_counter()
    proc = subprocess.run(
        cmd, capture_output=True, text=True, env=bench_env(), cwd=workdir, timeout=300
    )
    wall = time.perf_counter() - started
    report = json.loads(proc.stdout)
    links = next(c for c in report["checks"] if c["name"] == "links")
    data = links["data"]
    planned = (2 * data["rounds"] + 1) * data["seconds_per_direction"]
    return {
        "wall_s": wall,
        "links_s": report.get("phases_s", {}).get("links"),
        "planned_s": planned,
        "status": links["status"],
        "culprits": data["score"]["culprits"],
        "reference_gbs": data["score"]["reference_gbs"],
        "ring_gbs": (data.get("ring") or {}).get("busbw_gbs"),
        "pairs": data["pairs"],
        "rounds": data["rounds"],
    }


def _into(sample: dict[str, Any], host: str) -> list[float]:
    """GB/s measured into ``host`` from each peer."""
    return [
        p["ab_gbs"] if p["b"] == host else p["ba_gbs"]
        for p in sample["pairs"]
        if host in (p["a"], p["b"]) and p["error"] is None
    ]


def main(argv: list[str] | None = None) -> int:
    """Bring up the testbed, measure, take it down, write ``results/links.json``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=8)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--rate-mbit", type=float, default=80.0, help="tc's rate for the host")
    args = parser.parse_args(argv)
    exit_on_sigterm()
    from corral.testbed import Testbed, exclusive, missing_requirements

    problems = missing_requirements()
    if problems:
        return _skip("; ".join(problems))
    if shutil.which("tc") is None:
        return _skip("tc (iproute2) not installed")
    top = shared_tmpdir("corral-bench-links-")
    workdir = str(REPO / "examples")
    healthy: list[dict[str, Any]] = []
    throttled: list[dict[str, Any]] = []
    with exclusive():
        leftover = Testbed.running()
        if leftover is not None:
            leftover.down()
        tb = Testbed(top / "testbed")
        try:
            tb.up(args.hosts)
            slow = tb.hosts[1].name
            veth = tb.host(slow).veth
            for run in range(args.runs):
                healthy.append(_check(tb, workdir))
                tbf = ["tc", "qdisc", "replace", "dev", veth, "root", "tbf"]
                rate = ["rate", f"{args.rate_mbit:g}mbit", "burst", "64kb", "latency", "100ms"]
                subprocess.run([*tbf, *rate], check=True)
                try:
                    throttled.append(_check(tb, workdir))
                finally:
                    subprocess.run(["tc", "qdisc", "del", "dev", veth, "root"], check=False)
                log(
                    f"run {run + 1}: healthy {healthy[-1]['links_s']:.2f} s "
                    f"({healthy[-1]['status']}, reference {healthy[-1]['reference_gbs']:.3g} "
                    f"GB/s); throttled {slow}: {throttled[-1]['status']}, culprits "
                    f"{throttled[-1]['culprits']}, into {slow} "
                    f"{[round(v * 1000, 2) for v in _into(throttled[-1], slow)]} MB/s"
                )
        finally:
            tb.down()
            shutil.rmtree(top, ignore_errors=True)
    links_s = median(r["links_s"] for r in healthy)
    planned_s = median(r["planned_s"] for r in healthy)
    wall_s = median(r["wall_s"] for r in healthy)
    set_gbs = args.rate_mbit * 1e6 / 8 / 1e9
    measured = median(v for r in throttled for v in _into(r, slow))
    named = all(r["culprits"] == [slow] for r in throttled)
    healthy_ok = all(r["status"] == "pass" for r in healthy)
    metrics = [
        metric(
            f"links matrix, {args.hosts} hosts ({healthy[0]['rounds']} rounds, both ways + ring)",
            links_s,
            "s",
            f"<= {TARGET_S:g} s",
            links_s is not None and links_s <= TARGET_S and healthy_ok,
            baseline=planned_s,
            baseline_desc="streaming time the schedule plans (no start, pings, round trips)",
            ratio_value=ratio(links_s, planned_s),
        ),
        metric(f"corral check --links end to end, {args.hosts} hosts", wall_s, "s", "-", None),
        metric(
            f"throttled link ({args.rate_mbit:g} Mbit/s tbf): measured into {slow}",
            None if measured is None else measured * 1000,
            "MB/s",
            "0.5x-1.5x tc's rate, host named",
            measured is not None and 0.5 <= measured / set_gbs <= 1.5 and named,
            baseline=set_gbs * 1000,
            baseline_desc="tc's set rate",
            ratio_value=ratio(measured, set_gbs),
        ),
    ]
    status_code = finish(
        NAME,
        {
            "title": f"Link matrix on {args.hosts} testbed hosts",
            "status": "ok",
            "config": {"hosts": args.hosts, "runs": args.runs, "rate_mbit": args.rate_mbit},
            "samples": {"healthy": healthy, "throttled": throttled},
            "metrics": metrics,
        },
    )
    for m in metrics:
        print(json.dumps(m))
    return status_code or (0 if healthy_ok and named else 1)


if __name__ == "__main__":
    sys.exit(main())
