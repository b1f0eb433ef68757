"""Judge every host's GPU health (pure: no I/O).

The input is what :func:`corral.agent.gpuprobe.probe` answered on each host;
the output is one :class:`HostHealth` per host: a status (``skip``, ``pass``,
``warn`` or ``fail``, the words of :mod:`corral.checks.result`) and the
:class:`Finding` behind it, each with a fix. What fails: fewer GPUs than ranks
for an NCCL job (NCCL refuses two ranks on one GPU; for gloo/CPU ranks, or a job
whose backend is not declared, it is a warning or a note: see :func:`job_backend`),
volatile uncorrectable ECC errors, a failed row remapping, Xid errors that mean
broken hardware, a driver too old for torch's CUDA major version. What warns:
rows or pages waiting for a GPU reset, other Xid errors, throttling, GPU memory
held by processes that are not this job, drivers or CUDA versions that differ
across hosts, NVML missing on a host with NVIDIA devices. A host without GPUs
is ``skip`` ("no GPUs"): nothing fails there.
"""

from __future__ import annotations

import importlib
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from corral.agent.gpuprobe import EXTRA_HINT, SLOWDOWN_REASONS
from corral.contract import BACKEND_ENV
from corral.errors import ConfigError

Severity = Literal["fail", "warn", "info"]
State = Literal["skip", "pass", "warn", "fail"]

#: Xid codes that mean the GPU or its memory is broken (NVIDIA's Xid catalogue):
#: double-bit ECC, row-remapping failure, fallen off the bus, uncontained ECC, GSP
#: errors, unrecovered ECC, a GPU needing a reset or reboot.
HARDWARE_XIDS = {
    48: "double-bit ECC error",
    64: "row remapping failure",
    79: "fell off the bus",
    95: "uncontained ECC error",
    119: "GSP timeout",
    120: "GSP error",
    140: "unrecovered ECC error",
    154: "GPU recovery action required",
}
#: Xid codes a program causes (its own fault, not the GPU's): listed, never warned.
APPLICATION_XIDS = {13, 31, 43, 45}
_MIB = 1 << 20


@dataclass(frozen=True)
class Finding:
    """One problem on one host (``gpu``: its index, None for the host as a whole).
    ``fix_argv`` is a command to run on the host; ``advice`` says what else to do."""

    host: str
    kind: str
    severity: Severity
    text: str
    gpu: int | None = None
    fix_argv: tuple[str, ...] = ()
    advice: str = ""

    def to_json(self) -> dict[str, Any]:
        """The ``--json`` form."""
        return {
            "host": self.host,
            "kind": self.kind,
            "severity": self.severity,
            "gpu": self.gpu,
            "text": self.text,
            "fix": list(self.fix_argv) or None,
            "advice": self.advice or None,
        }


@dataclass
class HostHealth:
    """One host's verdict: the status, a one-line detail and the findings."""

    status: State
    detail: str
    findings: list[Finding] = field(default_factory=list)
    gpus: int = 0


@dataclass(frozen=True)
class HostInput:
    """What the evaluator needs about one host: its probe answer, the ranks it runs,
    the CUDA version torch was built for there, and the job being checked."""

    probe: Mapping[str, Any] | None
    ranks: int = 1
    torch_cuda: str | None = None
    backend: str | None = None
    """``nccl``, ``gloo`` or None (not declared): see :func:`job_backend`."""


_BACKENDS = ("nccl", "gloo", "auto")


def job_backend(env: Mapping[str, str], *, where: str = "--env") -> str | None:
    """The collective backend a job's ranks use, as far as corral can know it before
    launch: the user's script chooses it, so the job declares it with
    ``CORRAL_BACKEND`` in its env (``--env CORRAL_BACKEND=nccl``; ``corral check``
    reads its own environment). ``auto`` is the SDK's choice, NCCL wherever there are
    GPUs, so it counts as ``nccl`` here; unset is None (not declared).
    :class:`~corral.errors.ConfigError` for any other value, naming ``where``."""
    raw = (env.get(BACKEND_ENV) or "").strip().lower()
    if not raw:
        return None
    if raw not in _BACKENDS:
        raise ConfigError(
            f"{BACKEND_ENV}={raw!r} is not a backend; use one of {', '.join(_BACKENDS)}",
            option=where,
        )
    return "nccl" if raw == "auto" else raw


def rank_sharing(
    name: str, ranks: int, usable: int, backend: str | None, visible: Any = None
) -> Finding | None:
    """More ranks than GPUs on host ``name``: fatal for NCCL ("Duplicate GPU
    detected"), fine for gloo (a note), a warning naming when it would fail while the
    job's backend is not declared (``backend``: see :func:`job_backend`)."""
    if ranks <= usable:
        return None
    seen = f"{ranks} ranks but {usable} GPU(s)" + (
        f" (CUDA_VISIBLE_DEVICES={visible})" if visible is not None else ""
    )
    fit = "pass --nproc-per-node N with N <= GPUs, or fix the slots"
    if backend == "nccl":
        return Finding(
            name,
            "count",
            "fail",
            f"{seen}: NCCL refuses two ranks on one GPU",
            advice=f"{fit} ({BACKEND_ENV}=nccl)",
        )
    if backend == "gloo":
        return Finding(name, "count", "info", f"{seen}: ranks share GPUs (gloo, {BACKEND_ENV})")
    return Finding(
        name,
        "count",
        "warn",
        f"{seen}: fine for gloo/CPU ranks; NCCL ranks would fail (two ranks on one GPU: "
        '"Duplicate GPU detected")',
        advice=f"for NCCL {fit}; declare the backend with --env {BACKEND_ENV}=nccl|gloo",
    )


def require_nvml() -> Any:
    """``pynvml``, or :class:`~corral.errors.ConfigError` naming the extra."""
    try:
        return importlib.import_module("pynvml")
    except ImportError:
        raise ConfigError(f"NVML is needed here and is not installed: {EXTRA_HINT}") from None


def _version(text: str | None) -> tuple[int, int] | None:
    try:
        major, minor = (text or "").split(".")[:2]
        return int(major), int(minor)
    except ValueError:
        return None


def _gib(nbytes: int | None) -> str:
    return "?" if nbytes is None else f"{nbytes / (1 << 30):.1f} GiB"


def _proc_text(p: Mapping[str, Any]) -> str:
    owner = p.get("owner") or "unknown owner"
    cmd = p.get("cmdline") or "not in this host's /proc (another container?)"
    held = "" if p.get("memory") is None else f" holds {p['memory'] // _MIB} MiB"
    return f"PID {p['pid']} ({owner}: {cmd[:80]}){held}"


def _gpu_findings(host: str, g: Mapping[str, Any], job_id: str | None) -> list[Finding]:
    idx = g.get("index")
    reset = ("nvidia-smi", "--gpu-reset", "-i", str(idx))
    out: list[Finding] = []
    ecc = g.get("ecc_uncorrected")
    if ecc:
        out.append(
            Finding(
                host,
                "ecc",
                "fail",
                f"GPU {idx}: {ecc} uncorrectable ECC error(s) since the driver loaded",
                idx,
                reset,
                "reset the GPU (no process may use it); replace it if they recur",
            )
        )
    rows = g.get("remapped_rows") or {}
    if rows.get("failed"):
        out.append(
            Finding(
                host,
                "remap",
                "fail",
                f"GPU {idx}: row remapping failed "
                f"({rows.get('uncorrectable', 0)} uncorrectable row(s))",
                idx,
                advice=f"drain {host}: the GPU needs replacing",
            )
        )
    elif rows.get("pending"):
        out.append(
            Finding(
                host,
                "remap",
                "warn",
                f"GPU {idx}: remapped rows pending a GPU reset",
                idx,
                reset,
                "reset the GPU (or reboot) to apply them",
            )
        )
    if g.get("retired_pending"):
        out.append(
            Finding(
                host,
                "retired",
                "warn",
                f"GPU {idx}: retired pages pending a GPU reset",
                idx,
                reset,
                "reset the GPU (or reboot) to retire them",
            )
        )
    reasons = int(g.get("clock_reasons") or 0)
    slow = [name for bit, name in SLOWDOWN_REASONS.items() if reasons & bit]
    if slow:
        out.append(
            Finding(
                host,
                "throttle",
                "warn",
                f"GPU {idx}: clocks slowed ({', '.join(slow)})",
                idx,
                ("nvidia-smi", "-q", "-d", "PERFORMANCE,TEMPERATURE,POWER", "-i", str(idx)),
                "check the cooling and the power limit",
            )
        )
    foreign = [p for p in g.get("processes") or [] if not job_id or p.get("job") != job_id]
    if foreign:
        mem = sum(int(p.get("memory") or 0) for p in foreign)
        kill = tuple(str(p["pid"]) for p in foreign if p.get("cmdline"))
        out.append(
            Finding(
                host,
                "foreign",
                "warn",
                f"GPU {idx}: {_gib(mem)} held by " + ", ".join(_proc_text(p) for p in foreign),
                idx,
                ("kill", *kill) if kill else (),
                "stop them (an orphan of an earlier job?) or pick other GPUs",
            )
        )
    return out


def _xid_findings(host: str, xids: list[Mapping[str, Any]]) -> list[Finding]:
    by_code: dict[tuple[int, int | None], list[Mapping[str, Any]]] = {}
    for x in xids:
        by_code.setdefault((int(x["xid"]), x.get("gpu")), []).append(x)
    out = []
    for (code, gpu), seen in sorted(by_code.items(), key=lambda kv: (kv[0][0], kv[0][1] or -1)):
        if code in APPLICATION_XIDS:
            continue
        where = f"GPU {gpu}" if gpu is not None else f"PCI {seen[-1].get('bus') or '?'}"
        what = HARDWARE_XIDS.get(code) or str(seen[-1].get("text") or "")[:80]
        text = f"{where}: Xid {code} ({what}) x{len(seen)} since boot"
        hardware = code in HARDWARE_XIDS
        out.append(
            Finding(
                host,
                "xid",
                "fail" if hardware else "warn",
                text,
                gpu,
                ("nvidia-smi", "--gpu-reset", "-i", str(gpu))
                if gpu is not None and hardware
                else (),
                "reset the GPU or reboot; replace it if it recurs"
                if hardware
                else "see NVIDIA's Xid catalogue for this code",
            )
        )
    return out


def _host(name: str, item: HostInput, job_id: str | None, others_have_gpus: bool) -> HostHealth:
    p = item.probe
    if p is None:
        return HostHealth("skip", "host did not answer")
    state = p.get("state")
    if state != "ok":
        if state == "nvml_missing" and p.get("devices"):
            f = Finding(
                name,
                "nvml",
                "warn",
                f"NVIDIA devices but {p.get('detail')}",
                advice=f"on {name}: {EXTRA_HINT}",
            )
            return HostHealth("warn", f.text, [f])
        if state == "error":
            f = Finding(
                name,
                "nvml",
                "warn",
                str(p.get("detail") or "NVML failed"),
                advice="check the driver: `nvidia-smi` on the host",
            )
            return HostHealth("warn", f.text, [f])
        if others_have_gpus:
            f = Finding(name, "count", "warn", "no GPUs while other hosts have GPUs")
            return HostHealth("warn", f.text, [f])
        return HostHealth("skip", "no GPUs")
    gpus = list(p.get("gpus") or [])
    visible = p.get("visible")
    usable = len(gpus)
    if visible is not None:
        usable = len([v for v in str(visible).split(",") if v.strip()])
    findings: list[Finding] = []
    count = rank_sharing(name, item.ranks, usable, item.backend, visible)
    if count is not None:
        findings.append(count)
    for g in gpus:
        findings += _gpu_findings(name, g, job_id)
    findings += _xid_findings(name, list(p.get("xid") or []))
    torch_v, driver_v = _version(item.torch_cuda), _version(p.get("cuda"))
    if torch_v and driver_v and torch_v > driver_v:
        major = torch_v[0] > driver_v[0]
        findings.append(
            Finding(
                name,
                "cuda",
                "fail" if major else "warn",
                f"torch is built for CUDA {item.torch_cuda}, the driver "
                f"{p.get('driver')} supports CUDA {p.get('cuda')}",
                advice="upgrade the NVIDIA driver, or install a torch built for "
                f"CUDA {p.get('cuda')}",
            )
        )
    status: State = "pass"
    if any(f.severity == "fail" for f in findings):
        status = "fail"
    elif any(f.severity == "warn" for f in findings):
        status = "warn"
    detail = "; ".join(f.text for f in findings if f.severity != "info")
    if not detail:
        names = Counter(str(g.get("name")) for g in gpus)
        detail = "; ".join(
            [
                ", ".join(f"{n}x {k}" for k, n in names.items()),
                f"driver {p.get('driver')}, CUDA {p.get('cuda')}",
                *(f.text for f in findings if f.kind == "count"),
            ]
        )
    return HostHealth(status, detail, findings, len(gpus))


def _versions(health: dict[str, HostHealth], inputs: Mapping[str, HostInput]) -> list[Finding]:
    """A warning on every host whose driver or CUDA version differs from the most
    common one."""
    out: list[Finding] = []
    for key, label in (("driver", "driver"), ("cuda", "CUDA")):
        seen = {
            h: str(i.probe.get(key))
            for h, i in inputs.items()
            if i.probe is not None and i.probe.get("state") == "ok" and i.probe.get(key)
        }
        if len(set(seen.values())) < 2:
            continue
        common = Counter(seen.values()).most_common(1)[0][0]
        for h, v in seen.items():
            if v != common:
                out.append(
                    Finding(
                        h,
                        "version",
                        "warn",
                        f"{label} {v} differs from the other hosts' {common}",
                        advice=f"install {label} {common} on {h}",
                    )
                )
    return out


def evaluate(inputs: Mapping[str, HostInput], job_id: str | None = None) -> dict[str, HostHealth]:
    """Every host's :class:`HostHealth` (see the module docstring for what fails)."""
    have = {h for h, i in inputs.items() if i.probe and i.probe.get("state") == "ok"}
    health = {h: _host(h, i, job_id, bool(have - {h})) for h, i in inputs.items()}
    for f in _versions(health, inputs):
        hh = health[f.host]
        hh.findings.append(f)
        hh.detail = "; ".join(x.text for x in hh.findings)
        if hh.status == "pass":
            hh.status = "warn"
    return health
