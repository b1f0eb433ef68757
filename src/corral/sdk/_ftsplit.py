"""Data sharding that follows torchft's live quorum (pure: standard library only).

The examples are read as one **stream** of epochs: epoch ``e`` is a permutation
of the ``N`` indices (seeded with ``seed + e``, or the identity without
shuffling) and occupies stream positions ``e*N .. (e+1)*N - 1``. Committed
step ``k`` (torchft's ``manager.current_step()``, the same on every
participant) reads the ``B`` positions ``k*B .. k*B + B - 1``, so a step that
straddles an epoch boundary takes the last examples of one epoch and the first
of the next.

Each step's ``B`` examples are split among the replica groups that take part in
it (the live quorum's participants, in group-id order), in proportion to their
weights (equal without calibration weights), by largest remainder; each group's
share is split among its local ranks by their weights the same way. So:

* every example of an epoch is read by exactly one rank of exactly one committed
  step: none is dropped, none is counted twice;
* a step that does not commit (a group died during it, an allreduce failed) is
  read again, whole, by the quorum that runs it next: a departed group's share
  is re-split among the survivors by their weights;
* a group that is not participating (it is healing from a live peer this step)
  gets no share: it runs a one-example stand-in with a loss scale of 0 (torchft
  zeroes its gradient anyway), so the collectives still match.

Rank ``(g, l)`` with ``b`` examples multiplies its mean loss by
:attr:`Share.loss_scale` ``= n * L * b / B`` (``n`` live groups of ``L`` ranks):
with the averages torchft's DDP takes (over the group's ranks, then over the
participants) the update is exactly the gradient of the mean loss over the whole
global batch ``B``, whatever the quorum and the weights.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache

from corral.sdk._weights import apportion, positive_numbers

__all__ = ["Share", "group_weights", "quorum_share", "stream_indices"]


@dataclass(frozen=True)
class Share:
    """One rank's part of one step's global batch (see the module docstring)."""

    step: int
    #: The first stream position and the number of examples this rank reads.
    start: int
    count: int
    #: The factor for this rank's mean loss (0.0 when not participating).
    loss_scale: float
    #: Live groups in this step, and whether this rank's group is one of them.
    participants: int
    participating: bool


def _check_positive(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return value


def quorum_share(
    step: int,
    global_batch: int,
    live: Mapping[int, float],
    group: int,
    local_rank: int = 0,
    local_weights: Sequence[float] = (1.0,),
) -> Share:
    """Rank ``local_rank`` of replica group ``group``'s share of step ``step``.

    ``live`` maps each participating group's id to its weight (any positive
    scale); ``local_weights`` are the weights of this group's ranks (every group
    has as many ranks). ValueError when the global batch cannot give every live
    rank at least one example, or a weight is not a positive number.
    """
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"step must be a non-negative integer, got {step!r}")
    _check_positive("global_batch", global_batch)
    ranks = len(local_weights)
    if not 0 <= local_rank < ranks:
        raise ValueError(f"local_rank {local_rank} is outside the group's {ranks} ranks")
    base = step * global_batch
    if group not in live:
        return Share(step, base, 1, 0.0, len(live), False)
    order = sorted(live)
    if global_batch < len(order) * ranks:
        raise ValueError(
            f"global batch {global_batch} is smaller than the {len(order) * ranks} live ranks "
            f"({len(order)} groups of {ranks}): every rank needs at least one example per step"
        )
    group_sizes = apportion(global_batch, [live[g] for g in order])
    index = order.index(group)
    offset = sum(group_sizes[:index])
    local_sizes = apportion(group_sizes[index], local_weights)
    start = base + offset + sum(local_sizes[:local_rank])
    count = local_sizes[local_rank]
    scale = len(order) * ranks * count / global_batch
    return Share(step, start, count, scale, len(order), True)


@lru_cache(maxsize=4)
def _permutation(size: int, seed: int, epoch: int) -> tuple[int, ...]:
    order = list(range(size))
    random.Random(seed + epoch).shuffle(order)
    return tuple(order)


def stream_indices(
    start: int, count: int, size: int, *, seed: int = 0, shuffle: bool = True
) -> list[int]:
    """The dataset indices at stream positions ``start .. start + count - 1``."""
    _check_positive("dataset size", size)
    if start < 0 or count < 0:
        raise ValueError(f"stream positions must be non-negative, got {start}+{count}")
    out: list[int] = []
    position = start
    while len(out) < count:
        epoch, offset = divmod(position, size)
        take = min(count - len(out), size - offset)
        if shuffle:
            out.extend(_permutation(size, seed, epoch)[offset : offset + take])
        else:
            out.extend(range(offset, offset + take))
        position += take
    return out


def group_weights(
    raw: str,
    groups: int,
    group_ranks: int,
    *,
    source: str = "weights",
) -> tuple[tuple[float, ...], tuple[tuple[float, ...], ...]]:
    """Per-group weights and each group's per-rank weights from a weight list.

    ``raw`` is comma separated: either one weight per rank of the whole job
    (``groups * group_ranks`` of them, group by group, as ``corral run
    --calibration`` exports them) or one per group (its ranks then weigh the
    same). A group's weight is the sum of its ranks'. ValueError (naming
    ``source``) for any other count or a weight that is not a positive number.
    """
    values = positive_numbers(raw, source)
    if len(values) == groups * group_ranks:
        blocks = [tuple(values[g * group_ranks : (g + 1) * group_ranks]) for g in range(groups)]
    elif len(values) == groups:
        blocks = [(v / group_ranks,) * group_ranks for v in values]
    else:
        raise ValueError(
            f"{source}={raw!r} has {len(values)} weights for {groups} replica groups of "
            f"{group_ranks} ranks: give one per rank ({groups * group_ranks}) or one per "
            f"group ({groups})"
        )
    return tuple(math.fsum(b) for b in blocks), tuple(blocks)
