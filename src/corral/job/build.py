"""One function from what a user asked for to a job: its JobSpec and its policies.

``corral run`` and ``corral plan`` (from their flags) and the server's supervisor
process (from its :class:`~corral.job.describe.JobDescription`, the one serialisable
job description) describe a job as :class:`~corral.job.describe.JobOptions`, plain
values named as ``corral run``'s options, and build it with :func:`build_job`:
the script and launcher are validated once here (with the option at fault named),
the policies are made and validate themselves, so every entry point accepts and
refuses the same jobs with the same errors. :func:`new_job` makes the engine's
:class:`~corral.job.engine.Job` of the result.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import cast

from corral.agent.flight import trace_wait
from corral.cluster.model import Cluster
from corral.contract import QOS_CLASSES
from corral.diagnose.gpu import job_backend
from corral.errors import ConfigError
from corral.harness.config import harness_target, read_config
from corral.job.describe import JobOptions as JobOptions  # re-exported: builders name it
from corral.job.engine import Job
from corral.job.options import (
    CheckpointPolicy,
    CheckPolicy,
    RecoveryPolicy,
    RestartPolicy,
    SupervisionPolicy,
    SyncPolicy,
)
from corral.job.resolve import check_launch, new_job_id
from corral.job.tracking import attach_tracking
from corral.plan.launchers import launcher_options, validate_launcher
from corral.plan.launchers.mlx import check_backend
from corral.plan.spec import HarnessMode, JobSpec, Launcher
from corral.track.targets import TrackPolicy
from corral.transport.base import Transport
from corral.transport.options import SshOptions


@dataclass(frozen=True)
class Policies:
    """The policies a :class:`~corral.job.engine.Job` is built with besides its spec."""

    checks: CheckPolicy = field(default_factory=CheckPolicy)
    sync: SyncPolicy = field(default_factory=SyncPolicy)
    restarts: RestartPolicy = field(default_factory=RestartPolicy)
    checkpoints: CheckpointPolicy = field(default_factory=CheckpointPolicy)
    supervision: SupervisionPolicy = field(default_factory=SupervisionPolicy)
    recovery: RecoveryPolicy = field(default_factory=RecoveryPolicy)
    tracking: TrackPolicy = field(default_factory=TrackPolicy)


def job_spec(options: JobOptions) -> JobSpec:
    """The validated JobSpec of ``options`` (ConfigError naming the option at fault)."""
    launcher = options.launcher or ("accelerate" if options.harness else "torchrun")
    script, *args = options.command or [""]
    check_launch(script, launcher)
    check_backend(options.mlx_backend)
    job_backend(options.env)  # a CORRAL_BACKEND the SDK and the pre-flight cannot read fails here
    try:
        trace_wait(options.env)  # a CORRAL_TRACE_WAIT the hang dump cannot use fails here too
    except ValueError as exc:
        raise ConfigError(str(exc), option="--env") from None
    own = launcher_options(
        launcher,
        {
            "mlx_backend": options.mlx_backend,
            "command_template": options.command_template,
            "madengine_tags": options.tags,
            "madengine_args": options.additional_args,
        },
    )
    harness: HarnessMode | None = None
    config: str | None = None
    if options.harness:
        if not script:
            raise ConfigError("needs -- PLUGIN_DIR_OR_SCRIPT [ARGS...]", option="--harness")
        harness, script = harness_target(script)
        config = read_config(args)
    spec = JobSpec(
        script=script,
        args=tuple(args),
        launcher=cast(Launcher, launcher),
        launcher_options=own,
        shared_data_path=options.shared_data_path,
        harness=harness,
        harness_config=config,
        lr_scaling=options.lr_scaling,
        job_id=options.job_id or new_job_id(),
        python=options.python,
        nproc_per_node=options.nproc_per_node,
        master_addr=options.master_addr,
        master_port=options.master_port,
        workdir=options.workdir,
        env=dict(options.env),
        secret_env=tuple(options.secret_env),
        nccl_interface=options.nccl_interface,
        gloo_interface=options.gloo_interface,
        timeout=options.timeout,
        checkpoint_dir=options.checkpoint_dir,
        rdzv_timeout=options.rdzv_timeout,
        run_dir=options.run_dir,
        qos=options.qos,
        workload_weights=tuple(options.workload_weights),
    )
    if options.qos is not None and options.qos not in QOS_CLASSES:
        raise ConfigError(
            f"unknown QoS class {options.qos!r}; choose one of {', '.join(QOS_CLASSES)}",
            option="--qos",
        )
    validate_launcher(spec)  # before resolve() rewrites the script's path
    # in-place recovery's launcher check needs no cluster: the same error everywhere
    RecoveryPolicy(options.recovery).check(spec.launcher, hosts=2, min_nodes=None)
    return spec


def policies(options: JobOptions) -> Policies:
    """The policies of ``options``; each validates itself (ConfigError naming the option)."""
    return Policies(
        checks=CheckPolicy(
            enabled=options.preflight,
            smoke_test=options.smoke_test,
            min_free_gb=options.min_free_gb,
            consistency_threshold=options.consistency_threshold,
            exclude_divergent=options.exclude_divergent,
            code_dir=options.code_dir,
            links=options.check_links,
            links_min_ratio=options.links_min_ratio,
            links_min_gbs=options.links_min_gbs,
            links_fail=not options.links_warn_only,
        ),
        sync=SyncPolicy(push=options.sync, script=options.sync_script, source=options.code_dir),
        restarts=RestartPolicy(options.max_restarts, options.restart_backoff, options.min_nodes),
        checkpoints=CheckpointPolicy(options.checkpoint_dir, options.replicate_checkpoints),
        supervision=SupervisionPolicy(options.grace, options.host_timeout, options.hang_timeout),
        recovery=RecoveryPolicy(options.recovery, options.spares),
        tracking=TrackPolicy(tuple(options.track), options.name, options.owner),
    )


def build_job(options: JobOptions) -> tuple[JobSpec, Policies]:
    """``options`` as the engine takes a job: its spec and its policies."""
    made = policies(options)  # the policies' errors first, as corral run has always named them
    return job_spec(options), made


def new_job(
    spec: JobSpec,
    cluster: Cluster,
    made: Policies,
    *,
    ssh: SshOptions | None = None,
    transport: Transport | None = None,
) -> Job:
    """The engine's Job of a built spec and its policies on ``cluster`` (its trackers,
    if any, subscribed first)."""
    job = Job(
        spec,
        cluster,
        ssh=ssh,
        checks=made.checks,
        sync=made.sync,
        restarts=made.restarts,
        checkpoints=made.checkpoints,
        supervision=made.supervision,
        recovery=made.recovery,
        transport=transport,
    )
    attach_tracking(job, spec, made.tracking)
    return job
