"""Check 1, connectivity: every host reachable and authenticated; round-trip latency."""

from __future__ import annotations

from corral.checks.context import CheckContext
from corral.checks.result import CheckResult, HostCheck, Status

NAME = "connectivity"


def check(ctx: CheckContext) -> CheckResult:
    """Pass per host that answered (with the session start time and RTT); fail with
    the transport's error otherwise."""
    hosts: dict[str, HostCheck] = {}
    rtts: list[float] = []
    for host in ctx.cluster.hosts:
        f = ctx.facts[host.name]
        if not f.ok:
            hosts[host.name] = HostCheck(Status.FAIL, f.error or "no answer")
            continue
        if ctx.is_local:
            hosts[host.name] = HostCheck(Status.PASS, "local node")
            continue
        parts = []
        if f.start_s is not None:
            parts.append(f"session {f.start_s * 1000:.0f} ms")
        if f.rtt_ms is not None:
            rtts.append(f.rtt_ms)
            parts.append(f"RTT {f.rtt_ms:.1f} ms")
        hosts[host.name] = HostCheck(Status.PASS, ", ".join(parts) or "reachable")
    down = [h for h, c in hosts.items() if c.status is Status.FAIL]
    summary = f"{len(hosts) - len(down)}/{len(hosts)} hosts answered" + (
        f", RTT max {max(rtts):.1f} ms" if rtts else ""
    )
    fix = None
    if down and not ctx.is_local:
        fix = (
            "; ".join(ctx.ssh(ctx.cluster.host(h), ["true"], verbose=True) for h in down)
            + "  (see why the SSH login fails)"
        )
    return CheckResult.from_hosts(
        NAME,
        hosts,
        summary=summary,
        fix_command=fix,
        data={"rtt_ms": {h: ctx.facts[h].rtt_ms for h in hosts}},
    )
