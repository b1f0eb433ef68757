"""Check 10, sync status: was the code pushed (``corral sync`` / ``--sync``) or the
user's sync script run for this job, and is what was pushed still current?

A sync script that exited non-zero fails the check (the seed's "block the
launch"); a missing one is a warning. Hosts never synced by corral are
``skip``: the code-consistency check is what decides whether their code is right.
"""

from __future__ import annotations

from corral.checks.context import CheckContext
from corral.checks.result import CheckResult, HostCheck, Status

NAME = "sync"
_STATUS = {"pass": Status.PASS, "warn": Status.WARN, "skip": Status.SKIP}


def check(ctx: CheckContext) -> CheckResult:
    """See the module docstring."""
    if ctx.is_local:
        local = HostCheck(Status.SKIP, "local nodes use this machine's files")
        return CheckResult.from_hosts(
            NAME, {h.name: local for h in ctx.cluster}, summary="nothing to sync (local nodes)"
        )
    from corral.sync.state import sync_status

    done = ctx.options.sync or {}
    script = done.get("script") or {}
    digest = ctx.local_manifest.digest if ctx.local_manifest is not None else None
    names = [h.name for h in ctx.cluster.hosts]
    recorded = sync_status(names, ctx.workdir, digest) if digest is not None else {}
    hosts: dict[str, HostCheck] = {}
    for name in names:
        status, detail = recorded.get(name, ("skip", "no code tree here to compare"))
        hosts[name] = HostCheck(_STATUS.get(status, Status.SKIP), detail)
    error = warning = fix = None
    script_state = script.get("status")
    if script_state == "failed":
        failed = HostCheck(Status.FAIL, "the sync script failed: launch blocked")
        hosts = dict.fromkeys(names, failed)
        error = f"{script.get('detail')}; launch blocked"
        fix = f"fix {script.get('path')} and run it again (or pass --sync to use corral sync)"
    elif script_state == "missing":
        hosts = {
            n: HostCheck(Status.WARN, f"sync script {script.get('path')} not found; not synced")
            if c.status is not Status.PASS
            else c
            for n, c in hosts.items()
        }
        if not any(c.status is Status.WARN for c in hosts.values()):
            hosts[names[0]] = HostCheck(Status.WARN, f"sync script {script.get('path')} not found")
        warning = f"sync script {script.get('path')} not found: continuing without it"
    elif any(c.status is Status.WARN for c in hosts.values()):
        fix = "corral sync (or corral run --sync)"
    synced = sum(1 for c in hosts.values() if c.status is Status.PASS)
    summary = (
        f"sync script {script.get('path')} ran" if script_state == "ok" else ""
    ) or f"{synced}/{len(names)} hosts synced by corral with the current code"
    return CheckResult.from_hosts(
        NAME,
        hosts,
        summary=summary,
        error=error,
        warning=warning,
        fix_command=fix,
        data={"script": script or None, "pushed": bool(done.get("pushed"))},
    )
