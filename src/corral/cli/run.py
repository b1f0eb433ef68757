"""``corral run`` (launch + supervise) and ``corral plan`` (the dry run)."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Annotated, cast

import typer
from rich.console import Console
from rich.table import Table

from corral.checks.context import DEFAULT_MIN_FREE_GB
from corral.checks.render import print_report as print_checklist
from corral.checks.render import problems, verdict
from corral.checks.result import Status
from corral.cli.common import (
    AcceptNewHostKeysOpt,
    HostsOpt,
    InsecureNoHostKeyCheckOpt,
    SshConfigOpt,
    SshKeyOpt,
    SshPasswordEnvOpt,
    SshPortOpt,
    SshUserOpt,
    require_hosts,
)
from corral.cluster import load_cluster
from corral.cluster.model import Cluster
from corral.console import make_console
from corral.errors import ConfigError
from corral.harness.config import harness_target, read_config
from corral.job.engine import Job, dry_run
from corral.job.events import Checked
from corral.job.options import (
    CheckpointPolicy,
    CheckPolicy,
    RestartPolicy,
    SupervisionPolicy,
    SyncPolicy,
)
from corral.job.output import TerminalOutput
from corral.job.resolve import Prepared, new_job_id, parse_env, parse_nproc
from corral.job.summary import print_finished
from corral.plan.display import (
    command_lines,
    node_env,
    python_note,
    reference_line,
    weights_line,
)
from corral.plan.launchers import validate_launcher
from corral.plan.spec import (
    DEFAULT_MASTER_PORT,
    DEFAULT_RDZV_TIMEOUT,
    LAUNCHERS,
    LR_SCALING,
    MLX_BACKENDS,
    NODE_LAUNCHERS,
    HarnessMode,
    JobSpec,
    Launcher,
)
from corral.recovery.hang import AUTO_HANG_TIMEOUT
from corral.recovery.health import DEFAULT_HOST_TIMEOUT
from corral.remote.python import candidates
from corral.sdk._config import JOB_CONFIG_ENV
from corral.sdk._qos import QOS_CLASSES
from corral.transport.options import SshOptions

_L = "Launch"

LauncherOpt = Annotated[
    str,
    typer.Option(
        "--launcher",
        metavar="|".join(LAUNCHERS),
        envvar="CORRAL_LAUNCHER",
        help=f"How ranks are started: {'|'.join(LAUNCHERS)}.",
        rich_help_panel=_L,
    ),
]
RunLauncherOpt = Annotated[
    str | None,
    typer.Option(
        "--launcher",
        metavar="|".join(LAUNCHERS),
        envvar="CORRAL_LAUNCHER",
        help=f"How ranks are started: {'|'.join(LAUNCHERS)}. Default: torchrun "
        "(accelerate with --harness). See docs/launchers.md.",
        show_default=False,
        rich_help_panel=_L,
    ),
]
PythonOpt = Annotated[
    str | None,
    typer.Option(
        "--python",
        metavar="PATH",
        envvar="CORRAL_PYTHON",
        help="Interpreter on the hosts (its torchrun is used). Default: this "
        "interpreter for local nodes, else python3.",
        rich_help_panel=_L,
    ),
]
NprocOpt = Annotated[
    str | None,
    typer.Option(
        "--nproc-per-node",
        metavar="N|auto",
        envvar="CORRAL_NPROC_PER_NODE",
        help="Ranks per node: N, or 'auto' (GPUs, else the host's slots). "
        "Default: the host's slots.",
        rich_help_panel=_L,
    ),
]
MasterAddrOpt = Annotated[
    str | None,
    typer.Option(
        "--master-addr",
        metavar="HOST",
        envvar="CORRAL_MASTER_ADDR",
        help="Rendezvous address (default: the first host).",
        rich_help_panel=_L,
    ),
]
MasterPortOpt = Annotated[
    int,
    typer.Option(
        "--master-port",
        metavar="PORT",
        envvar="CORRAL_MASTER_PORT",
        help="Rendezvous port; 0 picks a free one.",
        rich_help_panel=_L,
    ),
]
WorkdirOpt = Annotated[
    str | None,
    typer.Option(
        "--workdir",
        metavar="DIR",
        envvar="CORRAL_WORKDIR",
        help="Working directory on every host (default for local nodes: their own "
        "directory under the run dir).",
        rich_help_panel=_L,
    ),
]
EnvOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--env",
        metavar="K=V",
        help="K=V set for every rank (repeatable); a bare K forwards this shell's value "
        "of K (keeps a secret off the command line). Nothing else of this shell's "
        "environment is forwarded.",
        rich_help_panel=_L,
    ),
]
NcclOpt = Annotated[
    str | None,
    typer.Option(
        "--nccl-interface",
        metavar="IFACE",
        envvar="CORRAL_NCCL_INTERFACE",
        help="NCCL_SOCKET_IFNAME for every rank.",
        rich_help_panel=_L,
    ),
]
GlooOpt = Annotated[
    str | None,
    typer.Option(
        "--gloo-interface",
        metavar="IFACE",
        envvar="CORRAL_GLOO_INTERFACE",
        help="GLOO_SOCKET_IFNAME for every rank.",
        rich_help_panel=_L,
    ),
]
TimeoutOpt = Annotated[
    float | None,
    typer.Option(
        "--timeout",
        metavar="SECONDS",
        envvar="CORRAL_TIMEOUT",
        help="Stop the whole job after S seconds (exit 124).",
        rich_help_panel=_L,
    ),
]
CheckpointOpt = Annotated[
    str | None,
    typer.Option(
        "--checkpoint-dir",
        metavar="DIR",
        envvar="CORRAL_CHECKPOINT_DIR",
        help="Exported to ranks as CORRAL_CHECKPOINT_DIR.",
        rich_help_panel=_L,
    ),
]
RunDirOpt = Annotated[
    str,
    typer.Option(
        "--run-dir",
        metavar="DIR",
        envvar="CORRAL_RUN_DIR",
        help="Where runs/<job-id>/ (logs, plan, result) is written.",
        rich_help_panel=_L,
    ),
]
GraceOpt = Annotated[
    float,
    typer.Option(
        "--grace",
        metavar="SECONDS",
        envvar="CORRAL_GRACE",
        help="Seconds between SIGTERM and SIGKILL at teardown.",
        rich_help_panel=_L,
    ),
]
RdzvTimeoutOpt = Annotated[
    float,
    typer.Option(
        "--rdzv-timeout",
        metavar="SECONDS",
        envvar="CORRAL_RDZV_TIMEOUT",
        help="Seconds to wait for every node to join and the master to accept connections.",
        rich_help_panel=_L,
    ),
]
MlxBackendOpt = Annotated[
    str,
    typer.Option(
        "--mlx-backend",
        metavar="|".join(MLX_BACKENDS),
        envvar="CORRAL_MLX_BACKEND",
        help="MLX's distributed backend (--launcher mlx).",
        rich_help_panel=_L,
    ),
]
SharedDataPathOpt = Annotated[
    str | None,
    typer.Option(
        "--shared-data-path",
        metavar="PATH",
        envvar="CORRAL_SHARED_DATA_PATH",
        help="A path every host must see as the same filesystem (checked before the "
        "launch; exported to ranks as CORRAL_SHARED_DATA_PATH).",
        rich_help_panel=_L,
    ),
]
CommandTemplateOpt = Annotated[
    str | None,
    typer.Option(
        "--command-template",
        metavar="TEMPLATE",
        envvar="CORRAL_COMMAND_TEMPLATE",
        help="--launcher command: the command every node runs (through bash -c), with "
        "{node_rank} {nnodes} {nproc_per_node} {world_size} {master_addr} {master_port} "
        "{host} {job_id} {nccl_interface} {gloo_interface} filled in, shell-quoted.",
        rich_help_panel=_L,
    ),
]
TagsOpt = Annotated[
    str | None,
    typer.Option(
        "--tags",
        metavar="MODEL",
        help="--launcher madengine: the model tags (madengine run --tags).",
        rich_help_panel=_L,
    ),
]
AdditionalArgsOpt = Annotated[
    str | None,
    typer.Option(
        "--additional-args",
        metavar="ARGS",
        help="--launcher madengine: more arguments for madengine run (shell syntax).",
        rich_help_panel=_L,
    ),
]
HarnessOpt = Annotated[
    bool,
    typer.Option(
        "--harness",
        help="Run an unmodified plugin (-- PLUGIN_DIR_OR_SCRIPT --config_file FILE ...) "
        "in distributed mode: an Accelerator for it, its JSON config adjusted to the "
        "world size (batch / world, learning rate scaled, rank-0 outputs).",
        rich_help_panel=_L,
    ),
]
LrScalingOpt = Annotated[
    str,
    typer.Option(
        "--lr-scaling",
        metavar="|".join(LR_SCALING),
        envvar="CORRAL_LR_SCALING",
        help="--harness: the config's learning rate times the world size (linear), its "
        "square root (sqrt), or unchanged (none).",
        rich_help_panel=_L,
    ),
]
HETERO_PANEL = "Heterogeneous clusters"
CalibrationOpt = Annotated[
    str | None,
    typer.Option(
        "--calibration",
        metavar="FILE|auto",
        envvar="CORRAL_CALIBRATION",
        help="Split the work in proportion to each rank's measured throughput: a file "
        "from `corral calibrate` (same hosts and ranks), or 'auto' to run the built-in "
        "calibration first. Ranks read their weight with the SDK "
        "(sdk.WeightedDistributedSampler, sdk.local_batch_size, sdk.loss_scale).",
        rich_help_panel=HETERO_PANEL,
    ),
]
CalibrationSecondsOpt = Annotated[
    float,
    typer.Option(
        "--calibration-seconds",
        metavar="SECONDS",
        envvar="CORRAL_CALIBRATION_SECONDS",
        help="How long --calibration auto measures (as corral calibrate --seconds).",
        rich_help_panel=HETERO_PANEL,
    ),
]
RebalanceOpt = Annotated[
    bool,
    typer.Option(
        "--rebalance",
        help="With --calibration: at each restart, re-weigh the ranks from their live "
        "throughput (sdk.report(step, examples=N)) instead of the calibration.",
        rich_help_panel=HETERO_PANEL,
    ),
]
QosOpt = Annotated[
    str | None,
    typer.Option(
        "--qos",
        metavar="|".join(QOS_CLASSES),
        envvar="CORRAL_QOS",
        help="macOS QoS class of every rank (pthread_set_qos_class_self_np; no effect elsewhere).",
        rich_help_panel=HETERO_PANEL,
    ),
]
JobIdOpt = Annotated[
    str | None,
    typer.Option("--job-id", help="Job id (default: generated, time-based).", rich_help_panel=_L),
]
CHECKS_PANEL = "Checks"

MinFreeOpt = Annotated[
    float,
    typer.Option(
        "--min-free-gb",
        metavar="GB",
        envvar="CORRAL_MIN_FREE_GB",
        help="Free space the checkpoint directory needs on every host.",
        rich_help_panel=CHECKS_PANEL,
    ),
]
ThresholdOpt = Annotated[
    float,
    typer.Option(
        "--consistency-threshold",
        metavar="FRACTION",
        envvar="CORRAL_CONSISTENCY_THRESHOLD",
        help="Share of hosts whose code must match this machine's (0.95 lets 1 in 20 "
        "differ, with a warning).",
        rich_help_panel=CHECKS_PANEL,
    ),
]
ExcludeOpt = Annotated[
    bool,
    typer.Option(
        "--exclude-divergent",
        help="Leave hosts whose code differs out of the job (when the rest is still a "
        "valid cluster).",
        rich_help_panel=CHECKS_PANEL,
    ),
]
CodeDirOpt = Annotated[
    str | None,
    typer.Option(
        "--code-dir",
        metavar="DIR",
        envvar="CORRAL_CODE_DIR",
        help="The code tree here that the hosts' --workdir must match (default: the "
        "current directory).",
        rich_help_panel=CHECKS_PANEL,
    ),
]
NoPreflightOpt = Annotated[
    bool,
    typer.Option(
        "--no-preflight",
        envvar="CORRAL_NO_PREFLIGHT",
        help="Launch without the pre-flight checklist (see `corral check`).",
        rich_help_panel=CHECKS_PANEL,
    ),
]
SmokeTestOpt = Annotated[
    bool,
    typer.Option(
        "--smoke-test",
        help="Add the collective smoke test (an all-reduce over every rank) to the pre-flight.",
        rich_help_panel=CHECKS_PANEL,
    ),
]
SyncOpt = Annotated[
    bool,
    typer.Option(
        "--sync",
        help="Push the code tree to every host (corral sync) before the pre-flight.",
        rich_help_panel=CHECKS_PANEL,
    ),
]
SyncScriptOpt = Annotated[
    str | None,
    typer.Option(
        "--sync-script",
        metavar="FILE",
        envvar="CORRAL_SYNC_SCRIPT",
        help="Your own sync script, run before the pre-flight: a non-zero exit blocks the "
        "launch; a missing script is a warning.",
        rich_help_panel=CHECKS_PANEL,
    ),
]
FAULTS_PANEL = "Fault tolerance"

MaxRestartsOpt = Annotated[
    int,
    typer.Option(
        "--max-restarts",
        metavar="N",
        envvar="CORRAL_MAX_RESTARTS",
        help="Restart the job (from its latest checkpoint) up to N times after a failed "
        "rank, a lost host or a hang.",
        rich_help_panel=FAULTS_PANEL,
    ),
]
RestartBackoffOpt = Annotated[
    float,
    typer.Option(
        "--restart-backoff",
        metavar="SECONDS",
        envvar="CORRAL_RESTART_BACKOFF",
        help="Seconds before the first restart, doubled for each further one (at most 60).",
        rich_help_panel=FAULTS_PANEL,
    ),
]
MinNodesOpt = Annotated[
    int | None,
    typer.Option(
        "--min-nodes",
        metavar="N",
        envvar="CORRAL_MIN_NODES",
        help="Restart without lost hosts while at least M hosts remain (ranks are "
        "re-assigned). Default: all hosts, i.e. a lost host ends the job.",
        rich_help_panel=FAULTS_PANEL,
    ),
]
HostTimeoutOpt = Annotated[
    float,
    typer.Option(
        "--host-timeout",
        metavar="SECONDS",
        envvar="CORRAL_HOST_TIMEOUT",
        help="Seconds without a heartbeat from a host's agent (link down, host hung) "
        "before the host is declared lost.",
        rich_help_panel=FAULTS_PANEL,
    ),
]
HangTimeoutOpt = Annotated[
    float | None,
    typer.Option(
        "--hang-timeout",
        metavar="SECONDS",
        envvar="CORRAL_HANG_TIMEOUT",
        help="Seconds without progress (sdk.report) on any rank, or one rank behind the "
        "others, before every rank's stack is dumped and the job stopped (or restarted). "
        "Counted once a rank has reported progress. Default: "
        f"{AUTO_HANG_TIMEOUT:g} s.",
        rich_help_panel=FAULTS_PANEL,
    ),
]
ReplicateOpt = Annotated[
    bool,
    typer.Option(
        "--replicate-checkpoints",
        help="Copy each new rank-0 checkpoint to this machine (runs/<job>/checkpoints) "
        "before the save returns, so a restart resumes from it even when the host that "
        "wrote it is lost.",
        rich_help_panel=FAULTS_PANEL,
    ),
]
ScriptArg = Annotated[
    list[str] | None,
    typer.Argument(
        help="The script and its arguments, after `--`.",
        show_default=False,
        metavar="-- SCRIPT [ARGS]...",
    ),
]


SecretEnvOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--secret-env",
        metavar="KEY",
        help="An --env key whose value is secret although its name does not say so "
        "(names with TOKEN, SECRET, PASSWORD or KEY always are): its value reaches the "
        "ranks but is redacted in plan.json, spec.json, `corral plan` and every log. "
        "Repeatable.",
        rich_help_panel=_L,
    ),
]


@dataclass(frozen=True)
class LaunchChoices:
    """The launcher-specific options of ``run`` and ``plan``."""

    command_template: str | None = None
    tags: str | None = None
    additional_args: str | None = None
    harness: bool = False
    lr_scaling: str = "linear"
    qos: str | None = None


def _spec(
    cluster: Cluster,
    command: list[str] | None,
    *,
    launcher: str,
    python: str | None,
    nproc_per_node: str | None,
    master_addr: str | None,
    master_port: int,
    workdir: str | None,
    env: list[str] | None,
    secret_env: list[str] | None,
    nccl_interface: str | None,
    gloo_interface: str | None,
    timeout: float | None,
    checkpoint_dir: str | None,
    run_dir: str,
    rdzv_timeout: float,
    job_id: str | None,
    mlx_backend: str = "ring",
    shared_data_path: str | None = None,
    launch: LaunchChoices | None = None,
) -> JobSpec:
    """The JobSpec of SCRIPT [ARGS] and the LAUNCH options."""
    launch = launch or LaunchChoices()
    if not command and launcher not in NODE_LAUNCHERS:
        raise ConfigError("no script given: corral run [OPTIONS] -- SCRIPT [ARGS...]")
    if launcher not in LAUNCHERS:
        raise ConfigError(
            f"unknown launcher {launcher!r}; choose one of {', '.join(LAUNCHERS)}",
            option="--launcher",
        )
    if mlx_backend not in MLX_BACKENDS:
        raise ConfigError(
            f"unknown MLX backend {mlx_backend!r}; choose one of {', '.join(MLX_BACKENDS)}",
            option="--mlx-backend",
        )
    script, *args = command or [""]
    harness: HarnessMode | None = None
    config: str | None = None
    if launch.harness:
        if not script:
            raise ConfigError("needs -- PLUGIN_DIR_OR_SCRIPT [ARGS...]", option="--harness")
        harness, script = harness_target(script)
        config = read_config(args)
    spec = JobSpec(
        script=script,
        args=tuple(args),
        launcher=cast(Launcher, launcher),
        mlx_backend=mlx_backend,
        shared_data_path=shared_data_path,
        command_template=launch.command_template,
        madengine_tags=launch.tags,
        madengine_args=launch.additional_args,
        harness=harness,
        harness_config=config,
        lr_scaling=launch.lr_scaling,
        job_id=job_id or new_job_id(),
        python=python,
        nproc_per_node=parse_nproc(nproc_per_node, cluster),
        master_addr=master_addr,
        master_port=master_port,
        workdir=workdir,
        env=parse_env(env or []),
        secret_env=tuple(secret_env or ()),
        nccl_interface=nccl_interface,
        gloo_interface=gloo_interface,
        timeout=timeout,
        checkpoint_dir=checkpoint_dir,
        rdzv_timeout=rdzv_timeout,
        run_dir=run_dir,
    )
    if launch.qos is not None and launch.qos not in QOS_CLASSES:
        raise ConfigError(
            f"unknown QoS class {launch.qos!r}; choose one of {', '.join(QOS_CLASSES)}",
            option="--qos",
        )
    validate_launcher(spec)  # before resolve() rewrites the script's path
    return replace(spec, qos=launch.qos) if launch.qos else spec


def _weighted(
    spec: JobSpec,
    cluster: Cluster,
    calibration: str | None,
    console: Console,
    *,
    ssh: SshOptions | None,
    seconds: float = 30.0,
) -> JobSpec:
    """``spec`` with the ranks' workload weights from ``--calibration FILE|auto``
    (``auto``: calibrate now; without ``ssh``, i.e. in a dry run, it is only noted)."""
    if not calibration:
        return spec
    from corral.calibrate.model import Calibration
    from corral.calibrate.resolve import planned_ranks, resolve_weights

    source: str | Calibration = calibration
    if calibration == "auto":
        if ssh is None:
            console.print(
                "--calibration auto: the weights are measured at launch (the built-in "
                "calibration on these hosts); `corral calibrate` shows them now",
                style="dim",
                markup=False,
            )
            return spec
        from corral.calibrate.measure import CalibrateOptions
        from corral.cli.calibrate import print_calibration, run_calibration

        options = CalibrateOptions(
            seconds=seconds,
            nproc_per_node=spec.nproc_per_node,
            python=spec.python,
            env=dict(spec.env),
            run_dir=spec.run_dir,
        )
        measured = run_calibration(cluster, options, ssh, console)
        print_calibration(measured.calibration, console)
        source = measured.calibration
    weights = resolve_weights(source, cluster, spec.nproc_per_node)
    ranks = planned_ranks(cluster, spec.nproc_per_node)
    pairs = zip(ranks, weights, strict=True)
    console.print(weights_line((h.name, local, w) for (h, local), w in pairs), markup=False)
    return replace(spec, workload_weights=weights)


def _show_checked(event: Checked, console: Console) -> None:
    """The pre-flight report: every problem when it blocks, warnings, the verdict."""
    report = event.report
    if event.blocking:
        print_checklist(console, report)
        return
    if report.overall_status is Status.WARN:
        problems(console, report)
    console.print(verdict(report, "pre-flight "))


async def _drive(job: Job) -> int:
    """Run ``job`` with Ctrl-C / SIGTERM mapped to ``job.stop()``; its exit code."""
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, job.stop)
    try:
        result = await job.run()
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signum)
    return result.exit_code


def run(
    command: ScriptArg = None,
    hosts: HostsOpt = None,
    ssh_user: SshUserOpt = None,
    ssh_key: SshKeyOpt = None,
    ssh_port: SshPortOpt = None,
    ssh_password_env: SshPasswordEnvOpt = None,
    ssh_config: SshConfigOpt = None,
    accept_new_host_keys: AcceptNewHostKeysOpt = False,
    insecure_no_host_key_check: InsecureNoHostKeyCheckOpt = False,
    launcher: RunLauncherOpt = None,
    python: PythonOpt = None,
    nproc_per_node: NprocOpt = None,
    master_addr: MasterAddrOpt = None,
    master_port: MasterPortOpt = DEFAULT_MASTER_PORT,
    workdir: WorkdirOpt = None,
    env: EnvOpt = None,
    secret_env: SecretEnvOpt = None,
    nccl_interface: NcclOpt = None,
    gloo_interface: GlooOpt = None,
    timeout: TimeoutOpt = None,
    checkpoint_dir: CheckpointOpt = None,
    run_dir: RunDirOpt = "runs",
    grace: GraceOpt = 10.0,
    rdzv_timeout: RdzvTimeoutOpt = DEFAULT_RDZV_TIMEOUT,
    job_id: JobIdOpt = None,
    mlx_backend: MlxBackendOpt = "ring",
    shared_data_path: SharedDataPathOpt = None,
    command_template: CommandTemplateOpt = None,
    tags: TagsOpt = None,
    additional_args: AdditionalArgsOpt = None,
    harness: HarnessOpt = False,
    lr_scaling: LrScalingOpt = "linear",
    calibration: CalibrationOpt = None,
    calibration_seconds: CalibrationSecondsOpt = 30.0,
    rebalance: RebalanceOpt = False,
    qos: QosOpt = None,
    no_preflight: NoPreflightOpt = False,
    smoke_test: SmokeTestOpt = False,
    min_free_gb: MinFreeOpt = DEFAULT_MIN_FREE_GB,
    consistency_threshold: ThresholdOpt = 1.0,
    exclude_divergent: ExcludeOpt = False,
    code_dir: CodeDirOpt = None,
    sync: SyncOpt = False,
    sync_script: SyncScriptOpt = None,
    max_restarts: MaxRestartsOpt = 0,
    restart_backoff: RestartBackoffOpt = 1.0,
    min_nodes: MinNodesOpt = None,
    host_timeout: HostTimeoutOpt = DEFAULT_HOST_TIMEOUT,
    hang_timeout: HangTimeoutOpt = None,
    replicate_checkpoints: ReplicateOpt = False,
) -> None:
    """Launch SCRIPT on every node and supervise it; the exit code is the job's result.

    Exit codes: 0 success; the failing rank's own code; 128+N when it was killed by
    signal N; 124 --timeout; 125 a hang was detected; 130 interrupted; 255 a host was
    lost; 3 the job could not start; 2 bad options or hostfile. With --max-restarts,
    the code of the last attempt.
    """
    policies = dict(
        restarts=RestartPolicy(max_restarts, restart_backoff, min_nodes),
        supervision=SupervisionPolicy(grace, host_timeout, hang_timeout),
        checks=CheckPolicy(
            enabled=not no_preflight,
            smoke_test=smoke_test,
            min_free_gb=min_free_gb,
            consistency_threshold=consistency_threshold,
            exclude_divergent=exclude_divergent,
            code_dir=code_dir,
        ),
        sync=SyncPolicy(push=sync, script=sync_script, source=code_dir),
        checkpoints=CheckpointPolicy(checkpoint_dir, replicate_checkpoints)
        if checkpoint_dir
        else CheckpointPolicy(),
    )
    if replicate_checkpoints and not checkpoint_dir:
        CheckpointPolicy(None, True)  # raises: --replicate-checkpoints needs --checkpoint-dir
    ssh = SshOptions(
        user=ssh_user,
        key=ssh_key,
        port=ssh_port,
        password_env=ssh_password_env,
        config=ssh_config,
        accept_new_host_keys=accept_new_host_keys,
        insecure_no_host_key_check=insecure_no_host_key_check,
    )
    cluster = load_cluster(require_hosts(hosts), ssh_user=ssh.user, ssh_port=ssh.port)
    spec = _spec(
        cluster,
        command,
        launcher=launcher or ("accelerate" if harness else "torchrun"),
        python=python,
        nproc_per_node=nproc_per_node,
        master_addr=master_addr,
        master_port=master_port,
        workdir=workdir,
        env=env,
        secret_env=secret_env,
        nccl_interface=nccl_interface,
        gloo_interface=gloo_interface,
        timeout=timeout,
        checkpoint_dir=checkpoint_dir,
        run_dir=run_dir,
        rdzv_timeout=rdzv_timeout,
        job_id=job_id,
        mlx_backend=mlx_backend,
        shared_data_path=shared_data_path,
        launch=LaunchChoices(command_template, tags, additional_args, harness, lr_scaling, qos),
    )
    if rebalance and not calibration:
        raise ConfigError("needs --calibration FILE|auto", option="--rebalance")
    spec = _weighted(
        spec, cluster, calibration, make_console(stderr=False), ssh=ssh, seconds=calibration_seconds
    )
    job = Job(spec, cluster, ssh=ssh, **policies)  # type: ignore[arg-type]
    if spec.workload_weights:
        from corral.calibrate.drift import DriftMonitor

        monitor = DriftMonitor(
            spec.workload_weights,
            cluster,
            spec.nproc_per_node,
            emit=job.emit,
            rebalance=rebalance,
            save_to=Path(spec.run_dir, spec.job_id, "calibration-live.json"),
        )
        job.subscribe(monitor.on_event)
        job.before_restart = monitor.respec
    output = TerminalOutput(
        [h.name for h in cluster.hosts], on_finish=print_finished, on_checked=_show_checked
    )
    job.subscribe(output.on_event)
    try:
        code = asyncio.run(_drive(job))
    finally:
        output.close()
    raise typer.Exit(code)


def plan(
    command: ScriptArg = None,
    hosts: HostsOpt = None,
    ssh_user: SshUserOpt = None,
    ssh_port: SshPortOpt = None,
    launcher: RunLauncherOpt = None,
    python: PythonOpt = None,
    nproc_per_node: NprocOpt = None,
    master_addr: MasterAddrOpt = None,
    master_port: MasterPortOpt = DEFAULT_MASTER_PORT,
    workdir: WorkdirOpt = None,
    env: EnvOpt = None,
    secret_env: SecretEnvOpt = None,
    nccl_interface: NcclOpt = None,
    gloo_interface: GlooOpt = None,
    checkpoint_dir: CheckpointOpt = None,
    run_dir: RunDirOpt = "runs",
    rdzv_timeout: RdzvTimeoutOpt = DEFAULT_RDZV_TIMEOUT,
    job_id: JobIdOpt = None,
    mlx_backend: MlxBackendOpt = "ring",
    shared_data_path: SharedDataPathOpt = None,
    command_template: CommandTemplateOpt = None,
    tags: TagsOpt = None,
    additional_args: AdditionalArgsOpt = None,
    harness: HarnessOpt = False,
    lr_scaling: LrScalingOpt = "linear",
    calibration: CalibrationOpt = None,
    qos: QosOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
) -> None:
    """Print the exact per-node command and environment `corral run` would use (dry run).

    Secret values (see --secret-env) are redacted.
    """
    cluster = load_cluster(require_hosts(hosts), ssh_user=ssh_user, ssh_port=ssh_port)
    spec = _spec(
        cluster,
        command,
        launcher=launcher or ("accelerate" if harness else "torchrun"),
        python=python,
        nproc_per_node=nproc_per_node,
        master_addr=master_addr,
        master_port=master_port,
        workdir=workdir,
        env=env,
        secret_env=secret_env,
        nccl_interface=nccl_interface,
        gloo_interface=gloo_interface,
        timeout=None,
        checkpoint_dir=checkpoint_dir,
        run_dir=run_dir,
        rdzv_timeout=rdzv_timeout,
        job_id=job_id,
        mlx_backend=mlx_backend,
        shared_data_path=shared_data_path,
        launch=LaunchChoices(command_template, tags, additional_args, harness, lr_scaling, qos),
    )
    spec = _weighted(spec, cluster, calibration, make_console(stderr=as_json), ssh=None)
    prepared = dry_run(spec, cluster)
    if as_json:
        doc: dict[str, object] = {
            "job_id": prepared.spec.job_id,
            "launcher": prepared.spec.launcher,
            "nodes": [c.to_json(redact=True) for c in prepared.commands],
        }
        if prepared.spec.workload_weights:
            doc["workload_weights"] = list(prepared.spec.workload_weights)
        if prepared.spec.harness:
            doc["harness"] = {"mode": prepared.spec.harness, "config": _adjusted(prepared)}
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
        return
    console = make_console(stderr=False)
    print_plan(prepared, console)
    note = python_note(prepared.commands, candidates(None)) if python is None else None
    if note is not None:
        console.print(note, style="dim", markup=False)


def _adjusted(prepared: Prepared) -> dict[str, object] | None:
    """The harness's config as the plan adjusted it (None without one)."""
    raw = prepared.commands[0].env.get(JOB_CONFIG_ENV) if prepared.commands else None
    return None if raw is None else dict(json.loads(raw))


def print_plan(prepared: Prepared, console: Console) -> None:
    """A table (node, host, ranks, cwd), then per node its env as ``K=V`` lines and
    the command as one copy-pasteable shell line (one per rank for the python
    launcher). Secret values are redacted."""
    spec = prepared.spec
    table = Table(
        title=f"plan for job {spec.job_id} ({spec.launcher}, {len(prepared.commands)} nodes)",
        title_justify="left",
    )
    for column in ("node", "host", "ranks", "cwd"):
        table.add_column(column, overflow="fold")
    for cmd in prepared.commands:
        ranks = (
            ", ".join(str(r.rank) for r in cmd.ranks)
            if cmd.ranks
            else f"{cmd.nproc} (assigned at rendezvous)"
        )
        table.add_row(str(cmd.node_rank), cmd.host.name, ranks, cmd.cwd)
    console.print(table)
    for cmd in prepared.commands:
        console.print(f"\nnode {cmd.node_rank} ({cmd.host.name}) env:", style="bold", markup=False)
        for key, value in node_env(cmd).items():
            console.print(f"  {key}={value}", markup=False, soft_wrap=True)
        for run in command_lines(cmd):
            console.print(f"node {cmd.node_rank} {run.label}:", style="bold", markup=False)
            console.print(run.line, markup=False, soft_wrap=True)
        reference = reference_line(cmd)
        if reference is not None:
            console.print(
                f"node {cmd.node_rank} as {spec.launcher} would start it (for reference; "
                "corral starts the ranks above itself, so each rank's exit code is its own):",
                style="bold",
                markup=False,
            )
            console.print(reference, markup=False, soft_wrap=True)
    config = _adjusted(prepared)
    if config is not None:
        console.print(
            f"\nharness config (--config_file adjusted for {prepared.world_size} ranks; "
            "rank, local_rank, is_main_process and, for ranks other than 0, "
            "output_dir/rank-N are added on each rank):",
            style="bold",
            markup=False,
        )
        console.print(json.dumps(config, indent=2), markup=False, soft_wrap=True)


def register(app: typer.Typer) -> None:
    """Add ``run`` and ``plan`` to the root app."""
    ctx = {"allow_interspersed_args": False}
    app.command("run", context_settings=ctx)(run)
    app.command("plan", context_settings=ctx)(plan)
