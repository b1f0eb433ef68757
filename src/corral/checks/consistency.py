"""Check 4, code consistency: every host's code tree and entry script hash the
same as this machine's (SHA-256 manifests, .gitignore/.corralignore honoured).

The consistency ratio is matching hosts / hosts; below the threshold the check
fails naming the divergent hosts and their differing files; at or above it
(a threshold below 1.0) divergent hosts are a warning. A host whose ``--workdir``
or entry script is missing (or whose script cannot be run) always fails, compared
or not: every rank there would die at start.
"""

from __future__ import annotations

import shlex
from collections.abc import Collection
from typing import Any

from corral.agent.fingerprint import diff_manifests
from corral.checks.context import CheckContext, cli_ssh_options
from corral.checks.result import CheckResult, HostCheck, Status

NAME = "code"
SHOWN_FILES = 5


def _files(label: str, paths: list[str]) -> str:
    shown = ", ".join(paths[:SHOWN_FILES])
    more = f" (+{len(paths) - SHOWN_FILES} more)" if len(paths) > SHOWN_FILES else ""
    return f"{label} {shown}{more}"


def divergence(ctx: CheckContext) -> dict[str, dict[str, Any]]:
    """Per divergent host: why (missing tree, changed / missing / extra files, script)."""
    out: dict[str, dict[str, Any]] = {}
    ref = ctx.local_manifest
    for f in ctx.answered():
        code = f.facts.get("code", {})
        why: dict[str, Any] = {}
        tree = code.get("tree")
        if ref is not None and tree is not None:
            if tree.get("missing"):
                why["missing_tree"] = tree.get("root")
            elif tree.get("digest") != ref.digest:
                changed, missing, extra = diff_manifests(ref.files, tree.get("files") or {})
                why.update(changed=changed, missing=missing, extra=extra)
        script = code.get("script")
        if ctx.local_script_sha256 is not None and script is not None:
            if script.get("error"):
                why["script"] = f"{script.get('path')}: {script['error']}"
            elif script.get("sha256") != ctx.local_script_sha256:
                why["script"] = f"{script.get('path')} differs"
        if why:
            out[f.host.name] = why
    return out


def _detail(why: dict[str, Any]) -> str:
    parts = []
    if "missing_tree" in why:
        parts.append(f"no code directory {why['missing_tree']}")
    for key in ("changed", "missing", "extra"):
        if why.get(key):
            parts.append(_files(key, why[key]))
    if "script" in why:
        parts.append(f"script {why['script']}")
    return "; ".join(parts)


def sync_command(ctx: CheckContext, hosts: list[str]) -> str:
    """The ``corral sync`` command that brings ``hosts`` in line."""
    src = ctx.local_manifest.root if ctx.local_manifest is not None else "."
    words = ["corral", "sync", "--hosts", ",".join(hosts), src, "--dest", ctx.workdir]
    return shlex.join([*words, *cli_ssh_options(ctx.options.ssh)])


def script_problems(ctx: CheckContext, skip: Collection[str] = ()) -> dict[str, HostCheck]:
    """Hosts (but ``skip``) whose entry script is missing or cannot be run: failures,
    whatever the threshold (every rank there would die at once)."""
    out: dict[str, HostCheck] = {}
    for f in ctx.answered():
        script = (f.facts.get("code") or {}).get("script") or {}
        if f.host.name not in skip and script.get("error"):
            out[f.host.name] = HostCheck(
                Status.FAIL, f"script {script.get('path')}: {script['error']}"
            )
    return out


def _script_error(ctx: CheckContext, hosts: Collection[str]) -> str:
    return (
        f"the script {ctx.options.script} cannot be run in {ctx.workdir} on "
        f"{', '.join(sorted(hosts))}"
    )


def _cannot_compare(
    ctx: CheckContext, no_workdir: dict[str, HostCheck], no_script: dict[str, HostCheck]
) -> CheckResult:
    """Nothing here to compare with: a warning saying why and what fixes it (a
    failure for hosts without the working directory or the script)."""
    ref = ctx.reference
    why = (
        ref.why_not
        if ref is not None and ref.why_not
        else "cannot compare: no code tree here; pass --code-dir"
    )
    short = why.split(";", 1)[0]
    hosts = {
        h.name: no_workdir.get(h.name)
        or no_script.get(h.name)
        or HostCheck(Status.WARN if ctx.facts[h.name].ok else Status.SKIP, short)
        for h in ctx.cluster
    }
    fix = why.split("; ", 1)[1] if "; " in why else "pass --code-dir"
    errors = []
    if no_workdir:
        errors.append(f"{ctx.workdir} missing on {', '.join(sorted(no_workdir))}")
    if no_script:
        errors.append(_script_error(ctx, no_script))
        fix = sync_command(ctx, sorted(no_script)) + f"  (or: {fix})"
    return CheckResult.from_hosts(
        NAME,
        hosts,
        summary="not compared",
        error="; ".join([*errors, why]) if errors else None,
        warning=why,
        fix_command=fix,
        data={"compared": False, "why_not": why},
    )


def check(ctx: CheckContext) -> CheckResult:
    """Compare every host with this machine; see the module docstring."""
    if ctx.is_local:
        early = {h.name: HostCheck(Status.PASS, "same filesystem") for h in ctx.cluster}
        return CheckResult.from_hosts(NAME, early, summary="one filesystem (local nodes)")
    missing = (
        f"--workdir {ctx.workdir} does not exist"
        if ctx.options.workdir
        else f"working directory {ctx.workdir} (this machine's current directory) does not "
        "exist there; pass --workdir"
    )
    no_workdir = {
        f.host.name: HostCheck(Status.FAIL, missing)
        for f in ctx.answered()
        if not (f.facts.get("workdir") or {}).get("exists", True)
    }
    no_script = script_problems(ctx, skip=no_workdir)
    if ctx.local_manifest is None and ctx.local_script_sha256 is None:
        return _cannot_compare(ctx, no_workdir, no_script)
    divergent = divergence(ctx)
    for name, problem in no_script.items():
        divergent.setdefault(name, {})["script"] = problem.detail.removeprefix("script ")
    answered = [f.host.name for f in ctx.answered()]
    total = len(ctx.cluster.hosts)
    matching = [h for h in answered if h not in divergent]
    ratio = len(matching) / total if total else 1.0
    threshold = ctx.options.consistency_threshold
    below = ratio < threshold
    hosts: dict[str, HostCheck] = {}
    ref = ctx.local_manifest
    for host in ctx.cluster.hosts:
        f = ctx.facts[host.name]
        if not f.ok:
            hosts[host.name] = HostCheck(Status.SKIP, "host did not answer")
        elif host.name in no_workdir:
            hosts[host.name] = no_workdir[host.name]
        elif host.name in divergent:
            status = Status.FAIL if below or host.name in no_script else Status.WARN
            hosts[host.name] = HostCheck(status, _detail(divergent[host.name]))
        else:
            what = f"{len(ref.files)} files match" if ref is not None else "script matches"
            hosts[host.name] = HostCheck(Status.PASS, what)
    truncated = ref is not None and ref.truncated
    if truncated and not divergent:
        for name, c in hosts.items():
            if c.status is Status.PASS:
                hosts[name] = HostCheck(Status.WARN, c.detail + " (tree truncated)")
    names = sorted(divergent)
    error = warning = None
    if divergent:
        text = (
            f"code differs on {', '.join(names)} (consistency {ratio:.2f}, "
            f"threshold {threshold:.2f})"
        )
        error, warning = (text, None) if below else (None, text)
    if no_script:
        error = "; ".join(e for e in (_script_error(ctx, no_script), error) if e)
    data: dict[str, Any] = {
        "compared": True,
        "reference": ctx.reference.how if ctx.reference is not None else None,
        "ratio": ratio,
        "threshold": threshold,
        "digest": ref.digest if ref is not None else None,
        "files": len(ref.files) if ref is not None else 0,
        "divergent": divergent,
    }
    result = CheckResult.from_hosts(
        NAME,
        hosts,
        summary=(
            f"{len(matching)}/{total} hosts match"
            + (f" ({len(ref.files)} files, {ref.size / 1e6:.1f} MB)" if ref is not None else "")
        ),
        error=error,
        warning=warning
        or (
            "the code tree has more files than corral hashes; add a .corralignore"
            if truncated
            else None
        ),
        fix_command=sync_command(ctx, names) if divergent else None,
        data=data,
    )
    return result
