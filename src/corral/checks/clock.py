"""Check 7, clock skew: every host's clock against the coordinator's (warn above 1 s)."""

from __future__ import annotations

from corral.checks.context import CheckContext
from corral.checks.result import CheckResult, HostCheck, Status

NAME = "clock"
MAX_SKEW_S = 1.0


def check(ctx: CheckContext) -> CheckResult:
    """Offset of each host's clock (the midpoint of one round trip); warn above
    :data:`MAX_SKEW_S` between any two hosts or against this machine."""
    if ctx.is_local:
        early = {h.name: HostCheck(Status.PASS, "this machine's clock") for h in ctx.cluster}
        return CheckResult.from_hosts(NAME, early, summary="one clock (local nodes)")
    offsets = {f.host.name: f.clock_offset_s for f in ctx.answered()}
    known = {h: o for h, o in offsets.items() if o is not None}
    hosts: dict[str, HostCheck] = {}
    for host in ctx.cluster.hosts:
        offset = known.get(host.name)
        if offset is None:
            hosts[host.name] = HostCheck(Status.SKIP, "not measured (host did not answer)")
        elif abs(offset) > MAX_SKEW_S:
            hosts[host.name] = HostCheck(Status.WARN, f"{offset:+.3f} s off this machine's clock")
        else:
            hosts[host.name] = HostCheck(Status.PASS, f"{offset:+.3f} s")
    values = [*known.values(), 0.0]
    skew = max(values) - min(values)
    warning = None
    if skew > MAX_SKEW_S and not any(c.status is Status.WARN for c in hosts.values()):
        warning = f"clocks differ by {skew:.2f} s between hosts"
        worst = max(known, key=lambda h: abs(known[h]))
        hosts[worst] = HostCheck(Status.WARN, f"{known[worst]:+.3f} s (skew {skew:.2f} s)")
    return CheckResult.from_hosts(
        NAME,
        hosts,
        summary=f"max skew {skew:.3f} s",
        warning=warning,
        fix_command="install and enable chrony or ntp on every host (e.g. `chronyc makestep`)",
        data={"offsets_s": known, "skew_s": skew},
    )
