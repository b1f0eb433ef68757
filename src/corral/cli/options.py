"""The LAUNCH, checks, fault-tolerance and heterogeneous-cluster options, defined once
for every verb that takes them (``run``, ``plan``, ``check``, ``calibrate``, ``job``,
``k8s``, ``slurm``). The CLUSTER group is in :mod:`corral.cli.common`."""

from __future__ import annotations

from typing import Annotated

import typer

from corral.contract import QOS_CLASSES
from corral.plan.spec import LAUNCHERS, LR_SCALING, MLX_BACKENDS
from corral.recovery.hang import AUTO_HANG_TIMEOUT

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
        "throughput (sdk.report(step, examples=N)) instead of the calibration, or move "
        "work away from a node with a compute straggler (sdk.section).",
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
CheckLinksOpt = Annotated[
    bool,
    typer.Option(
        "--check-links",
        help="Add the link matrix (as `corral check --links`) to the pre-flight: a host "
        "behind slow links blocks the launch.",
        rich_help_panel=CHECKS_PANEL,
    ),
]
LinksMinRatioOpt = Annotated[
    float,
    typer.Option(
        "--links-min-ratio",
        metavar="FRACTION",
        envvar="CORRAL_LINKS_MIN_RATIO",
        help="A link below this fraction of the network's reference bandwidth (the median "
        "of each host's best link) is slow.",
        rich_help_panel=CHECKS_PANEL,
    ),
]
LinksMinGbsOpt = Annotated[
    float,
    typer.Option(
        "--links-min-gbs",
        metavar="GBPS",
        envvar="CORRAL_LINKS_MIN_GBS",
        help="A link below this many GB/s (gigabytes per second) is slow, whatever the "
        "others do (0: no floor).",
        rich_help_panel=CHECKS_PANEL,
    ),
]
LinksWarnOpt = Annotated[
    bool,
    typer.Option(
        "--links-warn-only",
        help="A host behind slow links is a warning, not a failure.",
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
RecoveryOpt = Annotated[
    str,
    typer.Option(
        "--recovery",
        metavar="restart|in-place",
        envvar="CORRAL_RECOVERY",
        help="restart: a failure restarts every node from the last checkpoint. in-place "
        "(torchft): only the failed node's replica group is torn down and restarted; the "
        "others train on and it rejoins by healing from a live peer.",
        rich_help_panel=FAULTS_PANEL,
    ),
]
SparesOpt = Annotated[
    int,
    typer.Option(
        "--spares",
        metavar="N",
        envvar="CORRAL_SPARES",
        help="With --recovery in-place: hold the hostfile's last N hosts in reserve for "
        "a lost node's group.",
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


TRACK_PANEL = "Experiment tracking"
TrackOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--track",
        metavar="mlflow:URI|tensorboard:DIR|wandb:PROJECT",
        help="Forward what the ranks report (corral.sdk.report: per-step metrics, per-rank "
        "throughput), the job's parameters and its final state to an experiment tracker; "
        "the coordinator does it, the script is unchanged. Repeatable. Each backend is an "
        "extra: pip install 'corral[mlflow]' / '[tensorboard]' / '[wandb]' (W&B runs "
        "offline, under the run dir, unless WANDB_MODE says otherwise).",
        rich_help_panel=TRACK_PANEL,
    ),
]
