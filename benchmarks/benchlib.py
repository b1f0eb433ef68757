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
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

import psutil

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
RESULTS_DIR = BENCH_DIR / "results"
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
