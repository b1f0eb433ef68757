"""Check 10, sync status: was the code pushed (``corral sync`` / ``--sync``) or the
user's sync script run for this job, and is what was pushed still current?

A sync script that exited non-zero fails the check (the seed's "block the
launch"); a missing one is a warning. Hosts never synced by corral are
``skip``: the code-consistency check is what decides whether their code is right.
A host whose current tree (gathered for the code check) differs from what corral
pushed there is a warning naming the changed files, never "synced".
"""

from __future__ import annotations

from collections.abc import Mapping

from corral.checks.consistency import sync_command
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
    from corral.sync.state import verify_sync

    done = ctx.options.sync or {}
    script = done.get("script") or {}
    manifest = ctx.local_manifest
    names = [h.name for h in ctx.cluster.hosts]
    verdicts = (
        verify_sync(
            names,
            ctx.workdir,
            local_digest=manifest.digest,
            local_files=manifest.files,
            host_trees=_host_trees(ctx),
            ignores=ctx.ignores,
        )
        if manifest is not None
        else {}
    )
    hosts: dict[str, HostCheck] = {}
    for name in names:
        v = verdicts.get(name)
        hosts[name] = (
            HostCheck(_STATUS.get(v.status, Status.SKIP), v.detail)
            if v is not None
            else HostCheck(Status.SKIP, "no code tree here to compare")
        )
    changed = {n: list(v.changed) for n, v in verdicts.items() if v.changed}
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
        fix = sync_command(ctx, [n for n in names if hosts[n].status is Status.WARN])
        if changed:
            warning = "changed on the host since corral sync: " + "; ".join(
                f"{n} ({', '.join(files[:3])}{' ...' if len(files) > 3 else ''})"
                for n, files in changed.items()
            )
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
        data={
            "script": script or None,
            "pushed": bool(done.get("pushed")),
            "changed": changed,
            "verified": sorted(n for n, v in verdicts.items() if v.verified),
        },
    )


def _host_trees(ctx: CheckContext) -> dict[str, Mapping[str, str] | None]:
    """Each answering host's current tree under the workdir (gathered for the code check)."""
    trees: dict[str, Mapping[str, str] | None] = {}
    for f in ctx.answered():
        tree = (f.facts.get("code") or {}).get("tree") or {}
        files = tree.get("files")
        trees[f.host.name] = files if isinstance(files, dict) and not tree.get("missing") else None
    return trees
