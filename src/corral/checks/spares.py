"""The spares check (``--recovery in-place --spares N``): a spare host passes the
same pre-flight as the hosts that train, before it is needed.

A spare replaces a lost node's replica group in the middle of training, when there
is no pre-flight any more: so every spare is asked for its facts with the others
and judged by the same per-host checks (connectivity, hardware, software: python,
torch, torchft and every package's version against the others', code: the tree's
fingerprint against this machine's, gpu) over the training hosts and the spares
together. A spare that fails any of them is named with the check and its reason
and is **not used** (the job launches with the spares that passed): a spare is a
reserve, so a bad one costs the reserve, not the launch. Training hosts are judged
by the checklist's own rows, as without spares.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from corral.checks.context import CheckContext
from corral.checks.result import CheckResult, HostCheck, Status
from corral.cluster.model import Cluster, Host

NAME = "spares"


def judged() -> tuple[tuple[str, Callable[[CheckContext], CheckResult]], ...]:
    """The per-host checks a spare must pass: ``(name, check)``."""
    from corral.checks import connectivity, consistency, gpu, hardware, software

    return (
        ("connectivity", connectivity.check),
        ("hardware", hardware.check),
        ("software", software.check),
        ("code", consistency.check),
        ("gpu", gpu.check),
    )


def check(ctx: CheckContext, spares: Sequence[Host]) -> CheckResult:
    """Each spare's verdict (``ctx.facts`` holds the spares' facts too): ``pass`` when
    it passes every check of :func:`judged`, else ``warn`` naming each failed check and
    its reason (``data["unusable"]``: host -> reason; ``data["usable"]``: the others)."""
    both = dataclasses.replace(
        ctx, cluster=Cluster((*ctx.cluster.hosts, *spares), source=ctx.cluster.source)
    )
    problems: dict[str, list[str]] = {h.name: [] for h in spares}
    notes: dict[str, list[str]] = {h.name: [] for h in spares}
    fixes: list[str] = []
    for name, judge in judged():
        result = judge(both)
        for host in spares:
            row = result.hosts.get(host.name)
            if row is None:
                continue
            if row.status is Status.FAIL:
                problems[host.name].append(f"{name}: {row.detail or result.error or 'failed'}")
            elif row.status is Status.WARN:
                notes[host.name].append(f"{name}: {row.detail}")
        for fix in (result.fix_command or "").split("; "):
            if fix and any(h in fix for h, found in problems.items() if found):
                fixes.append(fix)
    hosts: dict[str, HostCheck] = {}
    for host in spares:
        if problems[host.name]:
            hosts[host.name] = HostCheck(Status.WARN, "not used: " + "; ".join(problems[host.name]))
        else:
            hosts[host.name] = HostCheck(Status.PASS, "; ".join(["ready", *notes[host.name]]))
    unusable = {
        h: c.detail.removeprefix("not used: ") for h, c in hosts.items() if c.status is Status.WARN
    }
    usable = [h.name for h in spares if h.name not in unusable]
    warning = None
    if unusable:
        warning = (
            "; ".join(f"spare {h} not used: {why}" for h, why in unusable.items())
            + f" ({len(usable)} spare(s) left"
            + (f": {', '.join(usable)})" if usable else ")")
        )
    return CheckResult.from_hosts(
        NAME,
        hosts,
        summary=f"{len(usable)}/{len(spares)} spare(s) ready: {', '.join(usable) or 'none'}",
        warning=warning,
        fix_command="; ".join(dict.fromkeys(fixes)) or None,
        data={"usable": usable, "unusable": unusable},
    )
