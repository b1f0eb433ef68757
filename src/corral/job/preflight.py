"""``corral run``'s pre-flight: the checklist before anything is launched.

Failures refuse the launch (CheckFailed, after printing each problem with its
fix); warnings are printed and never block. What the checks found flows into
the launch: hosts dropped by ``--exclude-divergent`` leave the cluster, and the
interface each host routes to the master on becomes its
``NCCL_SOCKET_IFNAME``/``GLOO_SOCKET_IFNAME`` unless one was given. The
collective smoke test costs a torch import per rank, so it runs only with
``--smoke-test``.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from rich.console import Console

from corral.checks.context import ChecklistOptions
from corral.checks.render import print_report, problems, verdict
from corral.checks.result import Status
from corral.checks.runner import ChecklistOutcome, run_checklist
from corral.cluster.model import Cluster
from corral.errors import CheckFailed
from corral.transport.base import Transport

if TYPE_CHECKING:
    from corral.job.engine import LaunchOptions
    from corral.plan.spec import JobSpec


def checklist_options(
    opts: LaunchOptions, spec: JobSpec, sync: dict[str, Any] | None
) -> ChecklistOptions:
    """The checklist for a launch planned as ``spec``."""
    return ChecklistOptions(
        cluster=opts.cluster,
        ssh=opts.ssh,
        launcher=spec.launcher,
        python=opts.python,
        workdir=None if opts.cluster.is_local else (spec.workdir or None),
        code_dir=opts.code_dir,
        script=spec.script if not opts.cluster.is_local else None,
        master_addr=spec.master_addr,
        master_port=spec.master_port,
        nproc_per_node=spec.nproc_per_node,
        nccl_interface=spec.nccl_interface,
        gloo_interface=spec.gloo_interface,
        checkpoint_dir=opts.checkpoint_dir,
        min_free_gb=opts.min_free_gb,
        consistency_threshold=opts.consistency_threshold,
        exclude_divergent=opts.exclude_divergent,
        smoke=opts.smoke_test,
        sync=sync,
    )


def apply(outcome: ChecklistOutcome, cluster: Cluster) -> Cluster:
    """The cluster to launch on: excluded hosts dropped, detected interfaces set
    where the hostfile gave none."""
    keep = {h.name for h in outcome.cluster.hosts}
    hosts = tuple(
        dataclasses.replace(h, interface=h.interface or outcome.interfaces.get(h.name))
        for h in cluster.hosts
        if h.name in keep
    )
    return Cluster(hosts, source=cluster.source)


async def preflight(
    opts: LaunchOptions,
    spec: JobSpec,
    transport: Transport,
    console: Console,
    *,
    sync: dict[str, Any] | None = None,
) -> ChecklistOutcome:
    """Run the checklist for a launch; CheckFailed when a check failed."""
    outcome = await run_checklist(
        checklist_options(opts, spec, sync), transport=transport, run_dir=opts.run_dir
    )
    report = outcome.report
    if report.failed:
        print_report(console, report)
        raise CheckFailed(report.failed)
    if report.overall_status is Status.WARN:
        problems(console, report)
    console.print(verdict(report, "pre-flight "))
    return outcome
