"""Proportional workload split: each rank's weight, batch size and loss factor.

``corral run --calibration`` exports one weight per global rank, in rank
order, as ``CORRAL_WORKLOAD_WEIGHTS`` (comma-separated, e.g.
``0.333333,0.666667``). A rank with twice the weight gets twice the examples
per step, so a fast host is not paced by a slow one at the all-reduce.

DDP averages the ranks' gradients with equal weight. With unequal per-rank
batches ``b_i`` (summing to the global batch ``B``), rank ``i``'s mean loss
multiplied by :func:`loss_scale` ``= world * b_i / B`` makes that average
exactly the gradient of the mean loss over the whole global batch, as with a
uniform split.

A rank's step also costs a fixed time ``f_i`` whatever its batch (the optimizer
step, the all-reduce's launch, Python): with ``CORRAL_STEP_OVERHEADS`` (one per
rank, ``k_i = r_i * f_i`` in examples, measured by ``corral calibrate``) the
split makes the step times ``f_i + b_i / r_i`` equal instead of the batches
proportional (:func:`equal_time_batches`); with no overheads it is the
proportional split exactly.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from fractions import Fraction

from corral.contract import (
    PLAN_NODE_ENV,
    PLAN_NPROCS_ENV,
    REPLICA_GROUP_ENV,
    STEP_OVERHEADS_ENV,
    WORKLOAD_WEIGHTS_ENV,
    positive_numbers,
)
from corral.sdk._env import info

__all__ = [
    "WEIGHTS_ENV",
    "apportion",
    "batch_sizes",
    "equal_time_batches",
    "local_batch_size",
    "loss_scale",
    "parse_weights",
    "plan_order_list",
    "positive_numbers",
    "resolve_weights",
    "step_overheads",
    "workload_weights",
]

WEIGHTS_ENV = WORKLOAD_WEIGHTS_ENV


def parse_weights(raw: str, world_size: int | None = None) -> tuple[float, ...]:
    """Parse a comma-separated weight list and normalise it to sum to 1.

    Raises ValueError naming :data:`WEIGHTS_ENV` when an entry is not a finite
    positive number or the count differs from ``world_size`` (when given).
    """
    values = positive_numbers(raw, WEIGHTS_ENV)
    if world_size is not None and len(values) != world_size:
        raise ValueError(
            f"{WEIGHTS_ENV}={raw!r} has {len(values)} weights for a world size of "
            f"{world_size}: one per global rank, in rank order"
        )
    total = math.fsum(values)
    return tuple(v / total for v in values)


"""Under torchrun: this node's index in corral's plan (the order of the weights)."""
"""Under torchrun: every plan node's rank count, comma-separated."""

_by_rank_cache: dict[str, tuple[float, ...]] = {}


def workload_weights(env: Mapping[str, str] | None = None) -> tuple[float, ...] | None:
    """Every rank's share of the work (summing to 1, rank order), or None when the
    job has no proportional split (``CORRAL_WORKLOAD_WEIGHTS`` unset or empty).

    The count must match ``WORLD_SIZE`` (ValueError otherwise). corral's plan
    lists the weights per host; under torchrun the global ranks are numbered at
    the rendezvous instead, so there every rank's weight is exchanged once with
    an all-gather: the process group must be up (``sdk.init_distributed()``).
    """
    e = os.environ if env is None else env
    raw = e.get(WEIGHTS_ENV, "").strip()
    if not raw:
        return None
    in_plan_order = parse_weights(raw, info(e).world_size)
    return plan_order_list(in_plan_order, e, WEIGHTS_ENV)


def plan_order_list(
    values: Sequence[float], env: Mapping[str, str], source: str
) -> tuple[float, ...]:
    """``values`` (one per planned rank, in corral's plan order, from ``source``) in
    global rank order: the same under corral's own launchers; under torchrun (ranks
    numbered at the rendezvous) each rank's own entry is all-gathered once."""
    world = info(env).world_size
    if len(values) != world:
        raise ValueError(
            f"{source} has {len(values)} entries for a world size of {world}: one per global rank"
        )
    node = env.get(PLAN_NODE_ENV, "").strip()
    if not node:  # ranks numbered by corral: rank order is plan order
        return tuple(values)
    key = f"{source}|{list(values)}|{node}|{env.get(PLAN_NPROCS_ENV, '')}|{env.get('RANK', '')}"
    if key not in _by_rank_cache:
        _by_rank_cache[key] = _exchange(values, env, source)
    return _by_rank_cache[key]


def _own_weight(plan_weights: Sequence[float], env: Mapping[str, str], source: str) -> float:
    """This rank's weight: its plan node's block of the plan-order list, at LOCAL_RANK."""
    try:
        node = int(env[PLAN_NODE_ENV])
        nprocs = [int(n) for n in env[PLAN_NPROCS_ENV].split(",")]
        local = int(env.get("LOCAL_RANK", "0"))
        return plan_weights[sum(nprocs[:node]) + local]
    except (KeyError, ValueError, IndexError):
        raise ValueError(
            f"{PLAN_NODE_ENV}={env.get(PLAN_NODE_ENV)!r} / {PLAN_NPROCS_ENV}="
            f"{env.get(PLAN_NPROCS_ENV)!r} do not locate this rank in {source}"
        ) from None


def _exchange(
    plan_weights: Sequence[float], env: Mapping[str, str], source: str = WEIGHTS_ENV
) -> tuple[float, ...]:
    """The entries in torch's rank order: each rank contributes its own (all-gather)."""
    import torch.distributed as dist

    own = _own_weight(plan_weights, env, source)
    if not (dist.is_available() and dist.is_initialized()):
        raise ValueError(
            f"{source}: under torchrun the global ranks are numbered at the "
            "rendezvous, so the weights are matched to ranks through the process group: "
            "call sdk.init_distributed() before reading them"
        )
    gathered: list[object] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, own)
    return tuple(float(w) for w in gathered)  # type: ignore[arg-type]


def apportion(total: int, weights: Sequence[float], minimum: int = 1) -> tuple[int, ...]:
    """Split the integer ``total`` in proportion to ``weights`` by largest remainder.

    The parts sum exactly to ``total`` and each is at least ``minimum`` (0 or
    1). Ties go to the lower index; a part below ``minimum`` takes one from the
    largest part (lowest index first). Deterministic: exact rational arithmetic.
    """
    if minimum not in (0, 1):
        raise ValueError(f"minimum must be 0 or 1, got {minimum}")
    if not weights or any(not math.isfinite(w) or w <= 0 for w in weights):
        raise ValueError(f"weights must be positive numbers, got {list(weights)}")
    if total < minimum * len(weights):
        raise ValueError(
            f"cannot split {total} into {len(weights)} parts of at least {minimum} each"
        )
    exact = [Fraction(w) for w in weights]
    whole = sum(exact)
    quotas = [total * w / whole for w in exact]
    parts = [math.floor(q) for q in quotas]
    order = sorted(range(len(parts)), key=lambda i: (parts[i] - quotas[i], i))
    for i in order[: total - sum(parts)]:
        parts[i] += 1
    for i, part in enumerate(parts):
        if part < minimum:
            donor = max(range(len(parts)), key=lambda j: (parts[j], -j))
            parts[donor] -= 1
            parts[i] += 1
    return tuple(parts)


def step_overheads(env: Mapping[str, str] | None = None) -> tuple[float, ...] | None:
    """Every rank's fixed per-step cost in examples (``CORRAL_STEP_OVERHEADS``, rank
    order), or None when the job has none (nor in an in-place replica group, whose
    split is per group). ValueError naming the variable for a bad entry or count."""
    e = os.environ if env is None else env
    raw = e.get(STEP_OVERHEADS_ENV, "").strip()
    if not raw or e.get(REPLICA_GROUP_ENV, "").strip():
        return None
    values = positive_numbers(raw, STEP_OVERHEADS_ENV, zero=True)
    if not any(values):
        return None
    return plan_order_list(values, e, STEP_OVERHEADS_ENV)


def equal_time_batches(
    global_batch: int, weights: Sequence[float], overheads: Sequence[float] | None = None
) -> tuple[float, ...]:
    """Every rank's (real) batch ``b_i``, summing to ``global_batch``, that makes the
    step times ``f_i + b_i / r_i`` equal: ``weights`` are the rates' shares
    ``r_i / R`` and ``overheads`` the fixed costs in examples ``k_i = r_i f_i``, so
    ``b_i = w_i (B + K) - k_i`` (``K``: the sum of the ``k_i``). A rank that would
    get less than one example gets one, and the others share the rest the same way.
    Without overheads (None, all 0) it returns ``weights`` unchanged: the
    proportional split, exactly."""
    world = len(weights)
    if overheads is None or not any(overheads):
        return tuple(weights)
    if len(overheads) != world:
        raise ValueError(
            f"{len(overheads)} step overheads for {world} ranks ({STEP_OVERHEADS_ENV}): "
            "one per rank"
        )
    if any(not math.isfinite(k) or k < 0 for k in overheads):
        raise ValueError(f"step overheads must be numbers >= 0, got {list(overheads)}")
    if global_batch < world:
        raise ValueError(
            f"global batch {global_batch} is smaller than the world size {world}: "
            "every rank needs at least one example per step"
        )
    parts: list[float | None] = [None] * world
    while True:
        free = [i for i, part in enumerate(parts) if part is None]
        left = global_batch - (world - len(free))  # the clamped ranks hold one each
        share = math.fsum(weights[i] for i in free)
        pooled = left + math.fsum(overheads[i] for i in free)
        split = {i: weights[i] / share * pooled - overheads[i] for i in free}
        low = [i for i in free if split[i] < 1]
        if not low or len(low) == len(free):
            out = [split.get(i, 1.0) if part is None else part for i, part in enumerate(parts)]
            return tuple(max(1.0, b) for b in out)
        for i in low:
            parts[i] = 1.0


def resolve_weights(weights: Sequence[float] | None, world: int) -> tuple[float, ...]:
    """``weights``, else ``CORRAL_WORKLOAD_WEIGHTS``, else uniform: one positive
    weight per rank of ``world`` (ValueError otherwise), normalised to sum to 1."""
    if weights is None:
        raw = os.environ.get(WEIGHTS_ENV, "").strip()
        if not raw:
            return (1.0 / world,) * world
        if not os.environ.get(PLAN_NODE_ENV):
            return parse_weights(raw, world)
        weights = workload_weights()  # torchrun: matched to ranks through the group
        assert weights is not None
    if len(weights) != world or any(not math.isfinite(w) or w <= 0 for w in weights):
        raise ValueError(
            f"{len(weights)} workload weights {list(weights)} for a world size of {world}: "
            "one positive number per rank"
        )
    total = math.fsum(weights)
    return tuple(w / total for w in weights)


def batch_sizes(
    global_batch: int,
    weights: Sequence[float] | None = None,
    world_size: int | None = None,
    overheads: Sequence[float] | None = None,
) -> tuple[int, ...]:
    """Every rank's batch size: integers >= 1, summing exactly to ``global_batch``,
    proportional to the weights (default ``CORRAL_WORKLOAD_WEIGHTS``, else uniform)
    or, with step overheads (default ``CORRAL_STEP_OVERHEADS``), equal in step time
    (:func:`equal_time_batches`)."""
    world = info().world_size if world_size is None else world_size
    if isinstance(global_batch, bool) or not isinstance(global_batch, int):
        raise ValueError(f"global_batch must be an integer, got {global_batch!r}")
    if global_batch < world:
        raise ValueError(
            f"global batch {global_batch} is smaller than the world size {world}: "
            "every rank needs at least one example per step"
        )
    shares = resolve_weights(weights, world)
    fixed = step_overheads() if overheads is None else overheads
    return apportion(global_batch, equal_time_batches(global_batch, shares, fixed))


def local_batch_size(
    global_batch: int,
    weights: Sequence[float] | None = None,
    rank: int | None = None,
    world_size: int | None = None,
) -> int:
    """This rank's share of ``global_batch`` (see :func:`batch_sizes`)."""
    me = info()
    sizes = batch_sizes(global_batch, weights, me.world_size if world_size is None else world_size)
    return sizes[me.rank if rank is None else rank]


def loss_scale(
    global_batch: int | None = None,
    weights: Sequence[float] | None = None,
    rank: int | None = None,
    world_size: int | None = None,
) -> float:
    """The factor for this rank's mean loss: ``world * b_i / B``.

    With ``global_batch`` it is exact for the batch sizes of :func:`batch_sizes`;
    without, it is ``world * w_i`` (exact when ``B * w_i`` are integers). 1.0
    without weights and a uniform split.
    """
    me = info()
    world = me.world_size if world_size is None else world_size
    index = me.rank if rank is None else rank
    if global_batch is not None:
        return world * batch_sizes(global_batch, weights, world)[index] / global_batch
    return world * resolve_weights(weights, world)[index]
