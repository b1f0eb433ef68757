"""Check 6, checkpoint directory: exists or can be created, is writable, and has
at least ``--min-free-gb`` free on every host (any host may write one: rank 0
moves after a restart)."""

from __future__ import annotations

from corral.checks.context import CheckContext
from corral.checks.result import CheckResult, HostCheck, Status

NAME = "checkpoint"
_GIB = float(1 << 30)


def check(ctx: CheckContext) -> CheckResult:
    """See the module docstring; skipped without ``--checkpoint-dir``."""
    path = ctx.options.checkpoint_dir
    if not path:
        early = {h.name: HostCheck(Status.SKIP, "no --checkpoint-dir") for h in ctx.cluster}
        return CheckResult.from_hosts(NAME, early, summary="no --checkpoint-dir given")
    need = ctx.options.min_free_gb
    hosts: dict[str, HostCheck] = {}
    fixes: list[str] = []
    for host in ctx.cluster.hosts:
        f = ctx.facts[host.name]
        info = f.facts.get("checkpoint") if f.ok else None
        if info is None:
            hosts[host.name] = HostCheck(Status.SKIP, "host did not answer")
            continue
        where = info.get("path", path)
        free = info.get("free_bytes")
        if info.get("error"):
            hosts[host.name] = HostCheck(Status.FAIL, info["error"])
            fixes.append(f"on {host.name}: mkdir -p {where} && chown $USER {where}")
        elif free is not None and free < need * _GIB:
            hosts[host.name] = HostCheck(
                Status.FAIL,
                f"only {free / _GIB:.2f} GiB free on {where} (need {need:g} GiB, --min-free-gb)",
            )
            fixes.append(f"free space on {host.name}:{where} or pass another --checkpoint-dir")
        else:
            created = "" if info.get("existed") else " (created)"
            space = f", {free / _GIB:.1f} GiB free" if free is not None else ""
            hosts[host.name] = HostCheck(Status.PASS, f"{where} writable{space}{created}")
    return CheckResult.from_hosts(
        NAME,
        hosts,
        summary=f"{path} writable with >= {need:g} GiB free",
        fix_command="; ".join(fixes) or None,
        data={h: ctx.facts[h].facts.get("checkpoint") for h in hosts if ctx.facts[h].ok},
    )
