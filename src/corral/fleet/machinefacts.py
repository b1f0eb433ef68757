"""What a machine is and how busy it is (standard library only).

Shipped to hosts with :mod:`corral.remote.python` together with
:mod:`corral.agent.hostfacts` (whose hardware readers it reuses), so it needs
no corral, psutil or torch on the host. :func:`main` prints one JSON line;
the coordinator imports the module directly for its own machine.

Linux is read from ``/proc``; macOS, best effort, from ``sysctl`` and
``vm_stat`` (no CPU percentage there). Nothing here raises for a missing
tool or file: the value is ``None`` (or an empty list) instead.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import shutil
import socket
import sys
import time
from typing import Any

from corral.agent.hostfacts import hardware, memory, run_output

_GPU_LOAD_QUERY = [
    "nvidia-smi",
    "--query-gpu=index,utilization.gpu,memory.used",
    "--format=csv,noheader,nounits",
]


def _sysctl_int(name: str) -> int | None:
    out = run_output(["sysctl", "-n", name], timeout=5.0)
    try:
        return int(out.strip()) if out else None
    except ValueError:
        return None


def _darwin_available_bytes() -> int | None:
    """Free + inactive + speculative pages from ``vm_stat`` (macOS)."""
    out = run_output(["vm_stat"], timeout=5.0)
    if not out:
        return None
    lines = out.splitlines()
    page = 4096
    if lines and "page size of" in lines[0]:
        with contextlib.suppress(ValueError):
            page = int(lines[0].split("page size of")[1].split()[0])
    pages = 0
    for line in lines[1:]:
        key, _, value = line.partition(":")
        if key.strip() in ("Pages free", "Pages inactive", "Pages speculative"):
            with contextlib.suppress(ValueError):
                pages += int(value.strip().rstrip("."))
    return pages * page


def _memory() -> tuple[int | None, int | None]:
    """(total, available) bytes: /proc/meminfo, else sysctl + vm_stat on macOS."""
    values = memory()
    total, available = values["total"], values["available"]
    if total is None and sys.platform == "darwin":
        total = _sysctl_int("hw.memsize")
        available = _darwin_available_bytes()
    return total, available


def disk(path: str | None = None) -> dict[str, Any]:
    """Size and free space of the filesystem holding ``path`` (default: the home dir)."""
    where = os.path.expanduser(path or "~")
    info: dict[str, Any] = {"path": where, "total_bytes": None, "free_bytes": None}
    try:
        usage = shutil.disk_usage(where)
    except OSError as exc:
        info["error"] = exc.strerror or str(exc)
        return info
    info["total_bytes"], info["free_bytes"] = usage.total, usage.free
    return info


def capabilities(path: str | None = None) -> dict[str, Any]:
    """What this machine has: CPUs, memory, the disk of ``path`` (home dir by default)
    and its GPUs (``index``, ``name``, ``memory_mib``, from nvidia-smi or the driver)."""
    hw = hardware()
    cpus = hw["cpus"] or _sysctl_int("hw.ncpu") or 0
    total, _ = _memory()
    gpus = [
        {"index": i, "name": g["name"], "memory_mib": g["memory_mib"]}
        for i, g in enumerate(hw["gpus"])
    ]
    sizes = [g["memory_mib"] for g in gpus if g["memory_mib"] is not None]
    return {
        "hostname": socket.gethostname(),
        "platform": f"{platform.system()}-{platform.release()}-{platform.machine()}",
        "python": ".".join(str(v) for v in sys.version_info[:3]),
        "cpus": cpus,
        "memory_bytes": total,
        "disk": disk(path),
        "gpus": gpus,
        "gpu_count": len(gpus),
        "gpu_memory_mib": sum(sizes),
        "gpu_memory_min_mib": min(sizes) if sizes else None,
    }


def _cpu_times() -> tuple[int, int] | None:
    """(busy, total) jiffies of all CPUs from /proc/stat (guest time is in user already)."""
    try:
        with open("/proc/stat") as fh:
            fields = fh.readline().split()
        if fields[:1] != ["cpu"]:
            return None
        ticks = [int(v) for v in fields[1:9]]
    except (OSError, ValueError):
        return None
    idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)  # idle + iowait
    total = sum(ticks)
    return total - idle, total


def cpu_percent(sample_s: float = 0.2) -> float | None:
    """Busy share of all CPUs over ``sample_s`` seconds; None without /proc/stat."""
    first = _cpu_times()
    if first is None:
        return None
    time.sleep(max(sample_s, 0.0))
    second = _cpu_times()
    if second is None:
        return None
    busy, total = second[0] - first[0], second[1] - first[1]
    if total <= 0:
        return 0.0
    return round(min(max(100.0 * busy / total, 0.0), 100.0), 1)


def _number(text: str) -> float | None:
    try:
        return float(text.strip())
    except ValueError:  # "[N/A]", "[Not Supported]"
        return None


def gpu_load() -> list[dict[str, Any]]:
    """Per-GPU utilisation and used memory from nvidia-smi; [] without it (never fails)."""
    if not shutil.which("nvidia-smi"):
        return []
    out = run_output(_GPU_LOAD_QUERY)
    found = []
    for line in (out or "").splitlines():
        cols = line.split(",")
        if len(cols) != 3:
            continue
        index = _number(cols[0])
        if index is None:
            continue
        used = _number(cols[2])
        found.append(
            {
                "index": int(index),
                "utilization_percent": _number(cols[1]),
                "memory_used_mib": None if used is None else int(used),
            }
        )
    return found


def load(sample_s: float = 0.2) -> dict[str, Any]:
    """How busy this machine is now: CPU share over ``sample_s`` seconds, memory in
    use, the load averages and per-GPU utilisation."""
    total, available = _memory()
    mem_percent = None
    if total and available is not None:
        mem_percent = round(100.0 * (total - available) / total, 1)
    try:
        load_avg: list[float] | None = [round(v, 2) for v in os.getloadavg()]
    except (AttributeError, OSError):
        load_avg = None
    return {
        "cpu_percent": cpu_percent(sample_s),
        "memory_percent": mem_percent,
        "load_avg": load_avg,
        "gpus": gpu_load(),
    }


def main(params: dict[str, Any] | None = None) -> int:
    """Print one JSON line: ``{"capabilities", "load", "took_s"}`` (``took_s``: the
    seconds spent gathering, which the coordinator takes off its round trip).
    ``params``: ``path`` (the disk to report) and ``sample_s`` (CPU sampling)."""
    params = params or {}
    started = time.monotonic()
    facts: dict[str, Any] = {
        "capabilities": capabilities(params.get("path")),
        "load": load(float(params.get("sample_s", 0.2))),
    }
    facts["took_s"] = round(time.monotonic() - started, 6)
    sys.stdout.write(json.dumps(facts) + "\n")
    sys.stdout.flush()
    return 0
