"""Pure launch planning: (JobSpec, Cluster, attempt) -> one NodeCommand per node.

No I/O happens here, so every launch has a dry run (``corral plan``). Anything
that needs the outside world (a free port, the interpreter on a host) is
resolved before planning by the runtime.
"""

from __future__ import annotations

import importlib
import ipaddress
import json
import os
import posixpath
from typing import Any, cast

from corral.cluster.model import Cluster, Host
from corral.contract import (
    ACCELERATE_ENV,
    ATTEMPT_ENV,
    CALIBRATE_ENV,
    CHECKPOINT_DIR_ENV,
    CHECKPOINT_REPLICA_ENV,
    CONTRACT_VARS,
    HARNESS_ENV,
    HOST_ENV,
    JOB_CONFIG_ENV,
    JOB_ID_ENV,
    LAUNCH_DIR_ENV,
    NODE_DIR_ENV,
    PLAN_NODE_ENV,
    PLAN_NPROCS_ENV,
    QOS_ENV,
    SHARED_DATA_PATH_ENV,
    STREAMS_ENV,
    WORKLOAD_WEIGHTS_ENV,
    ScaleRule,
    adjust_config,
)
from corral.errors import ConfigError
from corral.plan.launchers import (
    NodeFacts,
    accelerate_reference,
    command_argv,
    madengine_argv,
    validate_launcher,
)
from corral.plan.spec import LAUNCHERS, NODE_LAUNCHERS, JobSpec, NodeCommand, RankProcess

# HARNESS_ENV is set on every rank of a ``--harness`` job (``plugin`` or ``script``);
# ACCELERATE_ENV (``1``) on ranks that run Accelerate code: the worker prepares
# Accelerate's env (``ACCELERATE_USE_CPU`` on a host without a GPU) and refuses a
# world size other than the plan's.

WORKER_MODULE = "corral.agent.worker"

# AGENT_VARS are set on every rank by the node agent when it starts (not planned):
# the address of its private control socket and the token that authenticates a
# connection to it, both made fresh by each attempt's agent (see corral.agent.control).


def is_loopback(address: str) -> bool:
    """True for 127.0.0.0/8, ::1 and ``localhost``."""
    if address.lower() in ("localhost", "localhost.localdomain"):
        return True
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


def rdzv_id(job_id: str, attempt: int) -> str:
    """torchrun's rendezvous id: one per attempt, so a straggler of an earlier attempt
    can never join a later one."""
    return job_id if attempt == 0 else f"{job_id}-a{attempt}"


def node_dir(spec: JobSpec, host: Host) -> str:
    """The node's own run dir on the host (logs, pids, error files)."""
    if host.local:
        return posixpath.join(spec.run_dir, spec.job_id, "nodes", host.name)
    # per host, so hosts that share a home directory (NFS) never share a node dir
    return posixpath.join("~", ".corral", "runs", spec.job_id, host.name)


def node_cwd(spec: JobSpec, host: Host) -> str:
    """The working directory of the node's processes."""
    if spec.workdir:
        return spec.workdir
    if host.local:
        return posixpath.join(node_dir(spec, host), "work")
    return os.getcwd()


def _procs_per_node(spec: JobSpec, host: Host) -> int:
    return spec.nproc_per_node if spec.nproc_per_node is not None else host.slots


def master_index(cluster: Cluster, master_addr: str) -> int:
    """Index of the node hosting the rendezvous: the host named by the master
    address, else node 0."""
    for index, host in enumerate(cluster.hosts):
        if master_addr in (host.address, host.name):
            return index
    return 0


def _validate(spec: JobSpec, cluster: Cluster) -> str:
    world = sum(_procs_per_node(spec, h) for h in cluster.hosts)
    if spec.launcher not in LAUNCHERS:
        raise ConfigError(
            f"unknown launcher {spec.launcher!r}; choose one of {', '.join(LAUNCHERS)}",
            option="--launcher",
        )
    if cluster.size == 0:
        raise ConfigError("the cluster has no hosts", option="--hosts")
    if spec.workload_weights and (
        len(spec.workload_weights) != world or any(w <= 0 for w in spec.workload_weights)
    ):
        raise ConfigError(
            f"{len(spec.workload_weights)} workload weights for {world} ranks: one positive "
            "weight per rank is needed (re-run corral calibrate on this cluster)",
            option="--calibration",
        )
    if spec.nproc_per_node is not None and spec.nproc_per_node < 1:
        raise ConfigError(
            f"must be at least 1 (got {spec.nproc_per_node})", option="--nproc-per-node"
        )
    if not spec.script and spec.launcher not in NODE_LAUNCHERS:
        raise ConfigError("no script given: corral run [OPTIONS] -- SCRIPT [ARGS...]")
    validate_launcher(spec)
    if not 0 <= spec.master_port <= 65535:
        raise ConfigError(f"{spec.master_port} is not a TCP port", option="--master-port")
    for key in spec.env:
        if key in CONTRACT_VARS:
            raise ConfigError(
                f"{key} is set by corral for every rank and cannot be overridden", option="--env"
            )
    master_addr = spec.master_addr or cluster.hosts[0].address
    real_hosts = [h for h in cluster.hosts if not h.local]
    if len(real_hosts) > 1 and is_loopback(master_addr):
        raise ConfigError(
            f"master address {master_addr} is a loopback address but the job spans "
            f"{len(real_hosts)} hosts; other hosts cannot reach it. Give --master-addr "
            "an address of the first host that the others can reach",
            option="--master-addr",
        )
    return master_addr


def _base_env(spec: JobSpec, host: Host, attempt: int, master_addr: str) -> dict[str, str]:
    env: dict[str, str] = {}
    env.update(spec.env)
    env.update(host.env)
    nccl = spec.nccl_interface or host.interface
    gloo = spec.gloo_interface or host.interface
    if nccl:
        env["NCCL_SOCKET_IFNAME"] = nccl
    if gloo:
        env["GLOO_SOCKET_IFNAME"] = gloo
    if spec.checkpoint_dir:
        env[CHECKPOINT_DIR_ENV] = spec.checkpoint_dir
        if spec.replicate_checkpoints:
            env[CHECKPOINT_REPLICA_ENV] = "wait"
    if spec.workload_weights:
        env[WORKLOAD_WEIGHTS_ENV] = ",".join(f"{w:.6g}" for w in spec.workload_weights)
    if spec.qos:
        env[QOS_ENV] = spec.qos
    if spec.shared_data_path:
        env[SHARED_DATA_PATH_ENV] = spec.shared_data_path
    env["MASTER_ADDR"] = master_addr
    env["MASTER_PORT"] = str(spec.master_port)
    env["NNODES"] = str(0)  # replaced below; keeps a stable key order
    env[JOB_ID_ENV] = spec.job_id
    env[ATTEMPT_ENV] = str(attempt)
    env[NODE_DIR_ENV] = node_dir(spec, host)
    env[HOST_ENV] = host.name
    if host.local:  # its ranks run in the node's own dir: the SDK's relative checkpoint
        # paths resolve against the job's working directory instead, as on SSH hosts
        env[LAUNCH_DIR_ENV] = spec.workdir or os.getcwd()
    return env


def harness_config(spec: JobSpec, world: int) -> dict[str, Any] | None:
    """The plugin's config adjusted for ``world`` ranks (None without one)."""
    if spec.harness is None or spec.harness_config is None:
        return None
    try:
        config = json.loads(spec.harness_config)
        if not isinstance(config, dict):
            raise ValueError("it is not a JSON object")
        rule = cast(ScaleRule, spec.lr_scaling)
        return adjust_config(config, world, rule=rule, require=False)
    except ValueError as exc:
        raise ConfigError(
            f"cannot adjust the plugin's config: {exc}", option="--config_file"
        ) from exc


def _rank_processes(rank_base: int, nproc: int) -> tuple[RankProcess, ...]:
    return tuple(
        RankProcess(
            rank=rank_base + local,
            local_rank=local,
            env={"RANK": str(rank_base + local), "LOCAL_RANK": str(local)},
        )
        for local in range(nproc)
    )


def _fmt_seconds(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


def plan_job(spec: JobSpec, cluster: Cluster, attempt: int = 0) -> list[NodeCommand]:
    """Plan one NodeCommand per host of ``cluster`` for ``spec``'s ``attempt``."""
    master_addr = _validate(spec, cluster)
    nnodes = cluster.size
    per_node = [_procs_per_node(spec, h) for h in cluster.hosts]
    world = sum(per_node)
    master_node = master_index(cluster, master_addr)
    config = harness_config(spec, world)
    commands: list[NodeCommand] = []
    rank_base = 0
    for node_rank, host in enumerate(cluster.hosts):
        nproc = per_node[node_rank]
        python = host.python or spec.python or "python3"
        env = _base_env(spec, host, attempt, master_addr)
        env["NNODES"] = str(nnodes)
        facts = NodeFacts(
            node_rank=node_rank,
            nnodes=nnodes,
            nproc_per_node=nproc,
            world_size=world,
            master_addr=master_addr,
            master_port=spec.master_port,
            host=host.name,
            job_id=spec.job_id,
            nccl_interface=env.get("NCCL_SOCKET_IFNAME", ""),
            gloo_interface=env.get("GLOO_SOCKET_IFNAME", ""),
        )
        if spec.harness is not None:
            env[HARNESS_ENV] = spec.harness
            env[ACCELERATE_ENV] = "1"
            if config is not None:
                env[JOB_CONFIG_ENV] = json.dumps(config, separators=(",", ":"))
        ranks: tuple[RankProcess, ...] = ()
        reference: tuple[str, ...] = ()
        if spec.launcher == "torchrun":
            rdzv_conf = (
                f"join_timeout={_fmt_seconds(spec.rdzv_timeout)},read_timeout=60,"
                f"is_host={1 if node_rank == master_node else 0}"
            )
            argv: tuple[str, ...] = (
                python,
                "-m",
                "torch.distributed.run",
                f"--nnodes={nnodes}",
                f"--nproc-per-node={nproc}",
                "--rdzv-backend=c10d",
                f"--rdzv-endpoint={master_addr}:{spec.master_port}",
                f"--rdzv-id={rdzv_id(spec.job_id, attempt)}",
                f"--rdzv-conf={rdzv_conf}",
                "--max-restarts=0",
                "--monitor-interval=0.1",
                f"--local-addr={host.address}",
                "-m",
                WORKER_MODULE,
                spec.script,
                *spec.args,
            )
            env[STREAMS_ENV] = "socket"
            if spec.workload_weights:  # ranks are numbered at the rendezvous, not here:
                # the SDK finds its own weight by plan node and exchanges them
                env[PLAN_NODE_ENV] = str(node_rank)
                env[PLAN_NPROCS_ENV] = ",".join(str(n) for n in per_node)
        elif spec.launcher in NODE_LAUNCHERS:
            # one process per node that starts the ranks itself (like torchrun); a
            # corral worker it starts reports its rank over the control socket
            if spec.launcher == "command":
                assert spec.command_template is not None  # validated
                argv = command_argv(spec.command_template, facts)
            else:
                argv = madengine_argv(spec, facts)
            env["NODE_RANK"] = str(node_rank)
            env[STREAMS_ENV] = "socket"
        elif spec.launcher == "mlx":
            # lazy: the MLX planner is only loaded for MLX jobs
            mlx = importlib.import_module("corral.plan.mlx")
            peers = [(h.address, n) for h, n in zip(cluster.hosts, per_node, strict=True)]
            mlx_argv, mlx_ranks = mlx.plan_mlx_node(
                spec, host, node_rank, nproc, rank_base, world, python, env, peers=peers
            )
            argv, ranks = tuple(mlx_argv), tuple(mlx_ranks)
        else:
            argv = (python, "-u", "-m", WORKER_MODULE, spec.script, *spec.args)
            env["WORLD_SIZE"] = str(world)
            env["LOCAL_WORLD_SIZE"] = str(nproc)
            env["NODE_RANK"] = str(node_rank)
            ranks = _rank_processes(rank_base, nproc)
            if spec.launcher == "accelerate":
                env[ACCELERATE_ENV] = "1"
                reference = accelerate_reference(spec, facts)
        commands.append(
            NodeCommand(
                host=host,
                node_rank=node_rank,
                argv=argv,
                env=env,
                cwd=node_cwd(spec, host),
                nproc=nproc,
                ranks=ranks,
                master_addr=master_addr,
                master_port=spec.master_port,
                # MLX has no endpoint at the master port to probe (its ring uses the ports
                # after); the ranks of a calibration run alone, with no process group
                hosts_master=node_rank == master_node
                and spec.launcher != "mlx"
                and spec.env.get(CALIBRATE_ENV) != "1",
                secret_env=spec.secret_env,
                reference_argv=reference,
            )
        )
        rank_base += nproc
    return commands
