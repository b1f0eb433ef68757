"""THE schema of a job's options: :class:`JobOptions`, one frozen dataclass whose
every field carries its type and default (written here, once) and an :class:`Option`
in its metadata (:class:`corral.job.option.Option`, declared with
:func:`~corral.job.option.option`): help text,
command-line flag and its ``CORRAL_*`` environment variable, the API's constraints,
its choices, its place on the web form, and the entry points that do *not* offer it,
each with the reason why (:attr:`Option.not_at`).

Derived from it (so an option is added once, here):

- the flags of ``corral run``, ``corral plan``, ``corral job submit``, ``corral k8s
  render|apply`` and ``corral slurm render|submit``
  (:func:`corral.cli.options.job_flags`);
- the API's ``JobRequest`` (:mod:`corral.service.models`): a field of the same name,
  default, description and constraints, handed to the job's options as it is;
- the web page's new-job form (:mod:`corral.web.form`): the fields with a
  :attr:`Option.section`, from the request's JSON schema.

``tests/unit/test_option_schema.py`` walks every field and finds it at every entry
point of :attr:`Option.entries`. A leaf: the standard library and value modules only.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from corral.contract import FT_SYNC_MODES, QOS_CLASSES
from corral.defaults import (
    DEFAULT_COLLECTIVE_TIMEOUT,
    DEFAULT_FT_JOIN_TIMEOUT,
    DEFAULT_GRACE,
    DEFAULT_HOST_TIMEOUT,
    DEFAULT_LINKS_MIN_RATIO,
    DEFAULT_MIN_FREE_GB,
)
from corral.job.option import (
    ENTRIES,
    VERBS,
    Entry,
    Option,
    default_of,
    option,
    option_list,
)
from corral.plan.spec import DEFAULT_RDZV_TIMEOUT, LAUNCHERS, LR_SCALING, MLX_BACKENDS

RECOVERY_MODES: tuple[str, ...] = ("restart", "in-place")

_SERVER_PICKS = "the server assigns it"
_DRY = "a dry run starts nothing: no pre-flight, no supervisor"
_NO_SUPERVISOR = "no corral supervisor there: Kubernetes / Slurm run torchrun themselves"
_NO_PREFLIGHT = "no corral pre-flight there: the pods / the allocation start at once"
_RENDERS = {"k8s": _NO_SUPERVISOR, "slurm": _NO_SUPERVISOR}
_SUPERVISED = {"plan": _DRY, **_RENDERS}
"""Not at the dry run and the renders: what corral's supervisor or pre-flight does."""
_NO_ACTOR_CHECKS = "no pre-flight in the actors runtime: the coordinator starts its workers at once"
_CHECKED = {"plan": _DRY, "k8s": _NO_PREFLIGHT, "slurm": _NO_PREFLIGHT, "actors": _NO_ACTOR_CHECKS}
_SERVED_MASTER = "the server makes its first chosen machine the master"
_NO_ACTORS_IN_PLACE = "an actors worker restarts alone (max_restarts); no in-place recovery yet"
_IN_PLACE_ONLY = {
    **{e: "no in-place recovery there (no Lighthouse, no replica groups)" for e in _RENDERS},
    "actors": _NO_ACTORS_IN_PLACE,
}
"""Not at the renders and the actors: what only ``--recovery in-place`` uses."""
_WORK_FN = "every actors worker runs the coordinator's work_fn (Cluster.start), one per rank"
_COORDINATED = "the coordinator program watches its workers itself (recv/call timeouts, on_report)"


def _not_served(why: str) -> dict[str, str]:
    """The same reason at the server's three entry points (verb, API, form)."""
    return {"submit": why, "api": why, "web": why}


def options_of(entry: str | None = None) -> tuple[tuple[dataclasses.Field[Any], Option], ...]:
    """Every :class:`JobOptions` field with its :class:`Option`, in declaration order;
    with ``entry``, those that entry point exposes."""
    found = tuple((f, f.metadata["option"]) for f in dataclasses.fields(JobOptions))
    return found if entry is None else tuple((f, o) for f, o in found if entry in o.entries)


_PATH = {"min_length": 1, "max_length": 4096}
_INTERFACE = {"min_length": 1, "max_length": 255, "pattern": r"^[^\s\x00]+$"}
"""A network interface (or NCCL's ``^docker,lo`` / ``=eth0`` forms): no blank."""
_CHECKS = "Checks"
_FAULTS = "Fault tolerance"
_HETERO = "Heterogeneous clusters"
_TRACK = "Experiment tracking"


@dataclass(frozen=True)
class JobOptions:
    """A job as the user asked for it, and THE schema of a job's options: each field's
    type and default are written here once, with its :class:`Option` (help, flag,
    environment variable, entry points, the API's bounds, the form's place). The verbs'
    flags (:func:`corral.cli.options.job_flags`), the API's ``JobRequest``, the web form
    and the Kubernetes/Slurm verbs are derived from it; ``tests/unit/test_option_schema.py``
    finds every field at each entry point it names, and the reason wherever it is not.

    Values are already parsed: ``env`` a mapping, ``nproc_per_node`` a number."""

    command: Sequence[str] = option(
        (),
        "The script and its arguments, after `--` (none for the launchers that run "
        "their own command).",
        {"actors": _WORK_FN},
        names={"api": "script", "web": "script"},
    )
    launcher: str | None = option(
        None,
        f"How ranks are started: {'|'.join(LAUNCHERS)}. Default: torchrun (accelerate "
        "with --harness). See docs/launchers.md.",
        {"actors": _WORK_FN},
        flag="--launcher",
        choices=LAUNCHERS,
        what="launcher",
        metavar="|".join(LAUNCHERS),
        envvar="CORRAL_LAUNCHER",
        metavar_for={"k8s": "torchrun|python", "slurm": "torchrun"},
        help_for={
            "k8s": "How each pod starts its ranks: torchrun (--nproc-per-node ranks), or "
            "python (the script itself, one rank per pod). Default: torchrun.",
            "slurm": "How each node starts its ranks: torchrun, the only launcher on Slurm.",
        },
    )
    python: str | None = option(
        None,
        "Interpreter on the hosts (its torchrun is used). Default: this interpreter for "
        "local nodes, else python3.",
        flag="--python",
        metavar="PATH",
        envvar="CORRAL_PYTHON",
        section="launch",
        label="Python on the machines",
        bounds=_PATH,
    )
    nproc_per_node: int | None = option(
        None,
        "Ranks per node: N, or 'auto' (GPUs, else the host's slots). Default: the host's slots.",
        {"actors": "a node's workers: NodeConfig.num_workers (from_hosts: workers_per_host)"},
        flag="--nproc-per-node",
        metavar="N|auto",
        envvar="CORRAL_NPROC_PER_NODE",
        bounds={"ge": 1, "le": 1024},
    )
    master_addr: str | None = option(
        None,
        "Rendezvous address (default: the first host).",
        {
            **_not_served(_SERVED_MASTER),
            "k8s": "pod 0's stable name (the headless Service) is the master",
            "slurm": "the allocation's first node is the master",
        },
        flag="--master-addr",
        metavar="HOST",
        envvar="CORRAL_MASTER_ADDR",
    )
    master_port: int = option(
        0,
        "Rendezvous port; 0 picks a free one on the first host at launch (Kubernetes: "
        "the pods' fixed port 29500; Slurm: 20000 + the Slurm job id mod 40000).",
        flag="--master-port",
        metavar="PORT",
        envvar="CORRAL_MASTER_PORT",
        bounds={"ge": 0, "le": 65535},
        section="launch",
        label="Master port",
    )
    workdir: str | None = option(
        None,
        "Working directory on every host (default for local nodes: their own directory "
        "under the run dir).",
        flag="--workdir",
        metavar="DIR",
        envvar="CORRAL_WORKDIR",
        section="launch",
        label="Working directory",
        bounds=_PATH,
    )
    env: Mapping[str, str] = option_list(
        "K=V set for every rank (repeatable); a bare K forwards this shell's value of K "
        "(keeps a secret off the command line). Nothing else of this shell's environment "
        "is forwarded.",
        mapping=True,
        flag="--env",
        metavar="K=V",
        help_for={
            "k8s": "K=V set in every pod (repeatable); a bare K is read from the "
            "--k8s-secret Secret (its key K), so its value never appears in the YAML."
        },
    )
    secret_env: Sequence[str] = option_list(
        "An --env key whose value is secret although its name does not say so (names with "
        "TOKEN, SECRET, PASSWORD or KEY always are): its value reaches the ranks but is "
        "redacted in plan.json, spec.json, `corral plan` and every log. Repeatable.",
        flag="--secret-env",
        metavar="KEY",
        section="advanced",
        label="Secret environment keys (one per line)",
        help_for={
            "k8s": "An env key read from the --k8s-secret Secret although its name does not "
            "say it is secret (names with TOKEN, SECRET, PASSWORD or KEY always are). "
            "Repeatable."
        },
    )
    nccl_interface: str | None = option(
        None,
        "NCCL_SOCKET_IFNAME of every rank.",
        flag="--nccl-interface",
        metavar="IFACE",
        envvar="CORRAL_NCCL_INTERFACE",
        section="network",
        label="NCCL interface",
        bounds=_INTERFACE,
    )
    gloo_interface: str | None = option(
        None,
        "GLOO_SOCKET_IFNAME of every rank.",
        flag="--gloo-interface",
        metavar="IFACE",
        envvar="CORRAL_GLOO_INTERFACE",
        section="network",
        label="Gloo interface",
        bounds=_INTERFACE,
    )
    timeout: float | None = option(
        None,
        "Stop the whole job after this many seconds (exit 124).",
        {
            "plan": _DRY,
            "slurm": "Slurm's own --time limit ends the allocation",
            "actors": "the coordinator program ends the job (Cluster.stop)",
        },
        flag="--timeout",
        metavar="SECONDS",
        envvar="CORRAL_TIMEOUT",
        bounds={"gt": 0},
        section="launch",
        label="Timeout (seconds)",
    )
    collective_timeout: float = option(
        DEFAULT_COLLECTIVE_TIMEOUT,
        "Seconds the process group may wait to form and in any one collective (gloo, "
        "NCCL) before it fails: a dead peer ends the job this soon instead of hanging. "
        "Exported to every rank as CORRAL_DIST_TIMEOUT; corral.sdk.init_distributed "
        "applies it.",
        flag="--collective-timeout",
        aliases=("--dist-timeout",),
        metavar="SECONDS",
        envvar="CORRAL_COLLECTIVE_TIMEOUT",
        bounds={"gt": 0, "le": 7 * 86400},
        section="network",
        label="Collective timeout (seconds)",
    )
    checkpoint_dir: str | None = option(
        None,
        "Exported to ranks as CORRAL_CHECKPOINT_DIR.",
        flag="--checkpoint-dir",
        metavar="DIR",
        envvar="CORRAL_CHECKPOINT_DIR",
        panel=_FAULTS,
        bounds=_PATH,
    )
    run_dir: str = option(
        "runs",
        "Where runs/<job-id>/ (logs, plan, result) is written.",
        {
            **_not_served("the server's own --run-dir holds every served job"),
            "k8s": "the pods write their own filesystem; kubectl logs reads the output",
        },
        flag="--run-dir",
        metavar="DIR",
        envvar="CORRAL_RUN_DIR",
    )
    rdzv_timeout: float = option(
        DEFAULT_RDZV_TIMEOUT,
        "Seconds to wait for every node to join and the master to accept connections.",
        {"actors": "no rendezvous: Cluster.start(wait_time=) bounds the workers' start"},
        flag="--rdzv-timeout",
        metavar="SECONDS",
        envvar="CORRAL_RDZV_TIMEOUT",
        bounds={"gt": 0, "le": 86400},
        section="launch",
        label="Rendezvous timeout (seconds)",
    )
    job_id: str | None = option(
        None,
        "Job id (default: generated, time-based).",
        {
            **_not_served(_SERVER_PICKS),
            "slurm": "sbatch numbers the batch job (corral slurm submit prints it)",
        },
        flag="--job-id",
    )
    name: str | None = option(
        None,
        "A name for the job (trackers name their run after it).",
        {
            "plan": "a dry run records nothing",
            "k8s": "the Job is named by --job-id",
            "slurm": "the batch job is named by --job-name",
            "actors": "nothing records an actors job (no store, no tracker)",
        },
        flag="--name",
        metavar="NAME",
        bounds={"max_length": 255},
    )
    owner: str | None = option(
        None,
        "Who submitted it (the server's user; None: the user running it).",
        {e: "the server's signed-in user, never an input" for e in ENTRIES},
    )
    mlx_backend: str = option(
        "ring",
        "MLX's distributed backend (--launcher mlx).",
        {
            **{e: "Kubernetes and Slurm run torchrun or python, not MLX" for e in ("k8s", "slurm")},
            "actors": _WORK_FN,
        },
        flag="--mlx-backend",
        choices=MLX_BACKENDS,
        what="MLX backend",
        metavar="|".join(MLX_BACKENDS),
        envvar="CORRAL_MLX_BACKEND",
        section="launch",
        label="MLX backend",
    )
    shared_data_path: str | None = option(
        None,
        "A path every host must see as the same filesystem (checked before the launch; "
        "exported to ranks as CORRAL_SHARED_DATA_PATH).",
        {"k8s": _NO_PREFLIGHT, "slurm": _NO_PREFLIGHT, "actors": _NO_ACTOR_CHECKS},
        flag="--shared-data-path",
        metavar="PATH",
        envvar="CORRAL_SHARED_DATA_PATH",
        section="preflight",
        label="Shared data path",
        bounds=_PATH,
    )
    command_template: str | None = option(
        None,
        "--launcher command: the command every node runs (through bash -c), with "
        "{node_rank} {nnodes} {nproc_per_node} {world_size} {master_addr} {master_port} "
        "{host} {job_id} {nccl_interface} {gloo_interface} filled in, shell-quoted.",
        {
            **{e: "Kubernetes and Slurm run torchrun or python" for e in ("k8s", "slurm")},
            "actors": _WORK_FN,
        },
        flag="--command-template",
        metavar="TEMPLATE",
        envvar="CORRAL_COMMAND_TEMPLATE",
        bounds={"min_length": 1, "max_length": 8192},
    )
    tags: str | None = option(
        None,
        "--launcher madengine: the model tags (madengine run --tags).",
        {
            **_not_served("madengine is not a launcher of served jobs"),
            **{e: "Kubernetes and Slurm run torchrun or python" for e in ("k8s", "slurm")},
            "actors": _WORK_FN,
        },
        flag="--tags",
        metavar="MODEL",
    )
    additional_args: str | None = option(
        None,
        "--launcher madengine: more arguments for madengine run (shell syntax).",
        {
            **_not_served("madengine is not a launcher of served jobs"),
            **{e: "Kubernetes and Slurm run torchrun or python" for e in ("k8s", "slurm")},
            "actors": _WORK_FN,
        },
        flag="--additional-args",
        metavar="ARGS",
    )
    harness: bool = option(
        False,
        "Run an unmodified plugin (-- PLUGIN_DIR_OR_SCRIPT --config_file FILE ...) in "
        "distributed mode: an Accelerator for it, its JSON config adjusted to the world "
        "size (batch / world, learning rate scaled, rank-0 outputs).",
        {
            **_not_served("a served job's config is adjusted by adjust_config (--adjust-config)"),
            **{e: "the harness's Accelerator runs under corral's launch" for e in ("k8s", "slurm")},
            "actors": _WORK_FN,
        },
        flag="--harness",
    )
    lr_scaling: str = option(
        "linear",
        "--harness: the config's learning rate times the world size (linear), its square "
        "root (sqrt), or unchanged (none).",
        {
            **_not_served(
                "a served job scales its config by config_scaling.rule "
                "(job submit --lr-scaling, with --adjust-config)"
            ),
            **{e: "the harness runs under corral's launch only" for e in ("k8s", "slurm")},
            "actors": _WORK_FN,
        },
        flag="--lr-scaling",
        choices=LR_SCALING,
        what="learning-rate rule",
        metavar="|".join(LR_SCALING),
        envvar="CORRAL_LR_SCALING",
    )
    qos: str | None = option(
        None,
        f"macOS QoS class of every rank: {', '.join(QOS_CLASSES)} "
        "(pthread_set_qos_class_self_np; no effect elsewhere).",
        {e: "a macOS-only setting; pods and Slurm nodes run Linux" for e in ("k8s", "slurm")},
        flag="--qos",
        choices=tuple(QOS_CLASSES),
        what="QoS class",
        metavar="|".join(QOS_CLASSES),
        envvar="CORRAL_QOS",
        panel=_HETERO,
        section="launch",
        label="QoS class (macOS)",
    )
    workload_weights: Sequence[float] = option_list(
        "The ranks' workload weights given directly instead of a calibration: one positive "
        "number per rank in plan order (machine by machine, then local rank).",
        {
            "run": "--calibration FILE|auto weighs the ranks (measured, matched to the hosts)",
            "plan": "--calibration FILE weighs the ranks (measured, matched to the hosts)",
            "k8s": "the renders carry no weights",
            "slurm": "the renders carry no weights",
        },
        flag="--workload-weights",
        metavar="W,W,...",
        panel=_HETERO,
        section="advanced",
        label="Workload weights (one per rank, comma-separated)",
    )
    # the pre-flight and the code sync
    preflight: bool = option(
        True,
        "Launch without the pre-flight checklist (see `corral check`).",
        _CHECKED,
        flag="--no-preflight",
        negate=True,
        envvar="CORRAL_NO_PREFLIGHT",
        panel=_CHECKS,
    )
    smoke_test: bool = option(
        False,
        "Add the collective smoke test (an all-reduce over every rank) to the pre-flight.",
        _CHECKED,
        flag="--smoke-test",
        panel=_CHECKS,
        section="preflight",
        label="Collective smoke test",
    )
    check_links: bool = option(
        False,
        "Add the link matrix (as `corral check --links`) to the pre-flight: a host behind "
        "slow links blocks the launch.",
        _CHECKED,
        flag="--check-links",
        panel=_CHECKS,
        section="preflight",
        label="Check the links between machines",
    )
    links_min_ratio: float = option(
        DEFAULT_LINKS_MIN_RATIO,
        "A link below this fraction of the network's reference bandwidth (the median of "
        "each host's best link) is slow.",
        _CHECKED,
        flag="--links-min-ratio",
        metavar="FRACTION",
        envvar="CORRAL_LINKS_MIN_RATIO",
        panel=_CHECKS,
        bounds={"ge": 0, "lt": 1},
        section="preflight",
        label="Slow link: below this share of the reference",
    )
    links_min_gbs: float = option(
        0.0,
        "A link below this many GB/s (gigabytes per second) is slow, whatever the others "
        "do (0: no floor).",
        _CHECKED,
        flag="--links-min-gbs",
        metavar="GBPS",
        envvar="CORRAL_LINKS_MIN_GBS",
        panel=_CHECKS,
        bounds={"ge": 0, "le": 1e6},
        section="preflight",
        label="Slow link: below this many GB/s",
    )
    links_warn_only: bool = option(
        False,
        "A host behind slow links is a warning, not a failure.",
        _CHECKED,
        flag="--links-warn-only",
        panel=_CHECKS,
        section="preflight",
        label="Slow links only warn",
    )
    min_free_gb: float = option(
        DEFAULT_MIN_FREE_GB,
        "Free space the checkpoint directory needs on every host (GB).",
        _CHECKED,
        flag="--min-free-gb",
        metavar="GB",
        envvar="CORRAL_MIN_FREE_GB",
        panel=_CHECKS,
        bounds={"ge": 0, "le": 1e9},
        section="preflight",
        label="Free space for checkpoints (GB)",
    )
    consistency_threshold: float = option(
        1.0,
        "Share of hosts whose code must match the code directory's (0.95 lets 1 in 20 "
        "differ, with a warning).",
        _CHECKED,
        flag="--consistency-threshold",
        metavar="FRACTION",
        envvar="CORRAL_CONSISTENCY_THRESHOLD",
        panel=_CHECKS,
        bounds={"gt": 0, "le": 1},
        section="preflight",
        label="Code consistency threshold",
    )
    exclude_divergent: bool = option(
        False,
        "Leave hosts whose code differs out of the job (when the rest is still a valid cluster).",
        {
            **_not_served(
                "the server's plan fixes the machines: one whose code differs fails the pre-flight"
            ),
            **_CHECKED,
        },
        flag="--exclude-divergent",
        panel=_CHECKS,
    )
    code_dir: str | None = option(
        None,
        "The code tree that the hosts' --workdir must match and --sync pushes (default: "
        "the current directory; a served job: the script's directory on the server).",
        _CHECKED,
        flag="--code-dir",
        metavar="DIR",
        envvar="CORRAL_CODE_DIR",
        panel=_CHECKS,
        section="launch",
        label="Code directory",
        bounds=_PATH,
    )
    sync: bool = option(
        False,
        "Push the code tree to every host (corral sync) before the pre-flight.",
        _CHECKED,
        flag="--sync",
        panel=_CHECKS,
        section="launch",
        label="Sync the code directory before launch",
    )
    sync_script: str | None = option(
        None,
        "Your own sync script, run before the pre-flight: a non-zero exit blocks the "
        "launch; a missing script is a warning.",
        {
            **_not_served(
                "a script the server would run as itself: a user never reaches "
                "the server's own account"
            ),
            **_CHECKED,
        },
        flag="--sync-script",
        metavar="FILE",
        envvar="CORRAL_SYNC_SCRIPT",
        panel=_CHECKS,
    )
    # fault tolerance and teardown
    max_restarts: int = option(
        0,
        "Restart the job (from its latest checkpoint) up to N times after a failed rank, "
        "a lost host or a hang.",
        {"plan": "a dry run plans the first attempt"},
        flag="--max-restarts",
        metavar="N",
        envvar="CORRAL_MAX_RESTARTS",
        panel=_FAULTS,
        bounds={"ge": 0, "le": 1000},
    )
    restart_backoff: float = option(
        1.0,
        "Seconds before the first restart, doubled for each further one (at most 60).",
        _SUPERVISED,
        flag="--restart-backoff",
        metavar="SECONDS",
        envvar="CORRAL_RESTART_BACKOFF",
        panel=_FAULTS,
        bounds={"ge": 0, "le": 3600},
        section="fault",
        label="Restart backoff (seconds)",
    )
    min_nodes: int | None = option(
        None,
        "Restart without lost hosts while at least M hosts remain (ranks are re-assigned). "
        "Default: all hosts, i.e. a lost host ends the job.",
        {
            **_not_served("a served job restarts on the machines it was planned on"),
            **_RENDERS,
            "actors": "a worker is one rank bound to its host: a lost host is reconnected",
        },
        flag="--min-nodes",
        metavar="N",
        envvar="CORRAL_MIN_NODES",
        panel=_FAULTS,
    )
    host_timeout: float = option(
        DEFAULT_HOST_TIMEOUT,
        "Seconds without a heartbeat from a host's agent (link down, host hung) before "
        "the host is declared lost.",
        _SUPERVISED,
        flag="--host-timeout",
        metavar="SECONDS",
        envvar="CORRAL_HOST_TIMEOUT",
        panel=_FAULTS,
        bounds={"gt": 0, "le": 86400},
        section="fault",
        label="Host timeout (seconds)",
    )
    hang_timeout: float | None = option(
        None,
        "Seconds without progress (sdk.report) on any rank, or one rank behind the "
        "others, before every rank's stack is dumped and the job stopped (or restarted). "
        "Counted once a rank has reported progress. Default: 300 s.",
        {**_SUPERVISED, "actors": _COORDINATED},
        flag="--hang-timeout",
        metavar="SECONDS",
        envvar="CORRAL_HANG_TIMEOUT",
        panel=_FAULTS,
        bounds={"gt": 0},
    )
    replicate_checkpoints: bool = option(
        False,
        "Copy each new rank-0 checkpoint to this machine (runs/<job>/checkpoints; a "
        "served job: the server) before the save returns, so a restart resumes from it "
        "even when the host that wrote it is lost.",
        {**_SUPERVISED, "actors": "the coordinator serves no checkpoint replica"},
        flag="--replicate-checkpoints",
        panel=_FAULTS,
        section="fault",
        label="Replicate checkpoints to the server",
    )
    grace: float = option(
        DEFAULT_GRACE,
        "Seconds between SIGTERM and SIGKILL at teardown.",
        _SUPERVISED,
        flag="--grace",
        metavar="SECONDS",
        envvar="CORRAL_GRACE",
        bounds={"ge": 0, "le": 3600},
        section="launch",
        label="Grace at teardown (seconds)",
    )
    recovery: str = option(
        "restart",
        "restart: a failure restarts every node from the last checkpoint. in-place "
        "(torchft): only the failed node's replica group is torn down and restarted; the "
        "others train on and it rejoins by healing from a live peer.",
        {**_RENDERS, "actors": _NO_ACTORS_IN_PLACE},
        flag="--recovery",
        choices=RECOVERY_MODES,
        what="recovery",
        metavar="restart|in-place",
        envvar="CORRAL_RECOVERY",
        panel=_FAULTS,
    )
    spares: int = option(
        0,
        "With --recovery in-place: hold the last N hosts in reserve for a lost node's group.",
        {**_RENDERS, "actors": _NO_ACTORS_IN_PLACE},
        flag="--spares",
        metavar="N",
        envvar="CORRAL_SPARES",
        panel=_FAULTS,
        bounds={"ge": 0, "le": 1024},
    )
    ft_sync: str | None = option(
        None,
        "With --recovery in-place: how sdk.fault_tolerant's replica groups sync: ddp "
        "(every step), diloco or localsgd (semi-synchronous: every H local steps). "
        "Exported to every rank as CORRAL_FT_SYNC (an --env of it wins); the script's "
        "own sync= wins over both. Default: the script decides (ddp).",
        _IN_PLACE_ONLY,
        flag="--ft-sync",
        choices=FT_SYNC_MODES,
        what="sync mode",
        metavar="|".join(FT_SYNC_MODES),
        envvar="CORRAL_RUN_FT_SYNC",  # not the ranks CORRAL_FT_SYNC: that one is the SDK's
        panel=_FAULTS,
        section="fault",
        label="Replica groups sync (in-place recovery)",
    )
    ft_sync_every: int | None = option(
        None,
        "With --ft-sync diloco|localsgd: sync every N local steps (H). Exported to every "
        "rank as CORRAL_FT_SYNC_EVERY (an --env of it wins). Default: corral chooses H "
        "from the measured sync and step times (a sync costs at most ~10%).",
        _IN_PLACE_ONLY,
        flag="--ft-sync-every",
        metavar="N",
        envvar="CORRAL_RUN_FT_SYNC_EVERY",
        panel=_FAULTS,
        bounds={"ge": 1, "le": 1_000_000},
        section="fault",
        label="Sync every N steps (empty: corral chooses)",
    )
    ft_join_timeout: float | None = option(
        None,
        "With --recovery in-place: seconds torchft's Lighthouse waits for a heartbeating "
        "replica group that has not yet asked for the next quorum (it must exceed a step: "
        "a group left out trains apart from the others). Default: "
        f"{DEFAULT_FT_JOIN_TIMEOUT:g} s.",
        _IN_PLACE_ONLY,
        flag="--ft-join-timeout",
        metavar="SECONDS",
        envvar="CORRAL_FT_JOIN_TIMEOUT",
        panel=_FAULTS,
        bounds={"gt": 0, "le": 86400},
        section="fault",
        label=f"Lighthouse join timeout, seconds (empty: {DEFAULT_FT_JOIN_TIMEOUT:g})",
    )
    # experiment tracking
    track: Sequence[str] = option_list(
        "Forward what the ranks report (corral.sdk.report: per-step metrics, per-rank "
        "throughput), the job's parameters and its final state to an experiment tracker; "
        "the coordinator does it, the script is unchanged. Repeatable. Each backend is an "
        "extra: pip install 'corral[mlflow]' / '[tensorboard]' / '[wandb]' (W&B runs "
        "offline, under the run dir, unless WANDB_MODE says otherwise).",
        {**_SUPERVISED, "actors": _COORDINATED},
        flag="--track",
        metavar="mlflow:URI|tensorboard:DIR|wandb:PROJECT",
        panel=_TRACK,
    )
    rebalance: bool = option(
        False,
        "With --calibration: at each restart, re-weigh the ranks from their live "
        "throughput (sdk.report(step, examples=N)) instead of the calibration, or move "
        "work away from a node with a compute straggler (sdk.section).",
        {**_SUPERVISED, "actors": "no calibration in the actors runtime"},
        flag="--rebalance",
        panel=_HETERO,
    )

    @property
    def launcher_name(self) -> str:
        """The job's launcher: ``--launcher``, else accelerate with ``--harness``, else
        torchrun."""
        return self.launcher or ("accelerate" if self.harness else "torchrun")


__all__ = [
    "ENTRIES",
    "RECOVERY_MODES",
    "VERBS",
    "Entry",
    "JobOptions",
    "Option",
    "default_of",
    "options_of",
]
