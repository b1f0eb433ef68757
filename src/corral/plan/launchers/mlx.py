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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar

from corral.cluster.model import Host
from corral.contract import MLX_BACKEND_ENV, MLX_HOSTS_ENV, MLX_INIT_TIMEOUT_ENV
from corral.errors import ConfigError
from corral.plan.launchers.base import (
    Launcher,
    NodeContext,
    NodePlan,
    options_of,
    set_rank_layout,
    worker_argv,
)
from corral.plan.spec import MLX_BACKENDS, JobSpec, LauncherOptions, RankProcess

# MLX's own variables that corral sets (MLX_HOSTFILE on the rank, from MLX_HOSTS_ENV)
MLX_OWN_VARS = ("MLX_RANK", "MLX_HOSTFILE", "MLX_JACCL_COORDINATOR")
IBV_DEVICES = "MLX_IBV_DEVICES"


@dataclass(frozen=True)
class MlxOptions(LauncherOptions):
    """``--launcher mlx``'s options."""

    LAUNCHER: ClassVar[str] = "mlx"
    FLAGS: ClassVar[Mapping[str, str]] = {"backend": "--mlx-backend"}
    LEGACY: ClassVar[Mapping[str, str]] = {"backend": "mlx_backend"}

    backend: str = "ring"
    """MLX's distributed backend (``--mlx-backend``): ring, jaccl (mpi is refused)."""


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


def check_backend(backend: str) -> None:
    """``backend`` is one of MLX's (ConfigError naming ``--mlx-backend``)."""
    if backend not in MLX_BACKENDS:
        raise ConfigError(
            f"unknown MLX backend {backend!r}; choose one of {', '.join(MLX_BACKENDS)}",
            option="--mlx-backend",
        )


def _validate(
    spec: JobSpec, backend: str, host: Host, peers: Sequence[tuple[str, int]], world: int
) -> None:
    check_backend(backend)
    if backend == "mpi":
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
    if backend == "ring":
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
    elif backend == "jaccl":
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


def _plan_node(ctx: NodeContext) -> NodePlan:
    """Plan one node of an MLX job: the argv started once per rank and each rank's
    own env; the node-wide variables are added to ``ctx.env``. Pure."""
    spec, facts, env = ctx.spec, ctx.facts, ctx.env
    backend = options_of(spec, MlxOptions).backend
    world = facts.world_size
    _validate(spec, backend, ctx.host, ctx.peers, world)
    set_rank_layout(ctx)
    env[MLX_BACKEND_ENV] = backend
    env[MLX_INIT_TIMEOUT_ENV] = f"{spec.rdzv_timeout:g}"
    if backend == "ring" and world > 1:
        env[MLX_HOSTS_ENV] = json.dumps(
            ring_hostfile(ctx.peers, spec.master_port), separators=(",", ":")
        )
    elif backend == "jaccl":
        env["MLX_JACCL_COORDINATOR"] = f"{ctx.peers[0][0]}:{spec.master_port}"
    ranks = tuple(
        RankProcess(
            rank=ctx.rank_base + local,
            local_rank=local,
            env={
                "RANK": str(ctx.rank_base + local),
                "LOCAL_RANK": str(local),
                "MLX_RANK": str(ctx.rank_base + local),
            },
        )
        for local in range(facts.nproc_per_node)
    )
    return NodePlan(worker_argv(ctx), ranks=ranks)


def _check_options(spec: JobSpec) -> None:
    check_backend(options_of(spec, MlxOptions).backend)


LAUNCHER = Launcher(
    "mlx",
    _plan_node,
    options=MlxOptions,
    validate=_check_options,
    # MLX has no endpoint at the master port to probe (its ring uses the ports after)
    probes_master=False,
)
