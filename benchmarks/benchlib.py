"""Shared helpers of the benchmarks (not a benchmark itself).

Every ``bench_<name>.py`` writes ``benchmarks/results/<name>.json``::

    {
      "name": "logs",                       # <name>
      "title": "Log pipeline throughput",
      "status": "ok" | "failed" | "skipped",
      "reason": "...",                       # why failed/skipped (optional)
      "date": "2026-...Z", "machine": {...}, "corral": {...},
      "config": {...},                       # what was run
      "samples": {...},                      # every raw measurement
      "medians": {...},
      "metrics": [                           # one row each in the README table
        {"metric": "...", "value": 1.0, "unit": "s", "baseline": 0.5,
         "baseline_desc": "...", "ratio": 2.0, "target": "<= 2 s", "met": true}
      ],
      "ratio": 2.0, "target": "<= 2 s", "met": true   # the headline metric
    }

``run_all.py`` turns these into ``results/summary.json`` and ``summary.md``.
Timings are measurements, never asserts.

A benchmark's figures are only as good as its runs: every measured run goes
through :meth:`Runs.check` (exit code, root cause, a timing that was really
taken) and every benchmark ends with :func:`finish`, which marks the result
``failed`` when a run failed or a targeted figure is missing, prints each failing
run's command and last stderr lines, and gives the exit code (1: failed).
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import json
import os
import platform
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import psutil

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
#: Where result files go: ``results/``, or ``$CORRAL_BENCH_RESULTS`` (a test's own
#: directory, so that it never overwrites the published figures).
RESULTS_DIR = Path(os.environ.get("CORRAL_BENCH_RESULTS") or BENCH_DIR / "results")
WORKLOADS = BENCH_DIR / "workloads"
PYTHON = sys.executable


def _loadavg() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


LOAD_AT_START = _loadavg()


# -- environment ----------------------------------------------------------------------


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def machine_info() -> dict[str, Any]:
    """CPU count, load, interpreter and library versions of this machine."""
    return {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "cpu_affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "loadavg_at_start": LOAD_AT_START,
        "loadavg_at_end": _loadavg(),
        "python": platform.python_version(),
        "python_executable": sys.executable,
        "torch": _version("torch"),
        "psutil": _version("psutil"),
        "rich": _version("rich"),
    }


def git_info() -> dict[str, Any]:
    """The commit of the tree under test and whether it has local changes."""
    info: dict[str, Any] = {"commit": None, "dirty": None}
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=10
        )
        info["commit"] = head.stdout.strip() or None
        status = subprocess.run(
            ["git", "status", "--porcelain", "--", "src"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=10,
        )
        info["dirty"] = bool(status.stdout.strip())
    return info


def now_iso() -> str:
    """The current UTC time, ISO 8601."""
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def bench_env() -> dict[str, str]:
    """The environment for every process a benchmark starts: ours, with corral's
    sources importable even without an editable install."""
    env = dict(os.environ)
    src = str(ROOT / "src")
    parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if src not in parts:
        env["PYTHONPATH"] = os.pathsep.join([src, *parts])
    env.pop("CORRAL_JOB_ID", None)
    return env


@functools.cache
def corral_cli() -> tuple[list[str], str]:
    """argv prefix that runs ``corral``, and a note on which entry point it is. The
    first call compiles corral's sources as an installed wheel has them (``make
    setup`` does too): a run must not time Python compiling corral's modules, which
    it does in every process when ``PYTHONDONTWRITEBYTECODE`` is set."""
    subprocess.run(
        [PYTHON, "-m", "compileall", "-q", "-j", "0", str(ROOT / "src")],
        stdout=subprocess.DEVNULL,
        check=False,
    )
    return [PYTHON, "-m", "corral"], "python -m corral"


def corral_info() -> dict[str, Any]:
    """What corral was measured: commit and entry point."""
    return {**git_info(), "entry_point": corral_cli()[1]}


#: Testbed hosts have their own /tmp, /srv and home; /var/tmp is seen by all of them
#: (like an NFS home), so a benchmark's files that hosts must read live there.
SHARED_TMP = "/var/tmp"


def shared_tmpdir(prefix: str) -> Path:
    """A new directory every testbed host sees at the same path."""
    import tempfile

    return Path(tempfile.mkdtemp(prefix=prefix, dir=SHARED_TMP))


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# -- numbers --------------------------------------------------------------------------


def median(values: Iterable[float | None]) -> float | None:
    """Median of the values that are not None (None when there are none)."""
    kept = [v for v in values if v is not None]
    return statistics.median(kept) if kept else None


def ratio(value: float | None, baseline: float | None) -> float | None:
    """value / baseline, or None when either is missing or the baseline is 0."""
    if value is None or baseline is None or baseline == 0:
        return None
    return value / baseline


def rounded(value: Any, digits: int = 4) -> Any:
    """Round floats (recursively) so result files stay readable."""
    if isinstance(value, float):
        return round(value, digits)
    if isinstance(value, dict):
        return {k: rounded(v, digits) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [rounded(v, digits) for v in value]
    return value


def metric(
    name: str,
    value: float | None,
    unit: str,
    target: str,
    met: bool | None,
    *,
    baseline: float | None = None,
    baseline_desc: str = "",
    ratio_value: float | None = None,
) -> dict[str, Any]:
    """One row of the results table."""
    return {
        "metric": name,
        "value": value,
        "unit": unit,
        "baseline": baseline,
        "baseline_desc": baseline_desc,
        "ratio": ratio_value,
        "target": target,
        "met": met,
    }


def write_result(name: str, doc: dict[str, Any]) -> Path:
    """Write ``results/<name>.json`` (adds name, date, machine, corral) and return it."""
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    full: dict[str, Any] = {
        "name": name,
        "date": now_iso(),
        "machine": machine_info(),
        "corral": corral_info(),
    }
    full.update(doc)
    path = RESULTS_DIR / f"{name}.json"
    path.write_text(json.dumps(rounded(full), indent=2) + "\n")
    return path


def exit_on_sigterm() -> None:
    """Turn SIGTERM (run_all's timeout) into SystemExit, so ``finally`` blocks
    still stop every process the benchmark started."""

    def handler(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, handler)


def log(message: str) -> None:
    """Progress on stderr (stdout is left for the final summary)."""
    print(f"[bench] {message}", file=sys.stderr, flush=True)


# -- processes ------------------------------------------------------------------------


def tree(pid: int) -> list[psutil.Process]:
    """A process and all its descendants (empty when it is gone)."""
    try:
        proc = psutil.Process(pid)
        return [proc, *proc.children(recursive=True)]
    except psutil.Error:
        return []


def alive(procs: Sequence[psutil.Process]) -> list[psutil.Process]:
    """The processes of ``procs`` still running (same pid and start time, not zombies)."""
    left = []
    for proc in procs:
        try:
            if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                left.append(proc)
        except psutil.Error:
            pass
    return left


def kill_tree(pid: int, sig: int = signal.SIGKILL) -> None:
    """Signal a process and every descendant (cleanup of what a benchmark started)."""
    for proc in reversed(tree(pid)):
        with contextlib.suppress(psutil.Error):
            proc.send_signal(sig)


def kill_popen(proc: subprocess.Popen[Any]) -> None:
    """Make sure a started process and its descendants are gone, and reap it."""
    if proc.poll() is None:
        kill_tree(proc.pid)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10)


def job_processes(job_id: str) -> list[dict[str, Any]]:
    """Every live process carrying ``CORRAL_JOB_ID=job_id`` in its environment or
    the job id on its command line (torchrun's ``--rdzv-id``)."""
    found = []
    me = os.getpid()
    for proc in psutil.process_iter(["pid", "name", "cmdline"]):
        if proc.pid == me:
            continue
        try:
            cmdline = proc.info.get("cmdline") or []
            hit = any(job_id in part for part in cmdline)
            if not hit:
                hit = proc.environ().get("CORRAL_JOB_ID") == job_id
            if hit and proc.status() != psutil.STATUS_ZOMBIE:
                found.append({"pid": proc.pid, "name": proc.info.get("name"), "cmdline": cmdline})
        except psutil.Error:
            continue
    return found


def wait_for(path: Path, timeout: float, poll: float = 0.01) -> bool:
    """Wait until ``path`` exists (True) or ``timeout`` seconds pass (False)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            return True
        time.sleep(poll)
    return path.exists()


def read_stamp(path: Path) -> float | None:
    """A ``time.time()`` a workload wrote to ``path`` (None when absent or empty)."""
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    try:
        return float(text) if text else None
    except ValueError:
        return None


# -- verifying the measured runs ---------------------------------------------------------

#: The exit code of a benchmark that cannot run here (``run_all`` records it as skipped).
SKIP_EXIT = 77
#: Lines of a failing run's output kept in the result and printed.
TAIL_LINES = 15
#: Units of the figures that are times: a targeted time of 0 was never measured.
TIME_UNITS = frozenset({"s", "ms", "us", "CPU-s"})
#: Failing runs printed in full (the rest are counted).
SHOWN_FAILURES = 3


def output_tail(
    output: str | bytes | Path | Sequence[str] | None, lines: int = TAIL_LINES
) -> list[str]:
    """The last non-empty ``lines`` of a run's output (text, a file, or lines)."""
    if output is None:
        return []
    if isinstance(output, Path):
        try:
            output = output.read_text(errors="replace")
        except OSError as exc:
            return [f"(cannot read {output}: {exc})"]
    if isinstance(output, bytes):
        output = output.decode(errors="replace")
    text_lines = output.splitlines() if isinstance(output, str) else list(output)
    return [line.rstrip() for line in text_lines if line.strip()][-lines:]


@dataclass
class RunFailure:
    """One measured run that failed: what it was, its command, what was wrong, and
    the last lines of its output."""

    label: str
    argv: list[str]
    problems: list[str]
    tail: list[str] = field(default_factory=list)

    def text(self) -> str:
        """The run as printed: label, problems, command, output tail."""
        lines = [
            f"run {self.label}: {'; '.join(self.problems)}",
            f"  command: {shlex.join(self.argv)}",
        ]
        if self.tail:
            lines.append("  last lines of its stderr/output:")
            lines += [f"    {line}" for line in self.tail]
        else:
            lines.append("  (it printed nothing)")
        return "\n".join(lines)


@dataclass
class Runs:
    """The measured runs of one benchmark, each checked the same way
    (:meth:`check`); :func:`finish` turns the failures into the benchmark's result."""

    checked: int = 0
    failures: list[RunFailure] = field(default_factory=list)

    def check(
        self,
        label: str,
        argv: Sequence[str],
        code: int | None,
        *,
        expect_code: int | None = 0,
        output: str | bytes | Path | Sequence[str] | None = None,
        timings: Mapping[str, float | None] | None = None,
        cause: Mapping[str, Any] | None = None,
        expect_cause: Mapping[str, Any] | None = None,
        problems: Iterable[str] = (),
    ) -> bool:
        """Whether one run did what was measured: it ended (``code`` None: it did not),
        with ``expect_code`` (None: any), every timing in ``timings`` was taken and is
        positive, the root cause it named (``cause``) matches ``expect_cause``, and the
        benchmark saw no other ``problems`` of its own. A failure is kept with ``argv``
        and the tail of ``output``."""
        self.checked += 1
        problems = [p for p in problems if p]
        if code is None:
            problems.append("did not end within its timeout")
        elif expect_code is not None and code != expect_code:
            problems.append(f"exit code {code}, expected {expect_code}")
        for name, value in (timings or {}).items():
            if value is None:
                problems.append(f"no {name} was measured")
            elif value <= 0:
                problems.append(f"{name} is {value!r}: not a measurement")
        for key, want in (expect_cause or {}).items():
            got = (cause or {}).get(key)
            if got != want:
                problems.append(f"root cause {key} {got!r}, expected {want!r}")
        if problems:
            self.failures.append(RunFailure(label, list(argv), problems, output_tail(output)))
        return not problems

    def check_records(
        self,
        label: str,
        records: Iterable[Mapping[str, Any]],
        *,
        expect_code: int | None = 0,
        timing: str | None = None,
    ) -> None:
        """:meth:`check` for each run recorded as a dict: its ``exit_code`` (or the
        worst of ``exit_codes``), ``argv``, output (``output_tail``/``stderr_tail``)
        and, when ``timing`` names a key, that timing."""
        for n, rec in enumerate(records, 1):
            codes = rec.get("exit_codes")
            if codes is None:
                code = rec.get("exit_code")
            else:
                code = None if None in codes else next((c for c in codes if c != 0), 0)
            self.check(
                f"{label} {n}",
                [str(a) for a in rec.get("argv") or ["(command not recorded)"]],
                code,
                expect_code=expect_code,
                output=rec.get("output_tail") or rec.get("stderr_tail"),
                timings={timing: rec.get(timing)} if timing else None,
            )


def figure_problems(metrics: Iterable[Mapping[str, Any]]) -> list[str]:
    """The targeted rows without a real figure: no value, or a time of 0."""
    problems = []
    for row in metrics:
        target = str(row.get("target") or "-").strip()
        if target in ("-", ""):
            continue
        value, unit = row.get("value"), str(row.get("unit") or "")
        if value is None:
            problems.append(f"no figure for {row.get('metric')!r}")
        elif unit in TIME_UNITS and isinstance(value, int | float) and value == 0:
            problems.append(f"{row.get('metric')!r} is 0 {unit}: never measured")
    return problems


def finish(name: str, doc: dict[str, Any], runs: Runs | None = None) -> int:
    """Write ``results/<name>.json`` and return the benchmark's exit code: 1 when a
    measured run failed, a targeted figure is missing or ``doc`` says ``failed``
    (the result then says ``failed`` with the reason and ``failed_runs``, and each
    failing run's command and last output lines go to stderr), else 0."""
    runs = runs or Runs()
    problems = figure_problems(doc.get("metrics") or [])
    failed = bool(runs.failures or problems or doc.get("status") == "failed")
    if failed:
        reasons = [str(doc.get("reason") or "")] if doc.get("status") == "failed" else []
        if runs.failures:
            reasons.append(f"{len(runs.failures)} of {runs.checked} measured run(s) failed")
        reasons += problems
        doc.update(
            status="failed",
            reason="; ".join(r for r in reasons if r) or "failed",
            met=False,
            failed_runs=[asdict(f) for f in runs.failures],
        )
    write_result(name, doc)
    if not failed:
        return SKIP_EXIT if doc.get("status") == "skipped" else 0
    out = [f"[bench] {name} FAILED: {doc['reason']}"]
    out += [f.text() for f in runs.failures[:SHOWN_FAILURES]]
    if len(runs.failures) > SHOWN_FAILURES:
        out.append(f"... and {len(runs.failures) - SHOWN_FAILURES} more failing run(s)")
    if runs.failures:
        first = runs.failures[0]
        out.append(f"{name}: FAILED: run {first.label}: {'; '.join(first.problems)}")
    else:
        out.append(f"{name}: FAILED: {doc['reason']}")
    print("\n".join(out), file=sys.stderr, flush=True)
    return 1


def seconds_text(value: float | None) -> str:
    """A time for a summary line: ``1.234 s``, or ``-`` when it was not measured."""
    return "-" if value is None else f"{value:.3f} s"
