"""The ``mlx`` launcher: corral starts every MLX rank itself, with MLX's own env.

``mlx.launch`` exits 0 even when ranks fail, so corral does not use it: the node
agent starts one ``python -m corral.agent.worker SCRIPT`` per rank (like the
``python`` launcher), each with ``MLX_RANK`` and what its backend needs, so every
rank's exit code is its own. Planning stays pure: MLX's hostfile travels in the
rank's env and the rank writes it before MLX starts (:mod:`corral.agent.mlx_env`).

Backends (``--mlx-backend``):

* ``ring`` (default, TCP, any OS): rank ``r`` listens on
  ``<its host's address>:<master_port + 1 + r>`` and connects to rank ``r + 1``;
  MLX's hostfile is the JSON list of those ``"address:port"`` entries, one list
  per rank, in ``CORRAL_MLX_HOSTS``. Ports are per global rank, so ranks that
  share an address (``local:N``) never collide.
* ``jaccl`` (RDMA over Thunderbolt, macOS): one rank per host, coordinator on
  node 0 at ``master_port``; ``MLX_IBV_DEVICES`` (MLX's device matrix file on
  the hosts) must come with ``--env``.
* ``mpi`` is refused: MPI ranks must be started by ``mpirun``, which would hide
  their exit codes from corral.

Every rank gets ``CORRAL_MLX_BACKEND`` (the worker then initialises the group
before the script and checks its size against the plan) and
``CORRAL_MLX_INIT_TIMEOUT`` (seconds the group may take to connect: the job's
rendezvous timeout).
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import MutableMapping, Sequence

from corral.cluster.model import Host
from corral.contract import MLX_BACKEND_ENV, MLX_HOSTS_ENV, MLX_INIT_TIMEOUT_ENV
from corral.errors import ConfigError
from corral.plan.spec import MLX_BACKENDS, JobSpec, RankProcess

# MLX's own variables that corral sets (MLX_HOSTFILE on the rank, from MLX_HOSTS_ENV)
MLX_OWN_VARS = ("MLX_RANK", "MLX_HOSTFILE", "MLX_JACCL_COORDINATOR")
IBV_DEVICES = "MLX_IBV_DEVICES"


def ring_port(master_port: int, rank: int) -> int:
    """The port rank ``rank`` of the ring listens on."""
    return master_port + 1 + rank


def ring_hostfile(peers: Sequence[tuple[str, int]], master_port: int) -> list[list[str]]:
    """MLX's ring hostfile: for each global rank, the ``address:port`` it listens on.

    ``peers`` is ``(address, nproc)`` of every node, in node-rank order.
    """
    entries: list[list[str]] = []
    for address, nproc in peers:
        for _ in range(nproc):
            entries.append([f"{address}:{ring_port(master_port, len(entries))}"])
    return entries


def _is_ipv6(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).version == 6
    except ValueError:
        return False


def _validate(spec: JobSpec, host: Host, peers: Sequence[tuple[str, int]], world: int) -> None:
    if spec.mlx_backend not in MLX_BACKENDS:
        raise ConfigError(
            f"unknown MLX backend {spec.mlx_backend!r}; choose one of {', '.join(MLX_BACKENDS)}",
            option="--mlx-backend",
        )
    if spec.mlx_backend == "mpi":
        raise ConfigError(
            "MLX's mpi backend needs its ranks started by mpirun, which hides each rank's "
            "exit code from corral; use --mlx-backend ring (TCP) or jaccl (RDMA)",
            option="--mlx-backend",
        )
    for key in MLX_OWN_VARS:
        if key in spec.env or key in host.env:
            raise ConfigError(
                f"{key} is set by corral for every MLX rank and cannot be overridden",
                option="--env",
            )
    if spec.mlx_backend == "ring":
        top = ring_port(spec.master_port, world - 1)
        if top > 65535:
            raise ConfigError(
                f"the MLX ring uses ports {spec.master_port + 1}-{top} (master port + 1 + "
                "rank), past 65535: choose a lower --master-port",
                option="--master-port",
            )
        for address, _ in peers:
            if _is_ipv6(address):
                raise ConfigError(
                    f"MLX's ring backend takes IPv4 addresses or host names, not {address}",
                    option="--hosts",
                )
    elif spec.mlx_backend == "jaccl":
        if any(nproc != 1 for _, nproc in peers):
            raise ConfigError(
                "MLX's jaccl backend runs one rank per host: use --nproc-per-node 1",
                option="--nproc-per-node",
            )
        if IBV_DEVICES not in spec.env and IBV_DEVICES not in host.env:
            raise ConfigError(
                f"MLX's jaccl backend needs {IBV_DEVICES}=FILE (MLX's RDMA device matrix, "
                "a file on every host): pass it with --env",
                option="--env",
            )


def plan_mlx_node(
    spec: JobSpec,
    host: Host,
    node_rank: int,
    nproc: int,
    rank_base: int,
    world: int,
    python: str,
    env: MutableMapping[str, str],
    *,
    peers: Sequence[tuple[str, int]],
) -> tuple[tuple[str, ...], tuple[RankProcess, ...]]:
    """Plan node ``node_rank`` of an MLX job: the argv started once per rank and
    each rank's own env; the node-wide variables are added to ``env``.

    ``peers`` is ``(address, nproc)`` of every node, in node-rank order. Pure.
    """
    from corral.plan.render import WORKER_MODULE  # render imports this module lazily

    _validate(spec, host, peers, world)
    argv = (python, "-u", "-m", WORKER_MODULE, spec.script, *spec.args)
    env["WORLD_SIZE"] = str(world)
    env["LOCAL_WORLD_SIZE"] = str(nproc)
    env["NODE_RANK"] = str(node_rank)
    env[MLX_BACKEND_ENV] = spec.mlx_backend
    env[MLX_INIT_TIMEOUT_ENV] = f"{spec.rdzv_timeout:g}"
    if spec.mlx_backend == "ring" and world > 1:
        env[MLX_HOSTS_ENV] = json.dumps(
            ring_hostfile(peers, spec.master_port), separators=(",", ":")
        )
    elif spec.mlx_backend == "jaccl":
        env["MLX_JACCL_COORDINATOR"] = f"{peers[0][0]}:{spec.master_port}"
    ranks = tuple(
        RankProcess(
            rank=rank_base + local,
            local_rank=local,
            env={
                "RANK": str(rank_base + local),
                "LOCAL_RANK": str(local),
                "MLX_RANK": str(rank_base + local),
            },
        )
        for local in range(nproc)
    )
    return argv, ranks
