"""Check 8, stale processes: processes of an earlier corral job still alive on a
host, or anything holding its GPUs or the rendezvous port (a warning with the
PIDs and the command that stops them). The job being checked is never counted:
the host side skips processes with its ``CORRAL_JOB_ID`` (the agents ``corral
run`` starts while the checklist runs) and the check session's own family."""

from __future__ import annotations

from typing import Any

from corral.checks.context import CheckContext
from corral.checks.result import CheckResult, HostCheck, Status

NAME = "stale"


def check(ctx: CheckContext) -> CheckResult:
    """Warn per host with what is left over; pass when nothing is."""
    hosts: dict[str, HostCheck] = {}
    data: dict[str, Any] = {}
    fixes: list[str] = []
    for host in ctx.cluster.hosts:
        f = ctx.facts[host.name]
        if not f.ok:
            hosts[host.name] = HostCheck(Status.SKIP, "host did not answer")
            continue
        jobs = f.facts.get("stale") or []
        gpu = f.facts.get("gpu_processes") or []
        port: list[dict[str, Any]] = []
        listener = f.facts.get("listener") or {}
        if listener and not listener.get("free", True):
            port = listener.get("holders") or []
        data[host.name] = {"corral": jobs, "gpu": gpu, "port": port}
        pids = sorted({p["pid"] for p in [*jobs, *gpu, *port]})
        if not pids:
            hosts[host.name] = HostCheck(Status.PASS, "none")
            continue
        parts = []
        if jobs:
            ids = sorted({str(p["job"]) for p in jobs if p.get("job")})
            parts.append(
                f"{len(jobs)} process(es) of corral job(s) {', '.join(ids) or '?'}: "
                + " ".join(str(p["pid"]) for p in jobs)
            )
        if gpu:
            parts.append("GPU in use by PID " + " ".join(str(p["pid"]) for p in gpu))
        if port:
            parts.append(
                f"port {ctx.options.master_port} held by PID "
                + " ".join(str(p["pid"]) for p in port)
            )
        hosts[host.name] = HostCheck(Status.WARN, "; ".join(parts))
        kill = ["kill", *(str(p) for p in pids)]
        fixes.append(" ".join(kill) if ctx.is_local else ctx.ssh(host, kill))
    if ctx.is_local and fixes:
        fixes = list(dict.fromkeys(fixes))
    return CheckResult.from_hosts(
        NAME,
        hosts,
        summary="no leftover processes",
        fix_command="; ".join(fixes) or None,
        data=data,
    )
