"""Render a corral job as a Slurm batch script (pure, no I/O).

One Slurm task per node (``srun --ntasks-per-node=1``), each running torchrun
with c10d rendezvous on the allocation's first node (``scontrol show hostnames
"$SLURM_JOB_NODELIST" | head -n1``, reached at its Slurm ``NodeAddr``), explicit
rendezvous and process-group timeouts, ``NODE_RANK=$SLURM_NODEID`` and the
NCCL/GLOO interfaces asked for. Nodes other than the first wait, up to the
rendezvous timeout, until the master's port accepts connections, and exit with
:data:`MASTER_NOT_READY_EXIT` naming what failed when it does not.

Restarts: the job is ``--requeue``-able (node failure, preemption), and after a
failed run with attempts left (``--max-restarts``) the script requeues itself.
Every attempt sees ``CORRAL_ATTEMPT=$SLURM_RESTART_COUNT`` and
``CORRAL_CHECKPOINT_DIR``, so ``corral.sdk.resume()`` continues from the last
checkpoint.

The time limit: Slurm sends the batch shell ``SIGUSR1`` ``signal_lead`` seconds
before it (``#SBATCH --signal=B:USR1@N``). The script then asks every rank to
checkpoint now (``scancel --signal=USR2`` to the job's steps: torchrun and the
node scripts ignore it; a rank that polls ``corral.sdk.checkpoint_requested()``
sees it), gives the ranks :func:`checkpoint_grace` seconds (or until they end), and
requeues the job while restarts are left, so that a run longer than the time limit
goes on from its checkpoint instead of ending as TIMEOUT.

Secret values are never written into the script: a secret key must be given
bare (``--env HF_TOKEN``) and is forwarded from the submitter's environment at
submit time (``sbatch --export=HF_TOKEN``, see :func:`sbatch_argv`); the script
checks it arrived.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING

from corral.contract import (
    ATTEMPT_ENV,
    CHECKPOINT_DIR_ENV,
    CONTRACT_VARS,
    DIST_TIMEOUT_ENV,
    JOB_ID_ENV,
    RDZV_TIMEOUT_ENV,
    is_env_name,
)
from corral.defaults import DEFAULT_COLLECTIVE_TIMEOUT, DEFAULT_MASTER_PORT
from corral.errors import ConfigError
from corral.plan.spec import DEFAULT_RDZV_TIMEOUT
from corral.redact import is_secret

if TYPE_CHECKING:
    from corral.job.describe import JobDescription

__all__ = [
    "CHECKPOINT_SIGNAL",
    "DEFAULT_SIGNAL_LEAD",
    "MASTER_NOT_READY_EXIT",
    "SLURM_LAUNCHERS",
    "SlurmJob",
    "SlurmTarget",
    "checkpoint_grace",
    "env_items",
    "forwarded_keys",
    "render_slurm",
    "sbatch_argv",
    "slurm_job",
]

MASTER_NOT_READY_EXIT = 3
"""Exit code of a node whose master never accepted connections."""
READ_TIMEOUT = 60
"""torchrun's c10d ``read_timeout`` (seconds), as ``corral run`` uses."""
DEFAULT_SIGNAL_LEAD = 120
"""Seconds before the time limit at which the ranks are asked to checkpoint."""
CHECKPOINT_SIGNAL = "USR2"
"""The signal the ranks get for "checkpoint now" (corral.sdk's; USR1 dumps stacks)."""
SLURM_LAUNCHERS = ("torchrun",)
"""How a node starts its ranks on Slurm: torchrun only."""
_PORT_BASE, _PORT_SPAN = 20000, 40000
"""``--master-port 0``: a port derived from the Slurm job id in [20000, 60000)."""

_WORD = re.compile(r"^[A-Za-z0-9_.-]+$")
_PARTITIONS = re.compile(r"^[A-Za-z0-9_.-]+(,[A-Za-z0-9_.-]+)*$")
# Slurm's --time forms: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S
_TIME = re.compile(r"^(\d+(:\d{1,2}){0,2}|\d+-\d{1,2}(:\d{1,2}){0,2})$")

# Each rank's command: NODE_RANK is the node's rank as the rendezvous assigned it.
_RANK_WRAPPER = shlex.quote('export NODE_RANK="$GROUP_RANK"; exec "$0" "$@"')

# Set by the script on every node; --env may not override them.
_RENDERED_VARS = (
    *CONTRACT_VARS,
    CHECKPOINT_DIR_ENV,
    RDZV_TIMEOUT_ENV,
    DIST_TIMEOUT_ENV,
    "NCCL_SOCKET_IFNAME",
    "GLOO_SOCKET_IFNAME",
)


@dataclass(frozen=True)
class SlurmJob:
    """A corral job as one Slurm batch job: what to run and what to ask Slurm for."""

    script: str
    args: tuple[str, ...] = ()
    nodes: int = 1
    nproc_per_node: int | None = None
    """Ranks per node; default: ``gpus_per_node``, else 1."""
    gpus_per_node: int = 0
    cpus_per_task: int | None = None
    """CPUs of each node's task (all its ranks); default: one per rank."""
    partition: str | None = None
    account: str | None = None
    time: str | None = None
    job_name: str = "corral"
    python: str = "python3"
    workdir: str | None = None
    output_dir: str | None = None
    """Where Slurm writes ``<job-name>-<job-id>.out``/``.err`` (default: the job's
    working directory); it must exist on the first node."""
    env: Mapping[str, str] = field(default_factory=dict)
    """``--env K=V``: written into the script (never a secret)."""
    forward_env: tuple[str, ...] = ()
    """Bare ``--env K``: taken from the submitter's environment at submit time."""
    secret_env: tuple[str, ...] = ()
    """Keys secret although not named like secrets (``--secret-env``)."""
    master_port: int = DEFAULT_MASTER_PORT
    """0: a port derived from the Slurm job id (jobs sharing a node do not collide)."""
    nccl_interface: str | None = None
    gloo_interface: str | None = None
    rdzv_timeout: float = DEFAULT_RDZV_TIMEOUT
    dist_timeout: float = DEFAULT_COLLECTIVE_TIMEOUT
    max_restarts: int = 0
    checkpoint_dir: str | None = None
    signal_lead: int = DEFAULT_SIGNAL_LEAD
    """Seconds before the time limit to ask for a checkpoint and requeue; 0: never."""
    sbatch_options: tuple[str, ...] = ()
    """Extra ``#SBATCH`` lines as written (``--mem=64G``, ``--exclusive``, ...)."""

    def __post_init__(self) -> None:
        for name in ("args", "forward_env", "secret_env", "sbatch_options"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        object.__setattr__(self, "env", MappingProxyType(dict(self.env)))

    @property
    def ranks_per_node(self) -> int:
        """``nproc_per_node``, else one rank per GPU, else 1."""
        if self.nproc_per_node is not None:
            return self.nproc_per_node
        return self.gpus_per_node or 1

    @property
    def cpus(self) -> int:
        """CPUs of each node's task: ``cpus_per_task``, else one per rank."""
        return self.cpus_per_task or self.ranks_per_node


@dataclass(frozen=True)
class SlurmTarget:
    """What to ask Slurm for, beside the job itself (a :class:`JobDescription`)."""

    nodes: int = 1
    gpus_per_node: int = 0
    cpus_per_task: int | None = None
    partition: str | None = None
    account: str | None = None
    time: str | None = None
    job_name: str = "corral"
    output_dir: str | None = None
    signal_lead: int = DEFAULT_SIGNAL_LEAD
    sbatch_options: tuple[str, ...] = ()
    forward_env: tuple[str, ...] = ()
    """Env keys taken from the submitter's environment at submit time (bare ``--env K``:
    their values are never in the description, so never in the script)."""


def slurm_job(description: JobDescription, target: SlurmTarget) -> SlurmJob:
    """The Slurm batch job of ``description`` on ``target``: the job built and validated
    as every job is (:func:`corral.job.build.job_spec`, the option at fault named), then
    torchrun on each node of the allocation (its nodes: the description's cluster is
    not used; ``--master-port 0``: a port derived from the Slurm job id)."""
    from corral.job.build import job_spec  # the builder: only when rendering

    spec = job_spec(description.options)
    if spec.launcher not in SLURM_LAUNCHERS:
        raise ConfigError(
            f"launcher {spec.launcher!r} is not available on Slurm: each node runs torchrun",
            option="--launcher",
        )
    return SlurmJob(
        script=spec.script,
        args=spec.args,
        nodes=target.nodes,
        nproc_per_node=spec.nproc_per_node,
        gpus_per_node=target.gpus_per_node,
        cpus_per_task=target.cpus_per_task,
        partition=target.partition,
        account=target.account,
        time=target.time,
        job_name=target.job_name,
        python=spec.python or "python3",  # the allocation's own
        workdir=spec.workdir,
        output_dir=target.output_dir,
        env=spec.env,
        forward_env=target.forward_env,
        secret_env=spec.secret_env,
        master_port=spec.master_port,
        nccl_interface=spec.nccl_interface,
        gloo_interface=spec.gloo_interface,
        rdzv_timeout=spec.rdzv_timeout,
        dist_timeout=description.options.collective_timeout,
        max_restarts=spec.max_restarts,
        checkpoint_dir=spec.checkpoint_dir,
        signal_lead=target.signal_lead,
        sbatch_options=target.sbatch_options,
    )


def checkpoint_grace(lead: int) -> int:
    """Seconds the ranks get, after the checkpoint request ``lead`` seconds before the
    time limit, before the job is requeued: all but 30 s of the lead, at least half."""
    return max(lead // 2, lead - 30)


def forwarded_keys(job: SlurmJob) -> list[str]:
    """The keys ``sbatch --export`` forwards from the submitter's environment."""
    return list(dict.fromkeys(job.forward_env))


def sbatch_argv(job: SlurmJob, script_path: str) -> list[str]:
    """``sbatch --parsable`` for the rendered script at ``script_path``.

    Only what the job asked for reaches it: ``--export=NONE`` (Slurm's own
    ``SLURM_*`` variables and the user's login basics such as ``HOME``), or
    ``--export=K1,K2`` for the bare ``--env`` keys, whose values sbatch reads from
    its own environment, so they never appear in an argument or a file of ours.
    """
    keys = forwarded_keys(job)
    export = ",".join(keys) if keys else "NONE"
    return ["sbatch", "--parsable", f"--export={export}", script_path]


def _seconds(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


def _positive(value: int | None, option: str, least: int = 1) -> None:
    if value is not None and value < least:
        raise ConfigError(f"must be at least {least} (got {value})", option=option)


def _header_value(value: str | None, option: str) -> None:
    """A value written into an ``#SBATCH`` line: one word (sbatch splits on blanks)."""
    if value is not None and (not value or any(c.isspace() for c in value)):
        raise ConfigError(
            f"{value!r} cannot be written into an #SBATCH line: it must be one word without blanks",
            option=option,
        )


def _validate(job: SlurmJob) -> None:
    if not job.script:
        raise ConfigError("no script given: corral slurm render [OPTIONS] -- SCRIPT [ARGS...]")
    _positive(job.nodes, "--nodes")
    _positive(job.gpus_per_node, "--gpus-per-node", least=0)
    _positive(job.ranks_per_node, "--nproc-per-node")
    _positive(job.cpus_per_task, "--cpus-per-task")
    _positive(job.max_restarts, "--max-restarts", least=0)
    _positive(job.signal_lead, "--signal-lead", least=0)
    if job.signal_lead and job.signal_lead > 65535:
        raise ConfigError(
            f"at most 65535 seconds (got {job.signal_lead}), Slurm's limit",
            option="--signal-lead",
        )
    for value, option, pattern in (
        (job.partition, "--partition", _PARTITIONS),
        (job.account, "--account", _WORD),
        (job.job_name, "--job-name", _WORD),
    ):
        if value is not None and not pattern.match(value):
            raise ConfigError(
                f"{value!r} is not a Slurm name: use letters, digits, '_', '.' and '-'",
                option=option,
            )
    if job.time is not None and not _TIME.match(job.time):
        raise ConfigError(
            f"{job.time!r} is not a Slurm time limit: HH:MM:SS, D-HH:MM:SS or minutes",
            option="--time",
        )
    _header_value(job.workdir, "--workdir")
    _header_value(job.output_dir, "--output-dir")
    for option_line in job.sbatch_options:
        if not option_line.startswith("-") or "\n" in option_line or "\r" in option_line:
            raise ConfigError(
                f"{option_line!r} is not an sbatch option (such as --mem=64G)",
                option="--sbatch-option",
            )
    if not job.python.strip() or "\n" in job.python:
        raise ConfigError(f"{job.python!r} cannot name an interpreter", option="--python")
    if not (job.master_port == 0 or 1 <= job.master_port <= 65535):
        raise ConfigError(
            f"{job.master_port} is not a TCP port (0: derived from the Slurm job id)",
            option="--master-port",
        )
    for option, seconds in (
        ("--rdzv-timeout", job.rdzv_timeout),
        ("--dist-timeout", job.dist_timeout),
    ):
        if not seconds > 0:
            raise ConfigError(f"must be positive (got {seconds:g})", option=option)
    _validate_env(job)


def _validate_env(job: SlurmJob) -> None:
    for key in [*job.env, *job.forward_env]:
        if not is_env_name(key):
            raise ConfigError(f"{key!r} is not a valid environment variable name", option="--env")
        if key in _RENDERED_VARS:
            raise ConfigError(
                f"{key} is set by corral for every node and cannot be overridden", option="--env"
            )
    for key, value in job.env.items():
        if is_secret(key, job.secret_env, value):
            raise ConfigError(
                f"{key} is secret: its value would be written into the batch script. Give it "
                f"bare (--env {key}): corral slurm submit forwards it from this shell's "
                "environment with sbatch --export",
                option="--env",
            )
        if key in job.forward_env:
            raise ConfigError(f"{key} is given both bare and with a value", option="--env")


def _header(job: SlurmJob) -> list[str]:
    out = f"{job.output_dir.rstrip('/')}/" if job.output_dir else ""
    optional = (
        ("--gpus-per-node", job.gpus_per_node or None),
        ("--partition", job.partition),
        ("--account", job.account),
        ("--time", job.time),
        ("--chdir", job.workdir),
    )
    lines = [
        f"--job-name={job.job_name}",
        f"--nodes={job.nodes}",
        "--ntasks-per-node=1",
        f"--cpus-per-task={job.cpus}",
        *(f"{flag}={value}" for flag, value in optional if value is not None),
    ]
    if job.signal_lead:
        lines.append(f"--signal=B:USR1@{job.signal_lead}")
    lines += [
        "--requeue",
        "--open-mode=append",
        f"--output={out}%x-%j.out",
        f"--error={out}%x-%j.err",
        *job.sbatch_options,
    ]
    return [f"#SBATCH {line}" for line in lines]


def _environment(job: SlurmJob) -> list[str]:
    q = shlex.quote
    if job.master_port:
        port = str(job.master_port)
    else:
        port = f'"$(( {_PORT_BASE} + SLURM_JOB_ID % {_PORT_SPAN} ))"'
    lines = [
        "# the attempt: Slurm counts requeues (node failure, preemption, the requeue below)",
        f'export {JOB_ID_ENV}="slurm-${{SLURM_JOB_ID}}"',
        f'export {ATTEMPT_ENV}="${{SLURM_RESTART_COUNT:-0}}"',
    ]
    if job.checkpoint_dir:
        lines.append(f"export {CHECKPOINT_DIR_ENV}={q(job.checkpoint_dir)}")
    lines += [
        "",
        "# rendezvous on the allocation's first node, at the address Slurm itself uses for it",
        'MASTER_NODE="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)"',
        'MASTER_ADDR="$(scontrol show node -o "$MASTER_NODE" '
        "| sed -n 's/.*NodeAddr=\\([^ ]*\\).*/\\1/p')\" || true",
        'export MASTER_ADDR="${MASTER_ADDR:-$MASTER_NODE}"',
        f"export MASTER_PORT={port}",
        'export NNODES="$SLURM_JOB_NUM_NODES"',
        f"export {RDZV_TIMEOUT_ENV}={_seconds(job.rdzv_timeout)}",
        f"export {DIST_TIMEOUT_ENV}={_seconds(job.dist_timeout)}",
    ]
    if job.nccl_interface:
        lines.append(f"export NCCL_SOCKET_IFNAME={q(job.nccl_interface)}")
    if job.gloo_interface:
        lines.append(f"export GLOO_SOCKET_IFNAME={q(job.gloo_interface)}")
    if job.env:
        lines += ["", "# --env"]
        lines += [f"export {key}={q(value)}" for key, value in job.env.items()]
    keys = forwarded_keys(job)
    if keys:
        lines += [
            "",
            "# forwarded from the submitter's environment (sbatch --export), never written here",
        ]
        lines += [
            f': "${{{key}:?{key} was not forwarded: submit with sbatch --export={",".join(keys)}}}"'
            for key in keys
        ]
    return lines


def _node_step(job: SlurmJob) -> list[str]:
    """The script every node's task runs (``bash -c``); SCRIPT ARGS are its ``"$@"``."""
    python = shlex.quote(job.python)
    rdzv_conf = (
        "join_timeout=${CORRAL_RDZV_TIMEOUT},"
        f"read_timeout={READ_TIMEOUT},is_host=$(( NODE_RANK == 0 ? 1 : 0 ))"
    )
    return [
        "NODE_STEP=$(cat <<'CORRAL_NODE'",
        "set -euo pipefail",
        'export NODE_RANK="$SLURM_NODEID"',
        f"# the checkpoint request ({CHECKPOINT_SIGNAL}) reaches every process of the step:",
        "# torchrun and these scripts ignore it (inherited), a rank that watches it sees it",
        f"trap '' {CHECKPOINT_SIGNAL}",
        'if [ "$NODE_RANK" -ne 0 ]; then',
        "  deadline=$(( SECONDS + ${CORRAL_RDZV_TIMEOUT%.*} ))",
        '  until (exec 3<>"/dev/tcp/$MASTER_ADDR/$MASTER_PORT") 2>/dev/null; do',
        '    if [ "$SECONDS" -ge "$deadline" ]; then',
        '      why="refuses connections: did node 0 start torchrun?"',
        '      getent hosts "$MASTER_ADDR" >/dev/null || why="does not resolve"',
        '      echo "[corral] node $NODE_RANK: master $MASTER_ADDR:$MASTER_PORT $why'
        ' (waited ${CORRAL_RDZV_TIMEOUT}s)" >&2',
        f"      exit {MASTER_NOT_READY_EXIT}",
        "    fi",
        "    sleep 1",
        "  done",
        "fi",
        "# c10d numbers the nodes as they join: each rank's NODE_RANK is torchrun's",
        "# GROUP_RANK for it, so RANK = NODE_RANK * nproc + LOCAL_RANK holds",
        f"exec {python} -m torch.distributed.run \\",
        f'  --nnodes="$NNODES" --nproc-per-node={job.ranks_per_node} \\',
        '  --rdzv-backend=c10d --rdzv-endpoint="$MASTER_ADDR:$MASTER_PORT" \\',
        '  --rdzv-id="$CORRAL_JOB_ID-a$CORRAL_ATTEMPT" \\',
        f'  --rdzv-conf="{rdzv_conf}" \\',
        "  --max-restarts=0 --no-python \\",
        f'  bash -c {_RANK_WRAPPER} {python} -u "$@"',
        "CORRAL_NODE",
        ")",
    ]


def _launch(job: SlurmJob) -> list[str]:
    q = shlex.quote
    srun = [
        "srun",
        "--export=ALL",
        '--nodes="$SLURM_JOB_NUM_NODES"',
        "--ntasks-per-node=1",
        f"--cpus-per-task={job.cpus}",
    ]
    if job.gpus_per_node:
        srun.append(f"--gpus-per-node={job.gpus_per_node}")
    srun += ["--kill-on-bad-exit=1", 'bash -c "$NODE_STEP" corral-node "${TRAIN[@]}" &']
    checkpoint = " from $CORRAL_CHECKPOINT_DIR" if job.checkpoint_dir else " from the start"
    lines = [
        f"TRAIN=({' '.join(q(word) for word in (job.script, *job.args))})",
        f"MAX_RESTARTS={job.max_restarts}",
        'echo "[corral] job $CORRAL_JOB_ID attempt $CORRAL_ATTEMPT: $NNODES nodes x '
        f'{job.ranks_per_node} ranks, master $MASTER_ADDR:$MASTER_PORT" >&2',
        "",
        "requeue() {  # $1: why; Slurm ends this attempt and queues the next",
        '  echo "[corral] $1: requeueing job $SLURM_JOB_ID, restart $(( CORRAL_ATTEMPT + 1 )) '
        f'of $MAX_RESTARTS resumes{checkpoint}" >&2',
        '  if scontrol requeue "$SLURM_JOB_ID"; then',
        "    sleep 300",
        "  fi",
        "}",
    ]
    if job.signal_lead:
        lead = job.signal_lead
        lines += [
            "",
            f"# {lead}s before the time limit Slurm sends USR1 (--signal=B:USR1@{lead})",
            "time_limit_near=0",
            "on_time_limit() {",
            "  time_limit_near=1",
            f'  echo "[corral] time limit in {lead}s: asking the ranks to checkpoint now '
            f'(SIG{CHECKPOINT_SIGNAL})" >&2',
            f'  scancel --signal={CHECKPOINT_SIGNAL} "$SLURM_JOB_ID" || true',
            "}",
            "trap on_time_limit USR1",
        ]
    lines += [
        "",
        "# in the background: bash runs a trap only between commands",
        " \\\n  ".join(srun),
        "step=$!",
        "status=0",
        "while :; do",
        '  status=0; wait "$step" || status=$?',
        '  kill -0 "$step" 2>/dev/null || break  # else a trap interrupted the wait',
    ]
    if job.signal_lead:
        grace = checkpoint_grace(job.signal_lead)
        lines += [
            '  if [ "$time_limit_near" = 1 ]; then',
            f"    for _ in $(seq {grace}); do",
            '      kill -0 "$step" 2>/dev/null || break',
            "      sleep 1",
            "    done",
            '    if [ "$CORRAL_ATTEMPT" -lt "$MAX_RESTARTS" ]; then',
            f'      requeue "time limit in {job.signal_lead - grace}s or less"',
            "    else",
            '      echo "[corral] no restart left (--max-restarts $MAX_RESTARTS): the job '
            'ends at its time limit" >&2',
            "    fi",
            "    time_limit_near=2",
            "  fi",
        ]
    lines += [
        "done",
        'status=0; wait "$step" || status=$?',
        'if [ "$status" -ne 0 ] && [ "$CORRAL_ATTEMPT" -lt "$MAX_RESTARTS" ]; then',
        '  requeue "attempt $CORRAL_ATTEMPT failed (exit $status)"',
        "fi",
        'exit "$status"',
    ]
    return lines


def render_slurm(job: SlurmJob) -> str:
    """The batch script for ``job``; ConfigError names the option at fault."""
    _validate(job)
    ranks = job.nodes * job.ranks_per_node
    sections = [
        [
            "#!/bin/bash",
            f"# corral: {shlex.quote(job.script)} on {job.nodes} node(s) x "
            f"{job.ranks_per_node} rank(s) = {ranks} rank(s), torchrun c10d rendezvous",
            *_header(job),
            "set -euo pipefail",
        ],
        _environment(job),
        _node_step(job),
        _launch(job),
    ]
    return "\n\n".join("\n".join(section) for section in sections) + "\n"


def env_items(items: Sequence[str]) -> tuple[dict[str, str], tuple[str, ...]]:
    """``--env`` values split into ``K=V`` pairs (written) and bare keys (forwarded)."""
    written: dict[str, str] = {}
    bare: list[str] = []
    for item in items:
        key, sep, value = item.partition("=")
        if sep:
            written[key] = value
        else:
            bare.append(key)
    return written, tuple(bare)
