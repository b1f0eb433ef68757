"""``corral run``'s pre-flight: the checklist before anything is launched.

Failures refuse the launch (CheckFailed, after printing each problem with its
fix); warnings are printed and never block. What the checks found flows into
the launch: hosts dropped by ``--exclude-divergent`` leave the cluster, and the
interface each host routes to the master on becomes its
``NCCL_SOCKET_IFNAME``/``GLOO_SOCKET_IFNAME`` unless one was given. The
collective smoke test costs a torch import per rank, so it runs only with
``--smoke-test``; the link matrix (``corral.checks.links``) only with
``--check-links``. A ``spec.shared_data_path`` (``--shared-data-path``) adds the
shared data check: the path must be one filesystem on every host.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Sequence
from typing import Any

from corral.checks.context import ChecklistOptions
from corral.checks.gather import AgentSessions
from corral.checks.result import ChecklistReport
from corral.checks.runner import ChecklistOutcome, run_checklist
from corral.checks.shared_data import validate_path
from corral.cluster.model import Cluster, Host
from corral.defaults import DEFAULT_FT_JOIN_TIMEOUT
from corral.diagnose.gpu import job_backend
from corral.errors import CheckFailed
from corral.job.options import CheckPolicy, SupervisionPolicy
from corral.plan.launchers.command import template_of
from corral.plan.spec import JobSpec
from corral.transport.base import Transport
from corral.transport.options import SshOptions


def checklist_options(
    policy: CheckPolicy,
    spec: JobSpec,
    cluster: Cluster,
    ssh: SshOptions,
    python: str | None,
    sync: dict[str, Any] | None,
    *,
    in_place: bool = False,
    supervision: SupervisionPolicy | None = None,
    spares: Sequence[Host] = (),
    join_timeout: float = DEFAULT_FT_JOIN_TIMEOUT,
) -> ChecklistOptions:
    """The checklist for a launch planned as ``spec`` (``python``: as the user gave it;
    ``in_place``: ``--recovery in-place``, torchft is needed on every host and its
    timeouts are checked against ``supervision``'s and the Lighthouse's
    ``join_timeout``; ``spares``: the spare hosts, which
    pass the same per-host checks or are not used, :func:`usable_spares`)."""
    watch = supervision or SupervisionPolicy()
    return ChecklistOptions(
        cluster=cluster,
        ssh=ssh,
        launcher=spec.launcher,
        python=python,
        workdir=None if cluster.is_local else (spec.workdir or None),
        code_dir=policy.code_dir,
        script=spec.script if not cluster.is_local else None,
        master_addr=spec.master_addr,
        master_port=spec.master_port,
        nproc_per_node=spec.nproc_per_node,
        backend=job_backend(spec.env),
        nccl_interface=spec.nccl_interface,
        gloo_interface=spec.gloo_interface,
        checkpoint_dir=spec.checkpoint_dir,
        min_free_gb=policy.min_free_gb,
        consistency_threshold=policy.consistency_threshold,
        exclude_divergent=policy.exclude_divergent,
        smoke=policy.smoke_test,
        links=policy.links,
        links_min_ratio=policy.links_min_ratio,
        links_min_gbs=policy.links_min_gbs,
        links_fail=policy.links_fail,
        sync=sync,
        job_id=spec.job_id,
        run_dir=os.path.abspath(spec.run_dir),
        shared_data_path=validate_path(spec.shared_data_path),
        harness=spec.harness is not None,
        command_template=template_of(spec),
        torchft=in_place,
        env=dict(spec.env),
        hang_timeout=watch.hang_timeout,
        host_timeout=watch.host_timeout,
        ft_join_timeout=join_timeout,
        spares=tuple(spares),
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


def usable_spares(outcome: ChecklistOutcome, spares: Sequence[Host]) -> tuple[Host, ...]:
    """The spare hosts that passed the pre-flight (the spares check names the others,
    with why: they are not used)."""
    if not spares:
        return ()
    try:
        usable = set(outcome.report.check("spares").data.get("usable", ()))
    except KeyError:
        return tuple(spares)
    return tuple(h for h in spares if h.name in usable)


def with_spares(cluster: Cluster, spares: Sequence[Host]) -> Cluster:
    """``cluster`` and the spare hosts (what ``--sync`` pushes the code to: a spare
    needs it before it replaces a node)."""
    return Cluster((*cluster.hosts, *spares), source=cluster.source) if spares else cluster


async def preflight(
    options: ChecklistOptions,
    transport: Transport,
    run_dir: str,
    on_report: Callable[[ChecklistReport, bool], None],
    agents: AgentSessions | None = None,
) -> ChecklistOutcome:
    """Run the checklist for a launch; ``on_report(report, blocking)`` sees its report;
    CheckFailed when a check failed. ``agents``: see :func:`run_checklist`."""
    outcome = await run_checklist(options, transport=transport, run_dir=run_dir, agents=agents)
    report = outcome.report
    on_report(report, bool(report.failed))
    if report.failed:
        raise CheckFailed(report.failed)
    return outcome
