"""Pure planning for ``--recovery in-place``: every node is its own single-node job.

Each host's node is planned as a one-host job of its own (torchrun with
``--nnodes=1`` and its own rendezvous and store at the host's address and
``port``, or the python launcher with its own MASTER_ADDR/MASTER_PORT), so one
group can be torn down and restarted without the others noticing beyond
torchft's quorum. Its ranks get the torchft contract
(:mod:`corral.contract`): the Lighthouse's address, the group's id (the node's
index in the plan), the number of groups and the fewest groups that may train,
also under torchft's conventional names (``REPLICA_GROUP_ID``,
``NUM_REPLICA_GROUPS``), and torchft's quorum retries (``TORCHFT_QUORUM_RETRIES``:
the groups reconnect to a Lighthouse corral restarted), unless the job's env sets
them; RANK and WORLD_SIZE are the group's own. With workload weights
(``--calibration``), each group gets one weight, the sum of its ranks'
(:func:`group_weights`), in ``CORRAL_WORKLOAD_WEIGHTS``: the SDK splits each step's
batch among the live groups by them (``sdk.fault_tolerant``), so a departed group's
share is re-split among the survivors by their weights.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from corral.cluster.model import Cluster, Host
from corral.contract import (
    FT_QUORUM_RETRIES_DEFAULT,
    FT_QUORUM_RETRIES_ENV,
    LIGHTHOUSE_ENV,
    MIN_REPLICAS_ENV,
    REPLICA_GROUP_ENV,
    REPLICA_GROUPS_ENV,
    TORCHFT_REPLICA_GROUP_ENV,
    TORCHFT_REPLICA_GROUPS_ENV,
    WORKLOAD_WEIGHTS_ENV,
)
from corral.errors import ConfigError
from corral.plan.render import plan_job
from corral.plan.spec import JobSpec, NodeCommand


def group_weights(weights: Sequence[float], ranks: Sequence[int]) -> tuple[float, ...]:
    """One weight per group: the sum of its ranks' weights. ``weights``: one per rank
    of the whole job (host by host, then local rank); ``ranks``: each group's number
    of ranks, in group order. Empty without weights; ConfigError when they do not
    cover the ranks."""
    if not weights:
        return ()
    if len(weights) != sum(ranks):
        raise ConfigError(
            f"{len(weights)} workload weights for the {sum(ranks)} ranks of "
            f"{len(ranks)} replica groups",
            option="--calibration",
        )
    out: list[float] = []
    start = 0
    for count in ranks:
        out.append(math.fsum(weights[start : start + count]))
        start += count
    return tuple(out)


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
    weights: Sequence[float] = (),
) -> NodeCommand:
    """Replica group ``group`` (of ``groups``) on ``host``, its store at ``port``;
    ``weights``: one per group (:func:`group_weights`; empty: equal groups)."""
    one = dataclasses.replace(
        spec,
        master_addr=host.address,
        master_port=port,
        # one weight per rank of the whole job does not fit a one-host plan: the
        # group's ranks get the groups' weights instead (below)
        workload_weights=(),
    )
    (command,) = plan_job(one, Cluster((host,)), attempt)
    env = dict(command.env)
    env[LIGHTHOUSE_ENV] = lighthouse
    env[REPLICA_GROUP_ENV] = str(group)
    env[REPLICA_GROUPS_ENV] = str(groups)
    env[MIN_REPLICAS_ENV] = str(min_replicas)
    # torchft's own names, for scripts written for torchft (no corral import); a value
    # the job's --env or the host's env gives wins
    env.setdefault(TORCHFT_REPLICA_GROUP_ENV, str(group))
    env.setdefault(TORCHFT_REPLICA_GROUPS_ENV, str(groups))
    # torchft retries a quorum whose Lighthouse call failed: the groups reconnect to
    # the Lighthouse corral restarts at the same address (the job's env may say 0)
    env.setdefault(FT_QUORUM_RETRIES_ENV, str(FT_QUORUM_RETRIES_DEFAULT))
    if weights:
        env[WORKLOAD_WEIGHTS_ENV] = ",".join(f"{w:.6g}" for w in weights)
    return dataclasses.replace(command, node_rank=group, env=env)


LIGHTHOUSE_PLACEHOLDER = "http://{coordinator}:{port picked at launch}"
"""The Lighthouse's address in a dry run (its port is bound when it starts)."""


def plan_inplace(
    spec: JobSpec,
    cluster: Cluster,
    *,
    spares: int = 0,
    min_replicas: int = 1,
    lighthouse: str = LIGHTHOUSE_PLACEHOLDER,
    attempt: int = 0,
) -> tuple[list[NodeCommand], tuple[Host, ...]]:
    """The dry run of ``--recovery in-place``: one group per host of ``cluster`` but
    the last ``spares`` (held in reserve, returned second). Every group's store is at
    ``spec.master_port`` (on ``local:N`` each group gets its own free port at launch).
    ``spec``'s workload weights (one per rank of the training hosts, or of all hosts)
    become one weight per group."""
    hosts = cluster.hosts[: len(cluster.hosts) - spares] if spares else cluster.hosts
    training = Cluster(hosts, source=cluster.source)
    plain = dataclasses.replace(spec, workload_weights=())
    ranks = [c.nproc for c in plan_job(plain, training, attempt)]
    weights = spec.workload_weights[: sum(ranks)] if spares else spec.workload_weights
    commands = plan_groups(
        spec,
        training,
        ports=[spec.master_port] * len(hosts),
        lighthouse=lighthouse,
        min_replicas=min_replicas,
        attempt=attempt,
        weights=group_weights(weights, ranks),
    )
    return commands, cluster.hosts[len(hosts) :]


def plan_groups(
    spec: JobSpec,
    cluster: Cluster,
    *,
    ports: Sequence[int],
    lighthouse: str,
    min_replicas: int,
    attempt: int = 0,
    weights: Sequence[float] = (),
) -> list[NodeCommand]:
    """One replica group per host of ``cluster``; ``ports[i]`` is host i's store port;
    ``weights``: one per group (empty: equal groups)."""
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
            weights=weights,
        )
        for index, host in enumerate(cluster.hosts)
    ]
