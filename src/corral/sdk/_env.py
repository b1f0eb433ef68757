"""Rank and topology of the current process, read from the environment."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass

from corral.contract import ATTEMPT_ENV, JOB_ID_ENV
from corral.defaults import DEFAULT_MASTER_PORT

__all__ = [
    "DistInfo",
    "info",
    "is_distributed",
    "is_main_process",
    "print_distributed_info",
    "should_save_outputs",
]

DEFAULT_MASTER_ADDR = "127.0.0.1"


@dataclass(frozen=True)
class DistInfo:
    """Where this process sits in the job (defaults describe a single process)."""

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    local_world_size: int = 1
    node_rank: int = 0
    num_nodes: int = 1
    master_addr: str = DEFAULT_MASTER_ADDR
    master_port: int = DEFAULT_MASTER_PORT
    job_id: str | None = None
    attempt: int = 0

    @property
    def is_distributed(self) -> bool:
        """True when the job has more than one process."""
        return self.world_size > 1

    @property
    def is_main_process(self) -> bool:
        """True on global rank 0."""
        return self.rank == 0

    def describe(self) -> str:
        """One human-readable line."""
        job = f" job={self.job_id}" if self.job_id else ""
        return (
            f"rank {self.rank}/{self.world_size} "
            f"(local {self.local_rank}/{self.local_world_size}, "
            f"node {self.node_rank}/{self.num_nodes}) "
            f"master={self.master_addr}:{self.master_port}{job} attempt={self.attempt}"
        )


def _int(env: Mapping[str, str], *names: str) -> int | None:
    """The first of ``names`` set (non-empty) in ``env``, as an int."""
    for name in names:
        raw = env.get(name, "").strip()
        if raw:
            try:
                return int(raw)
            except ValueError:
                raise ValueError(f"environment variable {name}={raw!r} is not an integer") from None
    return None


def info(env: Mapping[str, str] | None = None) -> DistInfo:
    """Read this process's :class:`DistInfo` from ``env`` (default ``os.environ``).

    Variables: ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``,
    ``NODE_RANK`` (else torchrun's ``GROUP_RANK``), ``NNODES`` (else torchrun's
    ``GROUP_WORLD_SIZE``), ``MASTER_ADDR``, ``MASTER_PORT``, ``CORRAL_JOB_ID``,
    ``CORRAL_ATTEMPT`` (else torchrun's ``TORCHELASTIC_RESTART_COUNT``). Missing
    values default to a single process; missing local/node values are derived
    from the others. Read afresh on every call (it is cheap).
    """
    e = os.environ if env is None else env
    world_size = _int(e, "WORLD_SIZE") or 1
    rank = _int(e, "RANK") or 0
    num_nodes = _int(e, "NNODES", "GROUP_WORLD_SIZE")
    if num_nodes is not None and num_nodes < 1:
        raise ValueError(f"inconsistent environment: number of nodes {num_nodes}")
    local_world_size = _int(e, "LOCAL_WORLD_SIZE")
    if local_world_size is not None and local_world_size < 1:
        raise ValueError(f"inconsistent environment: LOCAL_WORLD_SIZE={local_world_size}")
    if local_world_size is None:
        local_world_size = max(1, world_size // num_nodes) if num_nodes else world_size
    if num_nodes is None:
        num_nodes = max(1, -(-world_size // local_world_size))
    local_rank = _int(e, "LOCAL_RANK")
    if local_rank is None:
        local_rank = rank % local_world_size
    node_rank = _int(e, "NODE_RANK", "GROUP_RANK")
    if node_rank is None:
        node_rank = rank // local_world_size
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"inconsistent environment: RANK={rank} WORLD_SIZE={world_size}")
    return DistInfo(
        rank=rank,
        local_rank=local_rank,
        world_size=world_size,
        local_world_size=local_world_size,
        node_rank=node_rank,
        num_nodes=num_nodes,
        master_addr=e.get("MASTER_ADDR", "").strip() or DEFAULT_MASTER_ADDR,
        master_port=_int(e, "MASTER_PORT") or DEFAULT_MASTER_PORT,
        job_id=e.get(JOB_ID_ENV, "").strip() or None,
        attempt=_int(e, ATTEMPT_ENV, "TORCHELASTIC_RESTART_COUNT") or 0,
    )


def is_distributed() -> bool:
    """True when ``WORLD_SIZE`` > 1 (whether or not the process group is up yet)."""
    return info().world_size > 1


def is_main_process() -> bool:
    """True on global rank 0 (and in a plain single process)."""
    return info().rank == 0


def should_save_outputs() -> bool:
    """True on the one rank that writes shared outputs (global rank 0)."""
    return is_main_process()


def print_distributed_info() -> None:
    """Print one line describing this rank (every rank prints its own)."""
    print(f"[corral] {info().describe()}", file=sys.stdout, flush=True)
