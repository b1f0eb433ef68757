"""One builder from what a user asked for to a job ready to run.

Every entry point describes its job as a :class:`~corral.job.describe.JobDescription`
(:class:`~corral.job.describe.JobOptions`, plain values named as ``corral run``'s
options, on a cluster): ``corral run`` and ``corral plan`` from their flags, the
server's planner from an API request, its supervisor process from the stored
description, ``corral calibrate`` from its measurement, the Kubernetes and Slurm
renders from theirs. :func:`build_job` validates it once (the script and launcher,
with the option at fault named; the policies validate themselves), so every entry
point accepts and refuses the same jobs with the same errors.

:func:`weigh` gives a description its ranks' workload weights from a calibration
(``corral run --calibration``, the planner's ``calibration``); :func:`ready_job`
makes the engine's :class:`~corral.job.engine.Job` of a description with everything
it needs attached (its trackers; for a weighted job the drift monitor, which
re-weighs its restarts with ``rebalance``); :func:`drive` runs it with Ctrl-C and
SIGTERM mapped to its stop. The callers only subscribe to its events and render them.
:func:`new_job` is the one place a Job is made.

:func:`ready_ranks` is the same description for a caller that starts and watches
each rank itself, with no engine Job: the actors runtime (:mod:`corral.actors`),
whose long-lived workers the coordinator program drives by messages. It is validated
and planned as above, so an option means the same there (or is refused, with the
schema's reason, where that entry point does not offer it).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, cast

from corral.agent.flight import trace_wait
from corral.cluster.model import Cluster, Host
from corral.contract import (
    FT_SYNC_ENV,
    FT_SYNC_EVERY_ENV,
    FT_SYNC_MODES,
    MICRO_BATCH_FITS_ENV,
    QOS_CLASSES,
    STEP_OVERHEADS_ENV,
)
from corral.defaults import DEFAULT_MASTER_PORT
from corral.diagnose.gpu import job_backend
from corral.errors import ConfigError
from corral.harness.config import harness_target, read_config
from corral.job.describe import JobDescription
from corral.job.describe import JobOptions as JobOptions  # re-exported: builders name it
from corral.job.ids import new_job_id
from corral.job.option import default_of
from corral.job.options import (
    CheckpointPolicy,
    CheckPolicy,
    RecoveryPolicy,
    RestartPolicy,
    SupervisionPolicy,
    SyncPolicy,
)
from corral.job.resolve import check_launch, plan_attempt, resolve
from corral.job.result import JobResult
from corral.job.schema import options_of
from corral.plan.launchers import launcher_options, validate_launcher
from corral.plan.launchers.mlx import check_backend
from corral.plan.spec import HarnessMode, JobSpec, Launcher
from corral.signals import stop_on_signals
from corral.track.targets import TrackPolicy
from corral.transport.base import Transport
from corral.transport.options import SshOptions

if TYPE_CHECKING:
    # loaded for a weighted job only (pydantic): a launch's start is on every job's path
    from corral.job.drift import DriftMonitor
    from corral.job.engine import Job  # loaded by new_job: ready_ranks runs no engine
    from corral.throughput.model import Calibration


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


def ft_sync_env(options: JobOptions) -> dict[str, str]:
    """``--ft-sync`` / ``--ft-sync-every`` as the ranks' ``CORRAL_FT_SYNC`` /
    ``CORRAL_FT_SYNC_EVERY`` (ConfigError naming the option at fault)."""
    env: dict[str, str] = {}
    for flag, key, value in (
        ("--ft-sync", FT_SYNC_ENV, options.ft_sync),
        ("--ft-sync-every", FT_SYNC_EVERY_ENV, options.ft_sync_every),
    ):
        if value is None:
            continue
        if options.recovery != "in-place":
            raise ConfigError(
                "needs --recovery in-place (sdk.fault_tolerant syncs replica groups)", option=flag
            )
        env[key] = str(value)
    if options.ft_sync is not None and options.ft_sync not in FT_SYNC_MODES:
        raise ConfigError(
            f"unknown sync mode {options.ft_sync!r}; choose one of {', '.join(FT_SYNC_MODES)}",
            option="--ft-sync",
        )
    every = options.ft_sync_every
    if every is not None and (isinstance(every, bool) or every < 1):
        raise ConfigError(f"must be at least 1 step (got {every})", option="--ft-sync-every")
    if options.ft_sync == "ddp" and every not in (None, 1):
        raise ConfigError(
            f"{every} needs --ft-sync diloco or localsgd (ddp syncs every step)",
            option="--ft-sync-every",
        )
    return env


_LIMITS: dict[str, tuple[Callable[[float, float], bool], str]] = {
    "gt": (lambda value, limit: value > limit, "more than"),
    "ge": (lambda value, limit: value >= limit, "at least"),
    "lt": (lambda value, limit: value < limit, "less than"),
    "le": (lambda value, limit: value <= limit, "at most"),
}


def check_bounds(options: JobOptions) -> None:
    """Every option within its schema's bounds (:attr:`~corral.job.option.Option.bounds`,
    the API's constraints), so every entry point refuses the same values: ConfigError
    naming the option."""
    for item, opt in options_of():
        value = getattr(options, item.name)
        if isinstance(value, bool) or not isinstance(value, int | float | str):
            continue
        for key, limit in opt.bounds.items():
            why = None
            if isinstance(value, str):
                if key == "min_length" and len(value) < limit:
                    why = f"must have at least {limit} characters"
                elif key == "max_length" and len(value) > limit:
                    why = f"must have at most {limit} characters (got {len(value)})"
                elif key == "pattern" and not re.search(limit, value):
                    why = f"{value!r} does not match {limit}"
            elif key in _LIMITS and not _LIMITS[key][0](value, limit):
                why = f"must be {_LIMITS[key][1]} {limit:g} (got {value:g})"
            if why is not None:
                raise ConfigError(why, option=opt.flag or item.name)


def job_spec(options: JobOptions) -> JobSpec:
    """The validated JobSpec of ``options`` (ConfigError naming the option at fault)."""
    launcher = options.launcher_name
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
        env={**ft_sync_env(options), **options.env},  # an --env of the same key wins
        secret_env=tuple(options.secret_env),
        nccl_interface=options.nccl_interface,
        gloo_interface=options.gloo_interface,
        timeout=options.timeout,
        max_restarts=options.max_restarts,  # what a render hands to torchrun (Kubernetes)
        checkpoint_dir=options.checkpoint_dir,
        rdzv_timeout=options.rdzv_timeout,
        collective_timeout=options.collective_timeout,
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
    check_bounds(options)  # last: what the checks above do not name more precisely
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
        recovery=RecoveryPolicy(options.recovery, options.spares, options.ft_join_timeout),
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
    from corral.job.engine import Job
    from corral.job.tracking import attach_tracking

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


LIVE_FILE = "calibration-live.json"
"""A weighted job's live throughput, saved in its job dir by its drift monitor."""


@dataclass(frozen=True)
class Weighing:
    """A description with its ranks' workload weights, and where they came from."""

    description: JobDescription
    ranks: list[tuple[str, int, float]]
    """(host, local rank, weight) of every rank, in rank order."""
    measured: Calibration | None = None
    """The calibration in hand it was weighed with (measured now); None: read from a file."""
    fits: tuple[int | None, ...] = ()
    """The largest micro-batch of every rank (None: no limit), in rank order."""
    overheads: tuple[float, ...] = ()
    """Every rank's fixed per-step cost in examples (0: none measured), in rank order."""


def weigh(
    description: JobDescription, source: str | Calibration, *, names: Cluster | None = None
) -> Weighing:
    """``description`` with its ranks' workload weights from a calibration (a file's
    path, or one in hand) and the largest micro-batch each rank fits
    (``CORRAL_MICRO_BATCH_FITS``) where the calibration has one, and each rank's fixed
    per-step cost (``CORRAL_STEP_OVERHEADS``) where it measured one. ``names``: the
    description's hosts as the calibration names them (default: its cluster).
    ConfigError when the calibration does not fit the hosts."""
    from corral.throughput.model import load_calibration
    from corral.throughput.resolve import (
        fits_env,
        overheads_env,
        planned_ranks,
        resolve_fits,
        resolve_overheads,
        resolve_weights,
    )

    options, cluster = description.options, description.cluster
    measured = None if isinstance(source, str) else source
    calibration = load_calibration(source) if isinstance(source, str) else source
    nproc = options.nproc_per_node
    weights = resolve_weights(calibration, names or cluster, nproc)
    fits = resolve_fits(calibration, names or cluster, nproc)
    ranks = planned_ranks(cluster, nproc)
    pairs = [(h.name, local, w) for (h, local), w in zip(ranks, weights, strict=True)]
    overheads = resolve_overheads(calibration, names or cluster, nproc)
    ours = (MICRO_BATCH_FITS_ENV, STEP_OVERHEADS_ENV)
    env = {k: v for k, v in options.env.items() if k not in ours}
    env |= fits_env(fits) | overheads_env(overheads)
    weighed = dataclasses.replace(options, workload_weights=tuple(weights), env=env)
    weighed_description = dataclasses.replace(description, options=weighed)
    return Weighing(weighed_description, pairs, measured, fits, overheads)


def watch_drift(job: Job, *, rebalance: bool = False) -> DriftMonitor | None:
    """A weighted job's drift monitor, subscribed to ``job`` (its progress reports
    and stragglers: drift warnings and rebalanced weights as ``message`` events, the
    live throughput saved as ``calibration-live.json`` in the job dir; re-weighing
    its restarts with ``rebalance``); None for a job without weights."""
    spec = job.spec
    if not spec.workload_weights:
        return None
    from corral.job.drift import DriftMonitor

    monitor = DriftMonitor(
        spec.workload_weights,
        job.cluster,
        spec.nproc_per_node,
        emit=job.emit,
        rebalance=rebalance,
        save_to=Path(spec.run_dir, spec.job_id, LIVE_FILE),
    )
    job.subscribe(monitor.on_event)
    job.before_restart = monitor.respec
    return monitor


def ready_job(description: JobDescription, *, transport: Transport | None = None) -> Job:
    """The engine's Job of ``description``, ready to run: built and validated
    (:func:`build_job`), its trackers subscribed and, for a weighted job, its drift
    monitor (:func:`watch_drift`), so that a caller subscribed afterwards sees their
    messages before ``finished``. ``transport``: the one to use (default: chosen
    for the cluster, closed at the end)."""
    spec, made = build_job(description.complete().options)
    job = new_job(spec, description.cluster, made, ssh=description.ssh, transport=transport)
    watch_drift(job, rebalance=description.options.rebalance)
    return job


async def drive(job: Job, stop: Callable[[], None] | None = None) -> JobResult:
    """Run ``job`` with Ctrl-C / SIGTERM mapped to ``stop`` (default: ``job.stop``; a
    second signal kills); its result."""
    with stop_on_signals(stop or job.stop):
        return await job.run()


def refuse_unoffered(options: JobOptions, entry: str) -> None:
    """ConfigError naming the first option set (to other than its default) that the
    entry point ``entry`` does not offer, with the schema's reason
    (:attr:`~corral.job.option.Option.not_at`)."""
    for item, opt in options_of():
        value, default = getattr(options, item.name), default_of(item)
        if entry in opt.not_at and value != default and (value or default):  # [] is ()
            raise ConfigError(
                f"not for the {entry} runtime: {opt.not_at[entry]}", option=opt.flag or item.name
            )


@dataclass(frozen=True)
class RankStart:
    """One rank that its caller starts and watches itself: where it runs, its place in
    the job, the interpreter to run it with (None: the host's usual ones) and its
    environment, as ``corral run`` plans it (the job's ``--env``, the rank layout,
    ``CORRAL_DIST_TIMEOUT``, the interfaces, the checkpoint dir...)."""

    host: Host
    rank: int
    local_rank: int
    node_rank: int
    python: str | None
    env: dict[str, str]


@dataclass(frozen=True)
class ReadyRanks:
    """A description ready for a caller that starts its ranks itself: the resolved
    spec, the policies (its restart policy: ``policies.restarts``) and every rank."""

    spec: JobSpec
    policies: Policies
    ranks: tuple[RankStart, ...]
    master_addr: str


def ready_ranks(description: JobDescription, worker: str, *, entry: str = "actors") -> ReadyRanks:
    """``description``'s ranks for a caller that starts and watches each one itself
    (the actors runtime: workers a coordinator program drives, no torchrun, no node
    agent). Refused as every entry point refuses a job (:func:`build_job`), and the
    options ``entry`` does not offer refused with their reason; resolved for this
    machine (a free master port on ``local:N``; on SSH hosts a port of 0 is the default
    port, as no node agent probes the first host) and planned as ``--launcher python``
    plans its ranks, one per slot. ``worker``: the file every rank runs."""
    options = description.complete().options
    refuse_unoffered(options, entry)
    options = dataclasses.replace(options, command=(worker,), launcher="python")
    spec, made = build_job(options)
    cluster = description.cluster
    spec = resolve(spec, cluster)
    if spec.master_port == 0:
        spec = dataclasses.replace(spec, master_port=DEFAULT_MASTER_PORT)
    commands = plan_attempt(spec, cluster).commands
    ranks = tuple(
        RankStart(
            host=command.host,
            rank=rank.rank,
            local_rank=rank.local_rank,
            node_rank=command.node_rank,
            python=command.host.python or spec.python,
            env={**command.env, **rank.env},
        )
        for command in commands
        for rank in command.ranks
    )
    return ReadyRanks(spec, made, ranks, commands[0].master_addr)
