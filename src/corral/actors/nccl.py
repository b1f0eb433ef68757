"""NCCL/Gloo rendezvous settings for each worker: :class:`NCCLConfig`,
:func:`create_nccl_configs` and :func:`setup_nccl_env` (for
``torch.distributed.init_process_group(init_method="env://")``)."""

from __future__ import annotations

import os
from collections.abc import MutableMapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from corral.defaults import DEFAULT_MASTER_PORT
from corral.errors import ConfigError


@dataclass(frozen=True)
class NCCLConfig:
    """Where one worker sits in the job: global and local rank, sizes, its node and
    the master's address; ``interface`` is the network interface toward the master
    (``NCCL_SOCKET_IFNAME``/``GLOO_SOCKET_IFNAME``), None when unknown."""

    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    node_rank: int
    master_addr: str
    master_port: int
    interface: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The fields as a dict (``NCCLConfig(**d)`` makes it again)."""
        return asdict(self)

    def env(self) -> dict[str, str]:
        """The environment variables :func:`setup_nccl_env` sets."""
        env = {
            "MASTER_ADDR": self.master_addr,
            "MASTER_PORT": str(self.master_port),
            "RANK": str(self.rank),
            "WORLD_SIZE": str(self.world_size),
            "LOCAL_RANK": str(self.local_rank),
            "LOCAL_WORLD_SIZE": str(self.local_world_size),
            "NODE_RANK": str(self.node_rank),
        }
        if self.interface:
            env["NCCL_SOCKET_IFNAME"] = self.interface
            env["GLOO_SOCKET_IFNAME"] = self.interface
        return env


def create_nccl_configs(
    master_addr: str,
    nodes: Sequence[tuple[str, int]],
    master_port: int = DEFAULT_MASTER_PORT,
    *,
    interfaces: Sequence[str | None] | None = None,
) -> list[NCCLConfig]:
    """One :class:`NCCLConfig` per worker, in global rank order: node by node, each
    node's ``n`` workers in turn (nodes may differ in size). ``interfaces`` gives each
    node's interface toward the master (same order as ``nodes``)."""
    if not nodes:
        raise ConfigError("no nodes: expected at least one (host, num_workers)")
    if interfaces is not None and len(interfaces) != len(nodes):
        raise ConfigError(f"{len(interfaces)} interfaces for {len(nodes)} nodes")
    if not 0 < master_port < 65536:
        raise ConfigError(f"invalid master port {master_port}: expected 1 to 65535")
    for host, count in nodes:
        if count < 1:
            raise ConfigError(f"{host}: {count} workers; expected at least 1")
    world = sum(count for _, count in nodes)
    configs: list[NCCLConfig] = []
    for node_rank, (_, count) in enumerate(nodes):
        interface = interfaces[node_rank] if interfaces is not None else None
        for local_rank in range(count):
            configs.append(
                NCCLConfig(
                    rank=len(configs),
                    local_rank=local_rank,
                    world_size=world,
                    local_world_size=count,
                    node_rank=node_rank,
                    master_addr=master_addr,
                    master_port=master_port,
                    interface=interface,
                )
            )
    return configs


def setup_nccl_env(
    config: NCCLConfig | dict[str, Any], environ: MutableMapping[str, str] | None = None
) -> None:
    """Set what ``init_process_group(init_method="env://")`` reads (in ``os.environ``
    unless ``environ`` is given): MASTER_ADDR/PORT, RANK, WORLD_SIZE, LOCAL_RANK,
    LOCAL_WORLD_SIZE, NODE_RANK and, when the interface is known,
    NCCL_SOCKET_IFNAME/GLOO_SOCKET_IFNAME (else any already set are kept)."""
    if isinstance(config, dict):
        config = NCCLConfig(**config)
    target = os.environ if environ is None else environ
    target.update(config.env())


__all__ = ["NCCLConfig", "create_nccl_configs", "setup_nccl_env"]
