"""Run the whole pre-flight checklist: gather every host's facts at once, judge
them check by check, optionally drop divergent hosts, then the collective smoke
test. Every check's module is pure over the gathered facts except the smoke
test, which runs a real all-reduce."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from corral.agent.fingerprint import Manifest, build_manifest, file_digest
from corral.checks import software
from corral.checks.context import CheckContext, ChecklistOptions
from corral.checks.gather import AgentSessions, GatherRequest, gather, host_params
from corral.checks.reference import resolve
from corral.checks.result import ChecklistReport, CheckResult, HostCheck, Status
from corral.checks.shared_probe import SharedProbe, probe_shared
from corral.cluster.model import Cluster
from corral.plan.render import master_index
from corral.transport.base import Transport
from corral.transport.choose import transport_for

CHECK_NAMES = (
    "connectivity",
    "hardware",
    "software",
    "code",
    "network",
    "checkpoint",
    "shared_data",  # only with --shared-data-path
    "clock",
    "stale",
    "gpu",
    "collective",
    "links",  # only with --links / --check-links
    "timeouts",  # only with --recovery in-place
    "spares",  # only with --spares: each spare host judged as the others are
    "sync",
)
Check = Callable[[CheckContext], CheckResult]


@dataclass
class ChecklistOutcome:
    """The report, and what the launch takes from it."""

    report: ChecklistReport
    cluster: Cluster  # without the hosts --exclude-divergent dropped
    excluded: list[str] = field(default_factory=list)
    interfaces: dict[str, str] = field(default_factory=dict)  # detected, per host
    pythons: dict[str, str] = field(default_factory=dict)  # interpreter found per host
    phases: dict[str, float] = field(default_factory=dict)  # seconds per phase

    @property
    def ok(self) -> bool:
        """No check failed."""
        return not self.report.failed


def _timed(check: Check, ctx: CheckContext) -> CheckResult:
    started = time.perf_counter()
    result = check(ctx)
    result.duration_s = time.perf_counter() - started
    return result


def _ignores_for(code_dir: str, run_dir: str | None) -> tuple[str, ...]:
    """Run directories inside the code tree are outputs, not code."""
    if not run_dir:
        return ()
    try:
        rel = Path(os.path.abspath(run_dir)).relative_to(os.path.abspath(code_dir))
    except ValueError:
        return ()
    return (f"/{rel.as_posix()}/",) if rel.parts else ()


def _local_reference(
    code_dir: str | None, script: str | None, ignores: tuple[str, ...]
) -> tuple[Manifest | None, str | None]:
    manifest = None
    if code_dir and os.path.isdir(code_dir):
        manifest = build_manifest(code_dir, extra_ignores=ignores)
    script_hash = None
    if script and os.path.isfile(script):
        script_hash = file_digest(script)
    return manifest, script_hash


def _exclude(ctx: CheckContext, code: CheckResult) -> list[str]:
    """Drop divergent hosts when what remains is a valid cluster; says so in ``code``."""
    divergent = sorted(code.data.get("divergent", {}))
    if not divergent:
        return []
    if ctx.master.name in divergent:
        code.error = (code.error or "") + (
            f"; --exclude-divergent cannot drop {ctx.master.name}: it is the master host"
        )
        return []
    keep = tuple(h for h in ctx.cluster.hosts if h.name not in divergent)
    if not keep:
        return []
    ctx.cluster = Cluster(keep, source=ctx.cluster.source)
    for name in divergent:
        code.hosts[name] = HostCheck(Status.WARN, "excluded: " + code.hosts[name].detail)
    code.status = Status.WARN
    code.warning = (
        f"--exclude-divergent: {', '.join(divergent)} left out (code differs); the job runs "
        f"on {len(keep)} host(s)"
    )
    code.error = None
    code.data["excluded"] = divergent
    return divergent


async def _smoke(ctx: CheckContext, transport: Transport, port: int) -> CheckResult:
    from corral.checks.smoke import skipped_without_torch, smoke_test

    skipped = skipped_without_torch(ctx)
    if skipped is not None:
        return skipped
    from corral.checks import network

    opts = ctx.options
    detected = network.interfaces(ctx)
    env: dict[str, dict[str, str]] = {}
    for host in ctx.cluster.hosts:
        nccl = opts.nccl_interface or host.interface or detected.get(host.name)
        gloo = opts.gloo_interface or host.interface or detected.get(host.name)
        env[host.name] = {
            **({"NCCL_SOCKET_IFNAME": nccl} if nccl and not ctx.is_local else {}),
            **({"GLOO_SOCKET_IFNAME": gloo} if gloo and not ctx.is_local else {}),
        }
    pythons: dict[str, str | None] = {}
    for host in ctx.cluster.hosts:
        f = ctx.facts[host.name]
        pythons[host.name] = (
            (f.facts.get("software") or {}).get("python_executable") or host.python or opts.python
        )
    result: CheckResult = await smoke_test(
        transport,
        list(ctx.cluster.hosts),
        master=ctx.master,
        master_addr=ctx.master_addr,
        port=port,
        nproc={h.name: ctx.nproc(h) for h in ctx.cluster.hosts},
        python=pythons,
        env=env,
        deadline=opts.smoke_timeout,
    )
    return result


async def _shared(tp: Transport, opts: ChecklistOptions) -> SharedProbe | None:
    """The hosts' answers about ``--shared-data-path`` (None without one)."""
    if not opts.shared_data_path:
        return None
    return await probe_shared(tp, opts.cluster, opts.shared_data_path, opts.python)


def port_for(ctx: CheckContext) -> int:
    """The port the collectives rendezvous on: the one the network check found free."""
    listener = ctx.facts[ctx.master.name].facts.get("listener") or {}
    return int(listener.get("port") or ctx.options.master_port)


def _skipped(name: str, cluster: Cluster, why: str) -> CheckResult:
    return CheckResult.from_hosts(
        name, {h.name: HostCheck(Status.SKIP, why) for h in cluster.hosts}, summary=why
    )


async def run_checklist(
    opts: ChecklistOptions,
    *,
    transport: Transport | None = None,
    run_dir: str | None = "runs",
    agents: AgentSessions | None = None,
) -> ChecklistOutcome:
    """Run every check on every host in parallel and return the report (``agents``:
    node agents being started that answer for their hosts, see
    :func:`~corral.checks.gather.gather`)."""
    started = time.perf_counter()
    cluster = opts.cluster
    master_addr = opts.master_addr or (
        "127.0.0.1" if cluster.is_local else cluster.hosts[0].address
    )
    master = (
        cluster.hosts[master_index(cluster, master_addr)]
        if not cluster.is_local
        else cluster.hosts[0]
    )
    workdir = opts.workdir or os.getcwd()
    if cluster.is_local:
        workdir = os.path.abspath(workdir)
    reference = resolve(opts)
    code_dir, local_script = reference.code_dir, reference.script
    ignores = (*opts.extra_ignores, *(_ignores_for(code_dir, run_dir) if code_dir else ()))
    checkpoint_dir = opts.checkpoint_dir
    if checkpoint_dir and not os.path.isabs(os.path.expanduser(checkpoint_dir)):
        checkpoint_dir = os.path.join(workdir, checkpoint_dir)
    request = GatherRequest(
        launcher=opts.launcher,
        workdir=workdir,
        code_dir=workdir if code_dir else None,
        script=opts.script,  # compared when local_script is known; must exist anyway
        extra_ignores=ignores,
        checkpoint_dir=checkpoint_dir,
        master_addr=master_addr,
        master_port=opts.master_port,
        connect_timeout=min(opts.connect_timeout, 5.0),
        job_id=opts.job_id,
        binaries=software.extra_binaries(opts),
    )
    own_transport = transport is None
    tp = transport or transport_for(opts.cluster, opts.ssh, connect_timeout=opts.connect_timeout)
    phases: dict[str, float] = {}
    try:
        t0 = time.perf_counter()
        spare_hosts = tuple(opts.spares)  # judged by the spares check only
        # a spare's facts are compared with the training hosts': asked the same way
        # (the node agents that answer for those do not run with the host's own env)
        like = [dataclasses.replace(h, env={}) if agents is not None else h for h in spare_hosts]
        asked = [cluster.hosts[0]] if cluster.is_local else [*cluster.hosts, *like]
        if agents is not None:  # before anything is awaited: their probes carry these
            agents.post(host_params(request, asked, master))
        local = asyncio.to_thread(_local_reference, code_dir, local_script, ignores)
        asking = asyncio.gather(
            gather(tp, asked, request, master=master, python=opts.python, agents=agents),
            local,
            _shared(tp, opts),
        )
        try:
            await asyncio.sleep(0)  # the host sessions start; the checks load meanwhile
            from corral.checks import (
                checkpoint,
                clock,
                connectivity,
                consistency,
                gpu,
                hardware,
                network,
                shared_data,
                spares,
                stale,
                sync_status,
            )
        except BaseException:
            asking.cancel()
            raise
        facts_map, (manifest, script_hash), shared = await asking
        if cluster.is_local:
            only = facts_map[cluster.hosts[0].name]
            facts_map = {
                h.name: dataclasses.replace(only, host=h) for h in (*cluster.hosts, *spare_hosts)
            }
        phases["gather"] = time.perf_counter() - t0
        ctx = CheckContext(
            options=opts,
            cluster=cluster,
            master=master,
            master_addr=master_addr,
            workdir=workdir,
            facts=facts_map,
            local_manifest=manifest,
            local_script_sha256=script_hash,
            reference=reference,
            ignores=ignores,
            shared_data=shared,
        )
        results = [_timed(m.check, ctx) for m in (connectivity, hardware, software)]
        code = _timed(consistency.check, ctx)
        excluded: list[str] = []
        if opts.exclude_divergent and code.status is Status.FAIL:
            excluded = _exclude(ctx, code)
        results.append(code)
        results += [_timed(m.check, ctx) for m in (network, checkpoint)]
        if shared is not None:
            results.append(_timed(shared_data.check, ctx))
        results += [_timed(m.check, ctx) for m in (clock, stale, gpu)]
        if opts.torchft:
            from corral.checks import timeouts  # the Lighthouse's (only in place)

            results.append(_timed(timeouts.check, ctx))
        if spare_hosts:
            results.append(_timed(lambda c: spares.check(c, spare_hosts), ctx))
        if opts.smoke:
            t1 = time.perf_counter()
            smoke = await _smoke(ctx, tp, port_for(ctx))
            smoke.duration_s = time.perf_counter() - t1
            phases["collective"] = smoke.duration_s
        else:
            smoke = _skipped("collective", ctx.cluster, "smoke test not requested")
        results.append(smoke)
        if opts.links:
            from corral.checks import links  # the link matrix's (only when asked)

            t2 = time.perf_counter()
            linked = await links.check(ctx, tp, port=port_for(ctx), collective=smoke)
            linked.duration_s = phases["links"] = time.perf_counter() - t2
            results.append(linked)
        results.append(_timed(sync_status.check, ctx))
    finally:
        if own_transport:
            await tp.close()
    report = ChecklistReport(
        checks=results,
        hosts=[h.name for h in cluster.hosts],
        duration_s=time.perf_counter() - started,
    )
    pythons = {
        name: str(f.facts["software"]["python_executable"])
        for name, f in facts_map.items()
        if f.ok and f.facts.get("software", {}).get("python_executable")
    }
    return ChecklistOutcome(
        report=report,
        cluster=ctx.cluster,
        excluded=excluded,
        interfaces=network.interfaces(ctx),
        pythons=pythons,
        phases=phases,
    )
