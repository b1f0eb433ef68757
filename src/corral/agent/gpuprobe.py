"""GPU health on one host, read through NVML (standard library only, ``pynvml``
imported lazily: shipped over stdin by :mod:`corral.remote.python`, and imported
directly by the node agent for its samples).

Everything NVML answers goes through the small :class:`Nvml` seam: the real
:class:`PyNvml` (``nvidia-ml-py``, import name ``pynvml``) or a fake in tests.
:func:`probe` is what the pre-flight asks each host: the driver and CUDA
versions, every GPU's ECC, remapped/retired rows, clock event (throttle)
reasons and compute processes (named with owner and command line), plus the
``NVRM: Xid`` lines of the kernel log since boot. A host without GPUs answers
``{"state": "no_gpus"}``; without ``pynvml`` it answers ``"nvml_missing"``
(``devices`` says whether ``/dev/nvidia*`` exists, i.e. whether that matters).
:func:`sample` is the agent's per-GPU utilisation, memory and temperature.
"""

from __future__ import annotations

import contextlib
import glob
import importlib
import json
import os
import re
import shutil
import subprocess
import sys
from typing import Any, Protocol

#: The extra that installs NVML's bindings (named in every message that needs them).
EXTRA_HINT = "pip install 'corral[gpu]' (or nvidia-ml-py)"
#: Clock event reasons that mean a GPU runs slower than it could (NVML bit -> name).
SLOWDOWN_REASONS = {
    0x4: "software power cap",
    0x8: "hardware slowdown",
    0x20: "software thermal slowdown",
    0x40: "hardware thermal slowdown",
    0x80: "hardware power brake",
}
_XID = re.compile(
    r"NVRM: Xid \((?:PCI:)?(?P<bus>[0-9a-fA-F]+:[0-9a-fA-F]+:[0-9a-fA-F]+)[^)]*\): (?P<xid>\d+),"
    r"\s*(?P<text>.*)"
)
MAX_XID_LINES = 50


class Nvml(Protocol):
    """The NVML answers corral uses (None: the GPU does not support the query)."""

    def driver_version(self) -> str:
        """The driver's version, e.g. ``550.54.15``."""
        ...

    def cuda_version(self) -> str | None:
        """The newest CUDA the driver supports, e.g. ``12.4``."""
        ...

    def count(self) -> int:
        """GPUs visible to NVML."""
        ...

    def device(self, index: int) -> dict[str, Any]:
        """``{"name", "uuid", "bus_id", "memory_total", "memory_used"}`` (bytes)."""
        ...

    def ecc_uncorrected(self, index: int) -> int | None:
        """Volatile (since the driver loaded) uncorrectable ECC errors."""
        ...

    def remapped_rows(self, index: int) -> dict[str, Any] | None:
        """``{"correctable", "uncorrectable", "pending", "failed"}`` (Ampere and newer)."""
        ...

    def retired_pending(self, index: int) -> bool | None:
        """Whether retired pages wait for a GPU reset (before Ampere)."""
        ...

    def clock_reasons(self, index: int) -> int | None:
        """The current clock event (throttle) reasons, a bit mask."""
        ...

    def processes(self, index: int) -> list[tuple[int, int | None]]:
        """``(pid, used memory in bytes or None)`` of every compute process."""
        ...

    def utilization(self, index: int) -> int | None:
        """GPU utilisation over the last sample period, percent."""
        ...

    def temperature(self, index: int) -> int | None:
        """The GPU's temperature, degrees Celsius."""
        ...


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


class PyNvml:
    """:class:`Nvml` over ``pynvml`` (initialised by :func:`open_nvml`)."""

    def __init__(self, module: Any) -> None:
        self.nv = module
        self._handles: dict[int, Any] = {}

    def _h(self, index: int) -> Any:
        if index not in self._handles:
            self._handles[index] = self.nv.nvmlDeviceGetHandleByIndex(index)
        return self._handles[index]

    def _maybe(self, call: str, *args: Any) -> Any:
        """``nvml<call>(*args)``; None when the GPU or driver does not support it."""
        fn = getattr(self.nv, call, None)
        if fn is None:
            return None
        try:
            return fn(*args)
        except self.nv.NVMLError:
            return None

    def driver_version(self) -> str:
        return _text(self.nv.nvmlSystemGetDriverVersion())

    def cuda_version(self) -> str | None:
        raw = self._maybe("nvmlSystemGetCudaDriverVersion")
        return None if not raw else f"{int(raw) // 1000}.{int(raw) % 1000 // 10}"

    def count(self) -> int:
        return int(self.nv.nvmlDeviceGetCount())

    def device(self, index: int) -> dict[str, Any]:
        h = self._h(index)
        mem = self._maybe("nvmlDeviceGetMemoryInfo", h)
        pci = self._maybe("nvmlDeviceGetPciInfo", h)
        uuid = self._maybe("nvmlDeviceGetUUID", h)
        return {
            "name": _text(self.nv.nvmlDeviceGetName(h)),
            "uuid": _text(uuid) if uuid is not None else None,
            "bus_id": _text(pci.busId) if pci is not None else None,
            "memory_total": int(mem.total) if mem is not None else None,
            "memory_used": int(mem.used) if mem is not None else None,
        }

    def ecc_uncorrected(self, index: int) -> int | None:
        nv = self.nv
        value = self._maybe(
            "nvmlDeviceGetTotalEccErrors",
            self._h(index),
            nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
            nv.NVML_VOLATILE_ECC,
        )
        return None if value is None else int(value)

    def remapped_rows(self, index: int) -> dict[str, Any] | None:
        rows = self._maybe("nvmlDeviceGetRemappedRows", self._h(index))
        if rows is None:
            return None
        corr, unc, pending, failed = rows
        return {
            "correctable": int(corr),
            "uncorrectable": int(unc),
            "pending": bool(pending),
            "failed": bool(failed),
        }

    def retired_pending(self, index: int) -> bool | None:
        value = self._maybe("nvmlDeviceGetRetiredPagesPendingStatus", self._h(index))
        return None if value is None else bool(value)

    def clock_reasons(self, index: int) -> int | None:
        h = self._h(index)
        value = self._maybe("nvmlDeviceGetCurrentClocksEventReasons", h)
        if value is None:
            value = self._maybe("nvmlDeviceGetCurrentClocksThrottleReasons", h)
        return None if value is None else int(value)

    def processes(self, index: int) -> list[tuple[int, int | None]]:
        procs = self._maybe("nvmlDeviceGetComputeRunningProcesses", self._h(index)) or []
        found = []
        for p in procs:
            used = getattr(p, "usedGpuMemory", None)
            found.append((int(p.pid), int(used) if isinstance(used, int) else None))
        return found

    def utilization(self, index: int) -> int | None:
        rates = self._maybe("nvmlDeviceGetUtilizationRates", self._h(index))
        return None if rates is None else int(rates.gpu)

    def temperature(self, index: int) -> int | None:
        value = self._maybe(
            "nvmlDeviceGetTemperature", self._h(index), getattr(self.nv, "NVML_TEMPERATURE_GPU", 0)
        )
        return None if value is None else int(value)


def nvidia_devices() -> bool:
    """Whether the host has NVIDIA device nodes (``/dev/nvidia0``, ...)."""
    return bool(glob.glob("/dev/nvidia[0-9]*"))


def open_nvml() -> tuple[Nvml | None, str, str]:
    """``(nvml, state, detail)``: ``state`` is ``ok`` (nvml set), ``nvml_missing``
    (no ``pynvml``), ``no_gpus`` (no driver / library: nothing to look at) or
    ``error`` (NVML failed; ``detail`` says how)."""
    try:
        module = importlib.import_module("pynvml")
    except ImportError:
        return None, "nvml_missing", f"NVML not installed: {EXTRA_HINT}"
    try:
        module.nvmlInit()
    except module.NVMLError as exc:
        code = getattr(exc, "value", None)
        absent = (
            getattr(module, "NVML_ERROR_LIBRARY_NOT_FOUND", 12),
            getattr(module, "NVML_ERROR_DRIVER_NOT_LOADED", 9),
        )
        if code in absent and not nvidia_devices():
            return None, "no_gpus", "no GPUs (no NVIDIA driver)"
        return None, "error", f"NVML could not start: {exc}"
    return PyNvml(module), "ok", ""


def close_nvml(nvml: Nvml | None) -> None:
    """Shut NVML down (:func:`open_nvml`'s real instance only)."""
    if isinstance(nvml, PyNvml):
        with contextlib.suppress(Exception):
            nvml.nv.nvmlShutdown()


# ----------------------------------------------------------------------- processes


def _owner(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/status", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if line.startswith("Uid:"):
                    uid = int(line.split()[1])
                    break
            else:
                return None
    except (OSError, ValueError, IndexError):
        return None
    try:
        import pwd

        return pwd.getpwuid(uid).pw_name
    except (ImportError, KeyError):
        return str(uid)


def _cmdline(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            raw = fh.read()
    except OSError:
        return None
    return " ".join(raw.decode(errors="replace").replace("\0", " ").split())[:200] or None


def _job(pid: int) -> str | None:
    with contextlib.suppress(OSError), open(f"/proc/{pid}/environ", "rb") as fh:
        for item in fh.read().split(b"\0"):
            if item.startswith(b"CORRAL_JOB_ID="):
                return item.split(b"=", 1)[1].decode(errors="replace")
    return None


def describe_process(pid: int, used: int | None) -> dict[str, Any]:
    """A GPU process: PID, owner, command line, corral job (if any), memory held.
    A PID not in this host's ``/proc`` (another PID namespace: a container) has
    no owner or command line."""
    return {
        "pid": pid,
        "owner": _owner(pid),
        "cmdline": _cmdline(pid),
        "job": _job(pid),
        "memory": used,
    }


# ----------------------------------------------------------------------- kernel log


def _run(argv: list[str], timeout: float = 10.0) -> str | None:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout if out.returncode == 0 else None


def kernel_log() -> tuple[str | None, str | None]:
    """``(text, source)``: the kernel log since boot from ``journalctl -k -b``, else
    ``dmesg``; ``(None, None)`` when neither can be read (no permission)."""
    for argv in (["journalctl", "-k", "-b", "--no-pager", "-q", "-o", "cat"], ["dmesg"]):
        if shutil.which(argv[0]) is None:
            continue
        text = _run(argv)
        if text:
            return text, argv[0]
    return None, None


def bus_key(bus_id: str | None) -> str | None:
    """``domain:bus:device`` as numbers (``0:59:0``), for matching the kernel's
    ``PCI:0000:3b:00`` with NVML's ``00000000:3B:00.0``."""
    if not bus_id:
        return None
    parts = bus_id.split(".")[0].split(":")
    if len(parts) != 3:
        return None
    try:
        return ":".join(str(int(p, 16)) for p in parts)
    except ValueError:
        return None


def xid_errors(text: str) -> list[dict[str, Any]]:
    """Every ``NVRM: Xid`` line of a kernel log: ``{"bus", "xid", "text"}`` (the
    last :data:`MAX_XID_LINES`)."""
    found = []
    for line in text.splitlines():
        match = _XID.search(line)
        if match:
            found.append(
                {
                    "bus": bus_key(match.group("bus")),
                    "xid": int(match.group("xid")),
                    "text": match.group("text").strip()[:200],
                }
            )
    return found[-MAX_XID_LINES:]


# ----------------------------------------------------------------------- the probe


def collect(nvml: Nvml, log: str | None, *, log_source: str | None = None) -> dict[str, Any]:
    """The health facts of every GPU behind ``nvml``, with the Xid lines of ``log``."""
    gpus = []
    for index in range(nvml.count()):
        info = nvml.device(index)
        info.update(
            index=index,
            ecc_uncorrected=nvml.ecc_uncorrected(index),
            remapped_rows=nvml.remapped_rows(index),
            retired_pending=nvml.retired_pending(index),
            clock_reasons=nvml.clock_reasons(index),
            processes=[describe_process(pid, used) for pid, used in nvml.processes(index)],
        )
        gpus.append(info)
    xids = xid_errors(log) if log is not None else []
    by_bus = {bus_key(g.get("bus_id")): g["index"] for g in gpus}
    for x in xids:
        x["gpu"] = by_bus.get(x["bus"])
    return {
        "state": "ok" if gpus else "no_gpus",
        "driver": nvml.driver_version(),
        "cuda": nvml.cuda_version(),
        "gpus": gpus,
        "xid": xids,
        "kernel_log": log_source if log is not None else None,
    }


def probe(params: dict[str, Any] | None = None) -> dict[str, Any]:
    """This host's GPU health (never raises): :func:`collect` over the real NVML, or
    ``{"state": "no_gpus" | "nvml_missing" | "error", "detail"}``. ``devices`` says
    whether ``/dev/nvidia*`` exists; ``visible`` is ``CUDA_VISIBLE_DEVICES``."""
    params = params or {}
    base = {"devices": nvidia_devices(), "visible": os.environ.get("CUDA_VISIBLE_DEVICES")}
    if not base["devices"] and not params.get("force_nvml"):
        # no NVIDIA device node: nothing NVML could see; skip loading it (it is on the
        # SSH pre-flight's path of every host)
        return {**base, "state": "no_gpus", "detail": "no GPUs (no /dev/nvidia*)"}
    nvml, state, detail = open_nvml()
    if nvml is None:
        return {**base, "state": state, "detail": detail}
    try:
        log, source = kernel_log() if params.get("kernel_log", True) else (None, None)
        return {**base, **collect(nvml, log, log_source=source)}
    except Exception as exc:  # a driver in a bad state: say so, never kill the check
        return {**base, "state": "error", "detail": f"NVML failed: {exc}"}
    finally:
        close_nvml(nvml)


def sample(nvml: Nvml) -> list[dict[str, Any]]:
    """Per GPU: utilisation (%), memory used and total (MiB), temperature (C) and
    the PIDs of its compute processes (to match a rank with its GPU)."""
    found = []
    for index in range(nvml.count()):
        info = nvml.device(index)
        used, total = info.get("memory_used"), info.get("memory_total")
        found.append(
            {
                "index": index,
                "util": nvml.utilization(index),
                "mem_used_mib": None if used is None else used // (1 << 20),
                "mem_total_mib": None if total is None else total // (1 << 20),
                "temp_c": nvml.temperature(index),
                "pids": [pid for pid, _ in nvml.processes(index)],
            }
        )
    return found


def main(params: dict[str, Any] | None = None) -> int:
    """Print :func:`probe`'s answer as one JSON line."""
    sys.stdout.write(json.dumps({"event": "gpu", **probe(params)}) + "\n")
    sys.stdout.flush()
    return 0
