"""Pure planning for ``--recovery in-place``: every node is its own single-node job.

Each host's node is planned as a one-host job of its own (torchrun with
``--nnodes=1`` and its own rendezvous and store at the host's address and
``port``, or the python launcher with its own MASTER_ADDR/MASTER_PORT), so one
group can be torn down and restarted without the others noticing beyond
torchft's quorum. Its ranks get the torchft contract
(:mod:`corral.contract`): the Lighthouse's address, the group's id (the node's
index in the plan), the number of groups and the fewest groups that may train;
RANK and WORLD_SIZE are the group's own.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from corral.cluster.model import Cluster, Host
from corral.contract import (
    LIGHTHOUSE_ENV,
    MIN_REPLICAS_ENV,
    REPLICA_GROUP_ENV,
    REPLICA_GROUPS_ENV,
)
from corral.plan.render import plan_job
from corral.plan.spec import JobSpec, NodeCommand


def plan_group(
    spec: JobSpec,
    host: Host,
    group: int,
    *,
    groups: int,
    port: int,
    lighthouse: str,
    min_replicas: int,
    attempt: int = 0,
) -> NodeCommand:
    """Replica group ``group`` (of ``groups``) on ``host``, its store at ``port``."""
    one = dataclasses.replace(
        spec,
        master_addr=host.address,
        master_port=port,
        # one weight per rank of the whole job does not fit a one-host plan; the
        # groups are equal replicas (the SDK splits the data by the live quorum)
        workload_weights=(),
    )
    (command,) = plan_job(one, Cluster((host,)), attempt)
    env = dict(command.env)
    env[LIGHTHOUSE_ENV] = lighthouse
    env[REPLICA_GROUP_ENV] = str(group)
    env[REPLICA_GROUPS_ENV] = str(groups)
    env[MIN_REPLICAS_ENV] = str(min_replicas)
    return dataclasses.replace(command, node_rank=group, env=env)


def plan_groups(
    spec: JobSpec,
    cluster: Cluster,
    *,
    ports: Sequence[int],
    lighthouse: str,
    min_replicas: int,
    attempt: int = 0,
) -> list[NodeCommand]:
    """One replica group per host of ``cluster``; ``ports[i]`` is host i's store port."""
    groups = len(cluster.hosts)
    return [
        plan_group(
            spec,
            host,
            index,
            groups=groups,
            port=ports[index],
            lighthouse=lighthouse,
            min_replicas=min_replicas,
            attempt=attempt,
        )
        for index, host in enumerate(cluster.hosts)
    ]
