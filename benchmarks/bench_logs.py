"""Log pipeline throughput: lines/s through corral's supervisor, 4 ranks, 0 lost.

Each round runs the same 4 writer processes (``workloads/log_writer.py``: N
distinct 60-byte lines per rank, written in big blocks as fast as possible) twice:

* **corral**: ``corral run --hosts local:2 --nproc-per-node 2 --launcher python``
  with corral's stdout redirected to a file: rank -> pipe -> node agent (framing,
  host-side log) -> pipe -> supervisor (``[host:rank]`` prefix, coordinator-side
  log) -> file;
* **baseline**: the writers started directly with ``subprocess``, each stdout a
  pipe read by a plain reader thread that copies it into a file.

Throughput is ``4 N / (end - first writer start)`` where ``end`` is when corral
exited (resp. when every baseline pipe hit EOF and every writer was reaped).
Every line is then checked in corral's stdout, in the coordinator-side per-rank
logs (``runs/<job>/logs/<host>.<rank>.log``) and in the host-side copies
(``runs/<job>/nodes/<host>/logs/rank-R.log``): present exactly once, unbroken,
attributed to the right ``[host:rank]``. Medians of ``--runs`` rounds.

For information, the same corral run is repeated (fewer lines) with corral's
stdout on a pseudo-terminal (``script``), where it uses its live, colored
display: what a user watching a chatty job in a terminal gets.

    python benchmarks/bench_logs.py [--lines-per-rank 250000] [--runs 3]
                                    [--tty-lines-per-rank 25000]
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from benchlib import (
    PYTHON,
    WORKLOADS,
    Runs,
    bench_env,
    corral_cli,
    exit_on_sigterm,
    finish,
    kill_popen,
    log,
    median,
    metric,
    output_tail,
    ratio,
    read_stamp,
)

NAME = "logs"
NODES = 2
NPROC = 2
RANKS = NODES * NPROC
LINE_BYTES = 59  # content of one line, newline excluded (see log_writer.LINE_WIDTH)
TARGET_RATE = 200_000.0
WRITER = WORKLOADS / "log_writer.py"

_PLAIN = re.compile(rb"rank (\d+) line (\d+) x*")
_PREFIXED = re.compile(rb"\[([^\]\s:]+):(\d+)\] (rank (\d+) line (\d+) x*)")


@dataclass
class Tally:
    """Which lines were seen where, and what was wrong."""

    lines_per_rank: int
    seen: list[bytearray] = field(default_factory=list)
    total: int = 0
    broken: int = 0
    duplicates: int = 0
    misattributed: int = 0
    other: int = 0
    examples: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.seen = [bytearray(self.lines_per_rank) for _ in range(RANKS)]

    def bad(self, kind: str, line: bytes) -> None:
        if len(self.examples) < 5:
            self.examples.append(f"{kind}: {line[:120]!r}")

    def add(self, rank: int, index: int) -> None:
        if not (0 <= rank < RANKS and 0 <= index < self.lines_per_rank):
            self.broken += 1
            return
        if self.seen[rank][index]:
            self.duplicates += 1
        else:
            self.seen[rank][index] = 1

    @property
    def missing(self) -> int:
        return sum(self.lines_per_rank - sum(s) for s in self.seen)

    @property
    def lost(self) -> int:
        """Lines not delivered exactly once and intact."""
        return self.missing + self.duplicates + self.broken + self.misattributed

    def summary(self) -> dict[str, Any]:
        return {
            "lines": self.total,
            "expected": self.lines_per_rank * RANKS,
            "missing": self.missing,
            "duplicates": self.duplicates,
            "broken": self.broken,
            "misattributed": self.misattributed,
            "other_lines": self.other,
            "lost": self.lost,
            "examples": self.examples,
        }


def _lines(path: Path) -> list[bytes]:
    data = path.read_bytes()
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    return lines


def check_prefixed(path: Path, tally: Tally, *, strict: bool) -> None:
    """corral's stdout: ``[local-H:R] rank R line I xxx``; other lines are corral's
    own (counted, and broken when ``strict``)."""
    for line in _lines(path):
        tally.total += 1
        match = _PREFIXED.fullmatch(line)
        if match is None:
            if strict or b"rank " in line:
                tally.broken += 1
                tally.bad("broken", line)
            else:
                tally.other += 1
            continue
        host, prefix_rank, body, rank, index = match.groups()
        if len(body) != LINE_BYTES:
            tally.broken += 1
            tally.bad("broken", line)
            continue
        r = int(rank)
        if int(prefix_rank) != r or host != f"local-{r // NPROC}".encode():
            tally.misattributed += 1
            tally.bad("misattributed", line)
            continue
        tally.add(r, int(index))


def check_plain(path: Path, rank: int, tally: Tally) -> None:
    """A per-rank log file: ``rank R line I xxx`` lines of rank ``rank`` only."""
    for line in _lines(path):
        tally.total += 1
        match = _PLAIN.fullmatch(line)
        if match is None or len(line) != LINE_BYTES:
            tally.broken += 1
            tally.bad(f"broken in {path.name}", line)
            continue
        r = int(match.group(1))
        if r != rank:
            tally.misattributed += 1
            tally.bad(f"misattributed in {path.name}", line)
            continue
        tally.add(r, int(match.group(2)))


def _stamps(stamp_dir: Path) -> tuple[float | None, float | None]:
    starts = [read_stamp(stamp_dir / f"start-{r}") for r in range(RANKS)]
    ends = [read_stamp(stamp_dir / f"end-{r}") for r in range(RANKS)]
    first = min((s for s in starts if s is not None), default=None)
    last = max((e for e in ends if e is not None), default=None) if None not in ends else None
    return first, last


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _self_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def run_corral(
    work: Path, lines: int, round_no: int, timeout: float, *, tty: bool = False
) -> dict[str, Any]:
    """One corral run; returns timings and the loss check. With ``tty``, corral's
    stdout and stderr are a pseudo-terminal (``script``), so corral uses its live,
    colored display; its stdout is then not parsed (ANSI codes), only the logs."""
    stamp_dir = work / "stamps"
    stamp_dir.mkdir(parents=True)
    run_dir = work / "runs"
    job_id = f"bench-logs-{round_no}-{int(time.time())}"
    cli, _ = corral_cli()
    argv = [
        *cli,
        "run",
        "--hosts",
        f"local:{NODES}",
        "--nproc-per-node",
        str(NPROC),
        "--master-port",
        "0",
        "--launcher",
        "python",
        "--run-dir",
        str(run_dir),
        "--job-id",
        job_id,
        "--",
        str(WRITER),
        str(lines),
        str(stamp_dir),
    ]
    if tty:
        argv = ["script", "-qfec", shlex.join(argv), "/dev/null"]
    out_path = work / "corral.stdout"
    err_path = work / "corral.stderr"
    cpu0 = _children_cpu()
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        launched = time.time()
        proc = subprocess.Popen(argv, stdout=out, stderr=err, env=bench_env(), cwd=work)
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            code = None
        finally:
            ended = time.time()
            kill_popen(proc)
    cpu = _children_cpu() - cpu0
    first, last_write = _stamps(stamp_dir)
    result: dict[str, Any] = {
        "exit_code": code,
        "launch_to_exit_s": ended - launched,
        "cpu_s": cpu,
        "job_id": job_id,
        "argv": argv,
    }
    if first is not None:
        result["stream_s"] = ended - first
        result["lines_per_s"] = lines * RANKS / (ended - first)
        result["end_to_end_lines_per_s"] = lines * RANKS / (ended - launched)
        result["startup_s"] = first - launched
    if first is not None and last_write is not None:
        result["writers_s"] = last_write - first
    stdout_tally = Tally(lines)
    if not tty:
        check_prefixed(out_path, stdout_tally, strict=False)
    log_tally = Tally(lines)
    host_tally = Tally(lines)
    job_dir = run_dir / job_id
    for rank in range(RANKS):
        host = f"local-{rank // NPROC}"
        coordinator_log = job_dir / "logs" / f"{host}.{rank}.log"
        if coordinator_log.exists():
            check_plain(coordinator_log, rank, log_tally)
        host_log = job_dir / "nodes" / host / "logs" / f"rank-{rank}.log"
        if host_log.exists():
            check_plain(host_log, rank, host_tally)
    result["stdout"] = stdout_tally.summary() if not tty else "not checked (terminal output)"
    result["logs"] = log_tally.summary()
    result["host_logs"] = host_tally.summary()
    result["lost"] = (0 if tty else stdout_tally.lost) + log_tally.lost + host_tally.lost
    if code != 0 or first is None:
        result["stderr_tail"] = output_tail(err_path, 20)
    return result


def _drain(fd: IO[bytes], sink: IO[bytes]) -> None:
    raw = fd.fileno()
    while True:
        chunk = os.read(raw, 1 << 16)
        if not chunk:
            return
        sink.write(chunk)


def run_baseline(work: Path, lines: int, timeout: float) -> dict[str, Any]:
    """The same writers started directly, each pipe copied to a file by a thread."""
    stamp_dir = work / "stamps"
    stamp_dir.mkdir(parents=True)
    procs: list[subprocess.Popen[bytes]] = []
    sinks: list[IO[bytes]] = []
    threads: list[threading.Thread] = []
    cpu0 = _children_cpu() + _self_cpu()
    launched = time.time()
    try:
        for rank in range(RANKS):
            proc = subprocess.Popen(
                [PYTHON, "-u", str(WRITER), str(lines), str(stamp_dir), str(rank)],
                stdout=subprocess.PIPE,
                env=bench_env(),
                cwd=work,
            )
            procs.append(proc)
            sink = open(work / f"rank-{rank}.out", "wb")  # noqa: SIM115
            sinks.append(sink)
            assert proc.stdout is not None
            thread = threading.Thread(target=_drain, args=(proc.stdout, sink), daemon=True)
            thread.start()
            threads.append(thread)
        deadline = time.monotonic() + timeout
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        codes = [p.wait(timeout=max(0.1, deadline - time.monotonic())) for p in procs]
        ended = time.time()
    finally:
        for proc in procs:
            kill_popen(proc)
            if proc.stdout is not None:
                proc.stdout.close()
        for handle in sinks:
            handle.close()
    cpu = _children_cpu() + _self_cpu() - cpu0
    first, last_write = _stamps(stamp_dir)
    result: dict[str, Any] = {
        "exit_codes": codes,
        "launch_to_exit_s": ended - launched,
        "cpu_s": cpu,
    }
    if first is not None:
        result["stream_s"] = ended - first
        result["lines_per_s"] = lines * RANKS / (ended - first)
        result["end_to_end_lines_per_s"] = lines * RANKS / (ended - launched)
        result["startup_s"] = first - launched
    if first is not None and last_write is not None:
        result["writers_s"] = last_write - first
    tally = Tally(lines)
    for rank in range(RANKS):
        check_plain(work / f"rank-{rank}.out", rank, tally)
    result["output"] = tally.summary()
    result["lost"] = tally.lost
    return result


def main(argv: list[str] | None = None) -> int:
    """Run the rounds, write ``results/logs.json``, print a short summary."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines-per-rank", type=int, default=250_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=60.0, help="per run, seconds")
    parser.add_argument(
        "--tty-lines-per-rank",
        type=int,
        default=25_000,
        help="lines per rank of the extra runs on a pseudo-terminal (0: none)",
    )
    args = parser.parse_args(argv)
    exit_on_sigterm()
    lines = args.lines_per_rank
    log(
        f"log throughput: {RANKS} ranks x {lines} lines, {args.runs} rounds; corral via "
        f"{corral_cli()[1]}"
    )
    top = Path(tempfile.mkdtemp(prefix="corral-bench-logs-"))
    corral_runs: list[dict[str, Any]] = []
    baseline_runs: list[dict[str, Any]] = []
    try:
        for round_no in range(args.runs):
            work = top / f"baseline-{round_no}"
            base = run_baseline(work, lines, args.timeout)
            shutil.rmtree(work, ignore_errors=True)
            baseline_runs.append(base)
            work = top / f"corral-{round_no}"
            res = run_corral(work, lines, round_no, args.timeout)
            shutil.rmtree(work, ignore_errors=True)
            corral_runs.append(res)
            log(
                f"round {round_no + 1}: corral {res.get('lines_per_s', 0):,.0f} lines/s "
                f"(exit {res['exit_code']}, lost {res['lost']}), baseline "
                f"{base.get('lines_per_s', 0):,.0f} lines/s (lost {base['lost']})"
            )
        tty_runs = []
        if args.tty_lines_per_rank > 0 and shutil.which("script"):
            for round_no in range(args.runs):
                work = top / f"tty-{round_no}"
                res = run_corral(work, args.tty_lines_per_rank, round_no, args.timeout, tty=True)
                shutil.rmtree(work, ignore_errors=True)
                tty_runs.append(res)
                log(
                    f"terminal round {round_no + 1}: corral {res.get('lines_per_s', 0):,.0f} "
                    f"lines/s (exit {res['exit_code']}, lost {res['lost']} in the logs)"
                )
    finally:
        shutil.rmtree(top, ignore_errors=True)

    tty_rate = median(r.get("lines_per_s") for r in tty_runs)
    corral_rate = median(r.get("lines_per_s") for r in corral_runs)
    base_rate = median(r.get("lines_per_s") for r in baseline_runs)
    lost = sum(r["lost"] for r in corral_runs + tty_runs)
    runs = Runs()
    runs.check_records("corral round", corral_runs, timing="lines_per_s")
    runs.check_records("corral on a terminal, round", tty_runs, timing="lines_per_s")
    failed = runs.failures
    rate_ratio = ratio(corral_rate, base_rate)
    rate_met = corral_rate is not None and corral_rate >= TARGET_RATE
    medians = {
        "corral_lines_per_s": corral_rate,
        "baseline_lines_per_s": base_rate,
        "corral_end_to_end_lines_per_s": median(
            r.get("end_to_end_lines_per_s") for r in corral_runs
        ),
        "baseline_end_to_end_lines_per_s": median(
            r.get("end_to_end_lines_per_s") for r in baseline_runs
        ),
        "corral_stream_s": median(r.get("stream_s") for r in corral_runs),
        "baseline_stream_s": median(r.get("stream_s") for r in baseline_runs),
        "corral_startup_s": median(r.get("startup_s") for r in corral_runs),
        "baseline_startup_s": median(r.get("startup_s") for r in baseline_runs),
        "corral_tty_lines_per_s": tty_rate,
        "corral_cpu_s": median(r.get("cpu_s") for r in corral_runs),
        "baseline_cpu_s": median(r.get("cpu_s") for r in baseline_runs),
    }
    metrics = [
        metric(
            "log throughput, 4 ranks (aggregate)",
            corral_rate,
            "lines/s",
            f">= {TARGET_RATE:,.0f} lines/s",
            rate_met,
            baseline=base_rate,
            baseline_desc="same writers, plain pipes read by threads",
            ratio_value=rate_ratio,
        ),
        metric(
            "log throughput, stdout on a terminal (live display; info)",
            tty_rate,
            "lines/s",
            "-",
            None,
            baseline=corral_rate,
            baseline_desc="corral with stdout redirected to a file",
            ratio_value=ratio(tty_rate, corral_rate),
        ),
        metric(
            "lines lost/duplicated/broken (stdout + both logs, all runs)",
            float(lost),
            "lines",
            "0",
            lost == 0 and not failed,
        ),
    ]
    status_code = finish(
        NAME,
        {
            "title": "Log pipeline throughput",
            "status": "ok",
            "config": {
                "hosts": f"local:{NODES}",
                "nproc_per_node": NPROC,
                "launcher": "python",
                "lines_per_rank": lines,
                "line_bytes": LINE_BYTES + 1,
                "runs": args.runs,
                "tty_lines_per_rank": args.tty_lines_per_rank if tty_runs else 0,
            },
            "samples": {"corral": corral_runs, "baseline": baseline_runs, "corral_tty": tty_runs},
            "medians": medians,
            "metrics": metrics,
            "ratio": rate_ratio,
            "target": f">= {TARGET_RATE:,.0f} lines/s, 0 lost",
            "met": rate_met and lost == 0 and not failed,
        },
        runs,
    )
    print(
        f"log throughput: corral {corral_rate or 0:,.0f} lines/s, baseline "
        f"{base_rate or 0:,.0f} lines/s, ratio {rate_ratio or 0:.2f}, lost {lost}"
    )
    return status_code


if __name__ == "__main__":
    sys.exit(main())
