"""One function from what a user asked for to a job: its JobSpec and its policies.

``corral run`` and ``corral plan`` (from their flags) and the server's supervisor
process (from its :class:`~corral.job.describe.JobDescription`, the one serialisable
job description) describe a job as :class:`JobOptions`, plain values named as
``corral run``'s options, and build it with :func:`build_job`:
the script and launcher are validated once here (with the option at fault named),
the policies are made and validate themselves, so every entry point accepts and
refuses the same jobs with the same errors. :func:`new_job` makes the engine's
:class:`~corral.job.engine.Job` of the result.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import cast

from corral.agent.flight import trace_wait
from corral.checks.context import DEFAULT_LINKS_MIN_RATIO, DEFAULT_MIN_FREE_GB
from corral.cluster.model import Cluster
from corral.contract import QOS_CLASSES
from corral.diagnose.gpu import job_backend
from corral.errors import ConfigError
from corral.harness.config import harness_target, read_config
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
from corral.plan.spec import (
    DEFAULT_MASTER_PORT,
    DEFAULT_RDZV_TIMEOUT,
    HarnessMode,
    JobSpec,
    Launcher,
)
from corral.recovery.health import DEFAULT_HOST_TIMEOUT
from corral.track.targets import TrackPolicy
from corral.transport.base import Transport
from corral.transport.options import SshOptions


@dataclass(frozen=True)
class JobOptions:
    """A job as the user asked for it: ``corral run``'s options as plain values
    (already parsed: ``env`` a mapping, ``nproc_per_node`` a number)."""

    command: Sequence[str] = ()
    """SCRIPT and its ARGS (empty for the launchers that run their own command)."""
    launcher: str | None = None
    """Default: torchrun, or accelerate with ``harness``."""
    python: str | None = None
    nproc_per_node: int | None = None
    master_addr: str | None = None
    master_port: int = DEFAULT_MASTER_PORT
    workdir: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    secret_env: Sequence[str] = ()
    nccl_interface: str | None = None
    gloo_interface: str | None = None
    timeout: float | None = None
    checkpoint_dir: str | None = None
    run_dir: str = "runs"
    rdzv_timeout: float = DEFAULT_RDZV_TIMEOUT
    job_id: str | None = None
    """Default: a new, time-based id."""
    name: str | None = None
    """The job's name (``corral job submit --name``): trackers name their run after it."""
    owner: str | None = None
    """Who submitted it (the server's user; None: the user running it)."""
    mlx_backend: str = "ring"
    shared_data_path: str | None = None
    command_template: str | None = None
    tags: str | None = None
    additional_args: str | None = None
    harness: bool = False
    lr_scaling: str = "linear"
    qos: str | None = None
    workload_weights: Sequence[float] = ()
    # the pre-flight and the code sync
    preflight: bool = True
    smoke_test: bool = False
    check_links: bool = False
    links_min_ratio: float = DEFAULT_LINKS_MIN_RATIO
    links_min_gbs: float = 0.0
    links_warn_only: bool = False
    min_free_gb: float = DEFAULT_MIN_FREE_GB
    consistency_threshold: float = 1.0
    exclude_divergent: bool = False
    code_dir: str | None = None
    sync: bool = False
    sync_script: str | None = None
    # fault tolerance and teardown
    max_restarts: int = 0
    restart_backoff: float = 1.0
    min_nodes: int | None = None
    host_timeout: float = DEFAULT_HOST_TIMEOUT
    hang_timeout: float | None = None
    replicate_checkpoints: bool = False
    grace: float = 10.0
    recovery: str = "restart"
    """``restart`` (every failure restarts the whole job) or ``in-place`` (torchft)."""
    spares: int = 0
    """Hosts of the cluster (the last ones) held in reserve for in-place recovery."""
    # experiment tracking
    track: Sequence[str] = ()
    """``--track BACKEND:WHERE`` values (mlflow:URI, tensorboard:DIR, wandb:PROJECT)."""
    rebalance: bool = False
    """With workload weights: recompute them from the live rates at a restart."""


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
