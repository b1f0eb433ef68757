"""Pure launch planning: (JobSpec, Cluster, attempt) -> one NodeCommand per node.

No I/O happens here, so every launch has a dry run (``corral plan``). Anything
that needs the outside world (a free port, the interpreter on a host) is
resolved before planning by the runtime. What every launcher shares (the job's
checks, the env corral sets on every node) is here; each launcher's own part is
its module in :mod:`corral.plan.launchers`, looked up in its table.
"""

from __future__ import annotations

import ipaddress
import json
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
    DIST_TIMEOUT_ENV,
    HARNESS_ENV,
    HOST_ENV,
    JOB_CONFIG_ENV,
    JOB_ID_ENV,
    LAUNCH_DIR_ENV,
    NODE_DIR_ENV,
    QOS_ENV,
    SHARED_DATA_PATH_ENV,
    WORKLOAD_WEIGHTS_ENV,
    ScaleRule,
    adjust_config,
)
from corral.errors import ConfigError
from corral.plan.launchers import launcher, validate_launcher
from corral.plan.launchers.base import NodeContext, NodeFacts
from corral.plan.spec import JobSpec, NodeCommand

# HARNESS_ENV is set on every rank of a ``--harness`` job (``plugin`` or ``script``);
# ACCELERATE_ENV (``1``) on ranks that run Accelerate code: the worker prepares
# Accelerate's env (``ACCELERATE_USE_CPU`` on a host without a GPU) and refuses a
# world size other than the plan's.

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
    return spec.launch_dir or "~"


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
    kind = launcher(spec.launcher)
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
    if not spec.script and not kind.runs_own_command:
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
    if spec.collective_timeout is not None:  # an --env of the same key wins
        env[DIST_TIMEOUT_ENV] = f"{spec.collective_timeout:g}"
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
    launch_dir = spec.workdir or spec.launch_dir
    if host.local and launch_dir:  # its ranks run in the node's own dir: the SDK's relative
        # checkpoint paths resolve against the job's working directory instead, as on SSH hosts
        env[LAUNCH_DIR_ENV] = launch_dir
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


def plan_job(spec: JobSpec, cluster: Cluster, attempt: int = 0) -> list[NodeCommand]:
    """Plan one NodeCommand per host of ``cluster`` for ``spec``'s ``attempt``."""
    master_addr = _validate(spec, cluster)
    kind = launcher(spec.launcher)
    nnodes = cluster.size
    per_node = [_procs_per_node(spec, h) for h in cluster.hosts]
    peers = tuple((h.address, n) for h, n in zip(cluster.hosts, per_node, strict=True))
    world = sum(per_node)
    master_node = master_index(cluster, master_addr)
    config = harness_config(spec, world)
    commands: list[NodeCommand] = []
    rank_base = 0
    for node_rank, host in enumerate(cluster.hosts):
        nproc = per_node[node_rank]
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
        node = kind.plan_node(
            NodeContext(
                spec=spec,
                host=host,
                facts=facts,
                env=env,
                python=host.python or spec.python or "python3",
                attempt=attempt,
                rank_base=rank_base,
                master_node=master_node,
                peers=peers,
            )
        )
        commands.append(
            NodeCommand(
                host=host,
                node_rank=node_rank,
                argv=node.argv,
                env=env,
                cwd=node_cwd(spec, host),
                nproc=nproc,
                ranks=node.ranks,
                master_addr=master_addr,
                master_port=spec.master_port,
                # the ranks of a calibration run alone, with no process group
                hosts_master=node_rank == master_node
                and kind.probes_master
                and spec.env.get(CALIBRATE_ENV) != "1",
                secret_env=spec.secret_env,
                reference_argv=node.reference,
            )
        )
        rank_base += nproc
    return commands
