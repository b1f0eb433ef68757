"""``corral sync`` to 8 SSH hosts (the netns testbed) vs a sequential rsync loop.

Brings up its own 8-host testbed (network namespaces + real sshd; needs root,
exit 77 otherwise; waits while tests hold the testbed), builds a code tree of
2,000 files / 50 MB, and times, in alternating order, median of 3 rounds:

* **first sync** (empty destination on every host) and a **no-change re-sync**
  with ``corral sync`` (the CLI, end to end: start-up, tree walk, hashing, one
  rsync per host in parallel, state file);
* the seed's approach with the same file set: a sequential loop of plain
  ``rsync -a --delete -e "ssh -F ssh_config" SRC/ HOST:DEST/``, one host after
  the other.

Target: corral <= 0.5x the loop for both. Afterwards every host's tree must
hash equal to the coordinator's (``build_manifest`` run inside each host).

    python benchmarks/bench_sync.py [--rounds 3] [--hosts 8] [--files 2000] [--mb 50]
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from benchlib import (
    PYTHON,
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
    write_result,
)

NAME = "sync"
TARGET = 0.5
TIMEOUT = 300.0
DEST = "/srv/corral/bench-sync"
_DIGEST = (
    "import sys; from corral.agent.fingerprint import build_manifest; "
    "print(build_manifest(sys.argv[1]).digest)"
)


def _skip(reason: str) -> int:
    print(f"skipped: {reason}")
    write_result(NAME, {"status": "skipped", "reason": reason})
    return 77


def make_tree(root: Path, files: int, total_bytes: int) -> None:
    """A deterministic code-like tree: ``files`` files in nested packages, ``total_bytes``."""
    rnd = random.Random(20261122)
    words = [f"name_{i}" for i in range(500)] + ["def", "return", "import", "self", "="]
    sizes = [rnd.uniform(0.2, 1.8) for _ in range(files)]
    scale = total_bytes / sum(sizes)
    for i, weight in enumerate(sizes):
        path = root / f"pkg{i % 25:02d}" / f"sub{i % 8}" / f"module_{i:04d}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        size = int(weight * scale)
        text = " ".join(rnd.choices(words, k=size // 6 + 1))
        path.write_text(text[:size])


def clean(tb: Any, hosts: list[str]) -> None:
    """Remove the destination on every host (not timed)."""
    with ThreadPoolExecutor(len(hosts)) as pool:
        list(pool.map(lambda h: tb.run_on(h, ["rm", "-rf", DEST], check=True), hosts))


def corral_sync(tb: Any, src: Path, work: Path, label: str) -> dict[str, Any]:
    """One ``corral sync`` of ``src`` to every host."""
    cli, _ = corral_cli()
    argv = [
        *cli,
        "sync",
        "--hosts",
        str(tb.hostfile),
        "--ssh-config",
        str(tb.ssh_config),
        str(src),
        "--dest",
        DEST,
        "--json",
    ]
    env = bench_env()
    env["CORRAL_STATE_DIR"] = str(work / "state")
    started = time.monotonic()
    proc = subprocess.run(
        argv, capture_output=True, text=True, env=env, timeout=TIMEOUT, check=False
    )
    seconds = time.monotonic() - started
    (work / f"{label}.out").write_text(proc.stdout + proc.stderr)
    result: dict[str, Any] = {"seconds": seconds, "exit_code": proc.returncode, "argv": argv}
    try:
        doc = json.loads(proc.stdout)
        result["files_sent"] = sum(h["files_transferred"] for h in doc["hosts"])
        result["host_seconds_max"] = max(h["seconds"] for h in doc["hosts"])
    except (ValueError, KeyError, TypeError):
        result["output_tail"] = output_tail(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        result["output_tail"] = output_tail(proc.stderr or proc.stdout)
    return result


def rsync_loop(tb: Any, src: Path, hosts: list[str]) -> dict[str, Any]:
    """The seed's way: one plain rsync per host, one after the other."""
    codes = []
    result: dict[str, Any] = {}
    started = time.monotonic()
    for host in hosts:
        argv = ["rsync", "-a", "--delete", "-e", f"ssh -F {tb.ssh_config}", f"{src}/"]
        argv.append(f"{host}:{DEST}/")
        proc = subprocess.run(argv, capture_output=True, timeout=TIMEOUT, check=False)
        codes.append(proc.returncode)
        if proc.returncode != 0 and "argv" not in result:
            result.update(argv=argv, output_tail=output_tail(proc.stderr))
    return {"seconds": time.monotonic() - started, "exit_codes": codes, **result}


def divergent_hosts(tb: Any, src: Path, hosts: list[str]) -> list[str]:
    """Hosts whose tree at DEST does not hash like ``src``."""
    from corral.agent.fingerprint import build_manifest

    want = build_manifest(str(src)).digest
    env = bench_env()

    def digest(host: str) -> str:
        out = tb.run_on(host, [PYTHON, "-c", _DIGEST, DEST], env=env, timeout=120)
        return str(out.stdout.strip())

    with ThreadPoolExecutor(len(hosts)) as pool:
        got = dict(zip(hosts, pool.map(digest, hosts), strict=True))
    return [h for h, d in got.items() if d != want]


def main(argv: list[str] | None = None) -> int:
    """Bring up a testbed, measure, take it down, write ``results/sync.json``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--hosts", type=int, default=8)
    parser.add_argument("--files", type=int, default=2000)
    parser.add_argument("--mb", type=float, default=50.0)
    args = parser.parse_args(argv)
    exit_on_sigterm()
    from corral.testbed import exclusive, missing_requirements

    problems = missing_requirements()
    if problems:
        return _skip("; ".join(problems))
    if shutil.which("rsync") is None:
        return _skip("missing tools: rsync")
    with exclusive():  # waits while tests (or another benchmark) use the testbed
        return _measure(args)


def _measure(args: argparse.Namespace) -> int:
    from corral.testbed import Testbed

    leftover = Testbed.running()
    if leftover is not None:
        leftover.down()
    # The hosts' /srv/corral live in the testbed's state dir: on tmpfs, so that 8
    # simulated hosts do not share one disk (a real cluster has a disk per host).
    shm = Path("/dev/shm")
    top = Path(tempfile.mkdtemp(prefix="corral-bench-sync-", dir=shm if shm.is_dir() else None))
    src = top / "tree"
    make_tree(src, args.files, int(args.mb * 1e6))
    tb = Testbed(top / "testbed")
    tb.up(args.hosts)
    hosts = [h.name for h in tb.hosts]
    samples: dict[str, list[dict[str, Any]]] = {
        "corral_first": [],
        "corral_again": [],
        "loop_first": [],
        "loop_again": [],
    }
    divergent: list[str] = []
    try:
        for round_no in range(args.rounds):
            order = ("loop", "corral") if round_no % 2 == 0 else ("corral", "loop")
            for method in order:
                clean(tb, hosts)
                for phase in ("first", "again"):
                    if method == "corral":
                        res = corral_sync(tb, src, top, f"corral-{round_no}-{phase}")
                    else:
                        res = rsync_loop(tb, src, hosts)
                    samples[f"{method}_{phase}"].append(res)
                    log(f"round {round_no + 1} {method} {phase}: {res['seconds']:.2f} s")
                if method == "corral":
                    divergent += divergent_hosts(tb, src, hosts)
    finally:
        tb.down()
        shutil.rmtree(top, ignore_errors=True)
    med = {k: median(r["seconds"] for r in v) for k, v in samples.items()}
    first_ratio = ratio(med["corral_first"], med["loop_first"])
    again_ratio = ratio(med["corral_again"], med["loop_again"])
    runs = Runs()
    for key, rows in samples.items():
        runs.check_records(key.replace("_", " ") + " round", rows, timing="seconds")
    failures = len(runs.failures)
    first_met = first_ratio is not None and first_ratio <= TARGET
    again_met = again_ratio is not None and again_ratio <= TARGET
    desc = f"sequential rsync -a --delete -e 'ssh -F cfg' to {args.hosts} hosts"
    metrics = [
        metric(
            f"first sync, {args.files} files / {args.mb:g} MB to {args.hosts} hosts",
            med["corral_first"],
            "s",
            f"<= {TARGET}x",
            first_met,
            baseline=med["loop_first"],
            baseline_desc=desc,
            ratio_value=first_ratio,
        ),
        metric(
            f"no-change re-sync to {args.hosts} hosts",
            med["corral_again"],
            "s",
            f"<= {TARGET}x",
            again_met,
            baseline=med["loop_again"],
            baseline_desc=desc,
            ratio_value=again_ratio,
        ),
        metric(
            "hosts whose tree hash differs after corral sync / failed runs",
            len(divergent) + failures,
            "count",
            "0",
            not divergent and not failures,
        ),
    ]
    status_code = finish(
        NAME,
        {
            "title": "corral sync vs a sequential rsync loop (netns testbed)",
            "status": "ok",
            "config": {
                "hosts": args.hosts,
                "files": args.files,
                "mb": args.mb,
                "rounds": args.rounds,
                "dest": DEST,
                "hosts_storage": "tmpfs" if str(top).startswith("/dev/shm") else "disk",
            },
            "samples": samples,
            "medians": med,
            "metrics": metrics,
            "ratio": first_ratio,
            "target": f"first sync and re-sync <= {TARGET}x the loop",
            "met": first_met and again_met,
        },
        runs,
    )
    print(
        f"first sync: corral {med['corral_first']:.2f} s vs loop {med['loop_first']:.2f} s "
        f"-> {first_ratio:.2f}x; re-sync: corral {med['corral_again']:.2f} s vs loop "
        f"{med['loop_again']:.2f} s -> {again_ratio:.2f}x; divergent hosts {divergent}"
    )
    return status_code


if __name__ == "__main__":
    sys.exit(main())
