"""Check 2, hardware: GPUs (model, memory) against the ranks per host, RDMA
devices, CPUs and free memory."""

from __future__ import annotations

from typing import Any

from corral.checks.context import CheckContext
from corral.checks.result import CheckResult, HostCheck, Status
from corral.diagnose.gpu import rank_sharing

NAME = "hardware"
LOW_MEMORY_BYTES = 1 << 30
_GIB = float(1 << 30)
_SEVERITY = {"fail": Status.FAIL, "warn": Status.WARN, "info": Status.PASS}


def _gpu_text(gpus: list[dict[str, Any]]) -> str:
    if not gpus:
        return "no GPU"
    names = sorted({str(g.get("name")) for g in gpus})
    mem = gpus[0].get("memory_mib")
    text = f"{len(gpus)}x {', '.join(names)}"
    return text + (f" {int(mem) / 1024:.0f} GiB" if mem else "")


def check(ctx: CheckContext) -> CheckResult:
    """Per host: GPUs vs ranks when the job uses GPUs, RDMA (warn when GPUs have
    none: NCCL falls back to TCP), CPUs and available memory."""
    answered = ctx.answered()
    uses_gpus = any(f.facts.get("hardware", {}).get("gpus") for f in answered)
    hosts: dict[str, HostCheck] = {}
    no_rdma: list[str] = []
    sharing_fix = ""
    data: dict[str, Any] = {}
    for host in ctx.cluster.hosts:
        f = ctx.facts[host.name]
        if not f.ok:
            hosts[host.name] = HostCheck(Status.SKIP, "host did not answer")
            continue
        hw = f.facts.get("hardware", {})
        gpus = hw.get("gpus") or []
        mem = hw.get("memory", {})
        avail = mem.get("available")
        rdma = hw.get("rdma") or []
        nproc = ctx.nproc(host)
        data[host.name] = {
            "gpus": gpus,
            "rdma": rdma,
            "cpus": hw.get("cpus"),
            "memory_available": avail,
            "memory_total": mem.get("total"),
        }
        parts = [_gpu_text(gpus), f"{hw.get('cpus')} CPUs"]
        if avail is not None:
            parts.append(f"{avail / _GIB:.1f} GiB free")
        status = Status.PASS
        problems: list[str] = []
        if uses_gpus:
            if not gpus:
                status = Status.WARN
                problems.append("no GPU while other hosts have GPUs")
            elif shared := rank_sharing(host.name, nproc, len(gpus), ctx.options.backend):
                # fatal only for NCCL: gloo/CPU ranks may share GPUs (see the gpu check)
                status = _SEVERITY[shared.severity]
                problems.append(shared.text)
                sharing_fix = sharing_fix or shared.advice
            elif nproc < len(gpus):
                status = Status.WARN
                problems.append(f"{nproc} ranks use {nproc} of {len(gpus)} GPUs")
            if gpus and not rdma:
                no_rdma.append(host.name)
                if status is Status.PASS:
                    status = Status.WARN
                problems.append("no RDMA device: NCCL falls back to TCP sockets")
        parts.append(f"RDMA {', '.join(rdma)}" if rdma else "no RDMA")
        if avail is not None and avail < LOW_MEMORY_BYTES:
            if status is Status.PASS:
                status = Status.WARN
            problems.append(f"only {avail / _GIB:.2f} GiB of memory available")
        detail = "; ".join(problems) if problems else ", ".join(parts)
        hosts[host.name] = HostCheck(status, detail)
    fix = None
    if no_rdma:
        fix = (
            "install the InfiniBand/RoCE drivers (check with `ibv_devinfo`), or run over "
            "TCP with --env NCCL_IB_DISABLE=1"
        )
    elif sharing_fix:
        fix = sharing_fix
    total_gpus = sum(len(d["gpus"]) for d in data.values())
    summary = f"{total_gpus} GPUs" if uses_gpus else "CPU only (no GPU on any host)"
    return CheckResult.from_hosts(NAME, hosts, summary=summary, fix_command=fix, data=data)
