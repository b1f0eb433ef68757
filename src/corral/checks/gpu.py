"""Check ``gpu``: GPU health through NVML on every host (see
:mod:`corral.diagnose.gpu` for what fails and what warns). The facts come from
:func:`corral.agent.gpuprobe.probe`, run by the checklist's host session
(``gpu_health`` in the facts); a host without GPUs is skipped ("no GPUs")."""

from __future__ import annotations

from typing import Any

from corral.checks.context import CheckContext
from corral.checks.result import CheckResult, HostCheck, Status
from corral.diagnose.gpu import HostHealth, HostInput, evaluate

NAME = "gpu"
FACTS_KEY = "gpu_health"


def _inputs(ctx: CheckContext) -> dict[str, HostInput]:
    """One input per host; ``local:N`` is one machine whose GPUs all its nodes share."""
    hosts = list(ctx.cluster.hosts)
    if ctx.is_local:
        hosts = hosts[:1]
    inputs = {}
    for host in hosts:
        f = ctx.facts[host.name]
        ranks = sum(ctx.nproc(h) for h in ctx.cluster.hosts) if ctx.is_local else ctx.nproc(host)
        inputs[host.name] = HostInput(
            probe=f.facts.get(FACTS_KEY) if f.ok else None,
            ranks=ranks,
            torch_cuda=(f.facts.get("software") or {}).get("cuda") if f.ok else None,
            backend=ctx.options.backend,
        )
    return inputs


def check(ctx: CheckContext) -> CheckResult:
    """Per host: the GPU health verdict, with a fix command per finding."""
    health = evaluate(_inputs(ctx), ctx.options.job_id)
    summary = _summary(health)
    if ctx.is_local:
        only = next(iter(health.values()))
        health = {h.name: only for h in ctx.cluster.hosts}
    hosts: dict[str, HostCheck] = {}
    fixes: list[str] = []
    data: dict[str, Any] = {}
    for name, verdict in health.items():
        hosts[name] = HostCheck(Status(verdict.status), verdict.detail)
        data[name] = {
            "gpus": verdict.gpus,
            "findings": [f.to_json() for f in verdict.findings],
        }
        if ctx.is_local and name != ctx.cluster.hosts[0].name:
            continue
        host = ctx.cluster.host(name) if not ctx.is_local else ctx.cluster.hosts[0]
        for f in verdict.findings:
            if f.fix_argv:
                argv = list(f.fix_argv)
                fixes.append(" ".join(argv) if ctx.is_local else ctx.ssh(host, argv))
            elif f.advice:
                fixes.append(f.advice)
    return CheckResult.from_hosts(
        NAME,
        hosts,
        summary=summary,
        fix_command="; ".join(dict.fromkeys(fixes)) or None,
        data=data,
    )


def _summary(health: dict[str, HostHealth]) -> str:
    total = sum(h.gpus for h in health.values())
    if not total:
        return "no GPUs"
    bad = sum(1 for h in health.values() if h.status in ("warn", "fail"))
    return f"{total} GPUs healthy" if not bad else f"{total} GPUs, {bad} host(s) with findings"
