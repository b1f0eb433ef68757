"""Check "links" (``corral check --links``, ``corral run --check-links``): the
pairwise link matrix over the training network, judged by
:func:`corral.diagnose.links.score`.

The training address of a host is its IPv4 address on the interface the job's
NCCL/GLOO traffic uses (``--gloo-interface``/``--nccl-interface``, the
hostfile's ``interface=``, else the one detected by the network check); every
pair is measured over TCP between those addresses. Where every host has a GPU,
the collective's bus bandwidth is the NCCL figure (an all-reduce with one rank
per GPU); otherwise the gloo figure of the collective check, when it ran.
A culprit host fails the check (warns with ``fail=False``); a slow pair no
culprit explains warns on both ends. ``local:N`` is one machine: skipped.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from corral.checks.network import interfaces as detected_interfaces
from corral.checks.result import CheckResult, HostCheck, Status
from corral.diagnose.links import (
    LinkBudget,
    LinkMatrix,
    LinkThresholds,
    fmt_gbs,
    score,
)
from corral.diagnose.links_render import grid_json, heatmap

if TYPE_CHECKING:
    from rich.console import Console

    from corral.checks.context import CheckContext
    from corral.checks.result import ChecklistReport
    from corral.transport.base import Transport

__all__ = ["NAME", "check", "print_links", "result_for", "training_addresses"]

NAME = "links"
#: The NCCL all-reduce of the links check: buffer and timed iterations.
NCCL_SIZE_MB = 64.0
NCCL_ITERATIONS = 10
NCCL_DEADLINE = 60.0


def training_addresses(ctx: CheckContext) -> tuple[dict[str, str], dict[str, str]]:
    """Per host: the training interface and its IPv4 address (where known)."""
    opts = ctx.options
    found = detected_interfaces(ctx)
    ifaces: dict[str, str] = {}
    addrs: dict[str, str] = {}
    for host in ctx.cluster.hosts:
        iface = opts.gloo_interface or opts.nccl_interface or host.interface
        iface = iface or found.get(host.name)
        if not iface:
            continue
        ifaces[host.name] = iface
        f = ctx.facts.get(host.name)
        have = ((f.facts.get("route") or {}).get("interfaces") or {}) if f and f.ok else {}
        if have.get(iface):
            addrs[host.name] = str(have[iface])
    return ifaces, addrs


def result_for(
    matrix: LinkMatrix, thresholds: LinkThresholds, *, fix_iface: Mapping[str, str] | None = None
) -> CheckResult:
    """The check's result for a measured ``matrix`` (pure)."""
    judged = score(matrix, thresholds)
    bad = Status.FAIL if thresholds.fail else Status.WARN
    status = {"ok": Status.PASS, "suspect": Status.WARN, "culprit": bad}
    hosts = {h: HostCheck(status[v], d) for h, (v, d) in judged.hosts.items()}
    measured = [p.gbs for p in matrix.pairs if p.gbs is not None]
    summary = (
        f"{len(matrix.pairs)} pairs in {matrix.rounds} rounds, "
        f"reference {fmt_gbs(judged.reference_gbs)}"
    )
    if measured:
        worst = min((p for p in matrix.pairs if p.gbs is not None), key=lambda p: p.gbs or 0.0)
        summary += f", slowest {fmt_gbs(worst.gbs)} ({worst.a}-{worst.b})"
    if matrix.ring is not None and matrix.ring.busbw_gbs is not None:
        summary += f", ring {fmt_gbs(matrix.ring.busbw_gbs)}"
    if matrix.allreduce and matrix.allreduce.get("busbw_gbs") is not None:
        summary += (
            f", {matrix.allreduce.get('backend')} busbw "
            f"{fmt_gbs(float(matrix.allreduce['busbw_gbs']))}"
        )
    data: dict[str, Any] = {
        **matrix.to_json(),
        "score": judged.to_json(),
        "thresholds": {
            "min_ratio": thresholds.min_ratio,
            "min_gbs": thresholds.min_gbs,
            "fail": thresholds.fail,
        },
        "grid": grid_json(matrix, judged),
    }
    error = warning = fix = None
    named = judged.culprits or judged.suspects
    if judged.culprits:
        why = "; ".join(f"{h}: {judged.hosts[h][1]}" for h in judged.culprits)
        text = f"slow links point at {', '.join(judged.culprits)} ({why})"
        error, warning = (text, None) if thresholds.fail else (None, text)
    elif judged.suspects:
        pairs = ", ".join(f"{a}-{b}" for a, b in judged.slow)
        warning = f"slow link(s) {pairs} below {fmt_gbs(judged.threshold_gbs)}"
    if named:
        first = named[0]
        iface = (fix_iface or {}).get(first) or matrix.interfaces.get(first)
        fix = f"corral exec --hosts {first} -- ip -s link show" + (f" dev {iface}" if iface else "")
    return CheckResult.from_hosts(
        NAME, hosts, summary=summary, error=error, warning=warning, fix_command=fix, data=data
    )


def _pythons(ctx: CheckContext) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for host in ctx.cluster.hosts:
        f = ctx.facts.get(host.name)
        found = (f.facts.get("software") or {}).get("python_executable") if f and f.ok else None
        out[host.name] = found or host.python or ctx.options.python
    return out


def _all_gpus(ctx: CheckContext) -> bool:
    answered = ctx.answered()
    return len(answered) == len(ctx.cluster.hosts) and all(
        (f.facts.get("hardware") or {}).get("gpus") and (f.facts.get("software") or {}).get("torch")
        for f in answered
    )


async def _nccl(ctx: CheckContext, transport: Transport, port: int) -> dict[str, Any]:
    from corral.checks.smoke import smoke_test

    ifaces, _ = training_addresses(ctx)
    env = {h: {"NCCL_SOCKET_IFNAME": i, "GLOO_SOCKET_IFNAME": i} for h, i in ifaces.items()}
    res = await smoke_test(
        transport,
        list(ctx.cluster.hosts),
        master=ctx.master,
        master_addr=ctx.master_addr,
        port=port,
        nproc={h.name: len(ctx.facts[h.name].facts["hardware"]["gpus"]) for h in ctx.cluster.hosts},
        backend="nccl",
        python=_pythons(ctx),
        env=env,
        deadline=NCCL_DEADLINE,
        size_mb=NCCL_SIZE_MB,
        iterations=NCCL_ITERATIONS,
    )
    return {
        "backend": "nccl",
        "busbw_gbs": res.data.get("bus_bandwidth_gbps"),
        "algbw_gbs": res.data.get("algbw_gbps"),
        "world_size": res.data.get("world_size"),
        "size_bytes": res.data.get("size_bytes"),
        "error": res.error,
    }


async def check(
    ctx: CheckContext,
    transport: Transport,
    *,
    port: int,
    collective: CheckResult | None = None,
) -> CheckResult:
    """Measure and judge the link matrix (see the module docstring)."""
    from corral.diagnose.linkrun import measure_links

    opts = ctx.options
    if ctx.is_local or len(ctx.cluster.hosts) < 2:
        why = "one machine: no links to measure" if ctx.is_local else "one host: no links"
        return CheckResult.from_hosts(
            NAME, {h.name: HostCheck(Status.SKIP, why) for h in ctx.cluster.hosts}, summary=why
        )
    thresholds = LinkThresholds(
        min_ratio=opts.links_min_ratio, min_gbs=opts.links_min_gbs, fail=opts.links_fail
    )
    ifaces, addrs = training_addresses(ctx)
    matrix = await measure_links(
        transport,
        list(ctx.cluster.hosts),
        addresses=addrs,
        interfaces=ifaces,
        python=_pythons(ctx),
        budget=LinkBudget(seconds=opts.links_seconds),
    )
    if _all_gpus(ctx):
        matrix.allreduce = await _nccl(ctx, transport, port)
    elif collective is not None and collective.data.get("bus_bandwidth_gbps") is not None:
        matrix.allreduce = {
            "backend": collective.data.get("backend"),
            "busbw_gbs": collective.data.get("bus_bandwidth_gbps"),
            "world_size": collective.data.get("world_size"),
            "source": "collective check",
        }
    return result_for(matrix, thresholds, fix_iface=ifaces)


def print_links(console: Console, report: ChecklistReport) -> None:
    """The links heatmap under the checklist, when the links check measured one."""
    try:
        result = report.check(NAME)
    except KeyError:
        return
    if not result.data.get("pairs"):
        return
    matrix = LinkMatrix.from_json(result.data)
    t = result.data.get("thresholds") or {}
    thresholds = LinkThresholds(
        min_ratio=float(t.get("min_ratio", 0.0)),
        min_gbs=float(t.get("min_gbs", 0.0)),
        fail=bool(t.get("fail", True)),
    )
    console.print(heatmap(matrix, score(matrix, thresholds)))
