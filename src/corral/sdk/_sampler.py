"""``WeightedDistributedSampler``: a DistributedSampler with shares proportional to weights.

Layout of an epoch with ``global_batch=B`` (batch sizes ``b_i`` from
:func:`corral.sdk.batch_sizes`): the epoch's permutation of the ``N`` indices
is cut into global steps of ``B`` consecutive indices, and each step into
consecutive per-rank slices of ``b_i``. The last ``R = N mod B`` indices form
one shorter final step, split in proportion to ``b_i`` with at least one per
rank. When ``R`` is smaller than the world size that is impossible, so those
``R`` indices join the previous step instead (at most one more example on
``R`` ranks). Every index is therefore used exactly once per epoch, and every
rank runs the same number of steps (:attr:`num_steps`). ``drop_last=True``
drops the ``R`` tail indices instead.

Without ``global_batch`` the sampler only splits the indices in proportion to
the weights (``N * w_i``, largest remainder); steps are then the caller's
business.

Memory: ``fits`` (default ``CORRAL_MICRO_BATCH_FITS``, what ``corral calibrate``
found each rank fits) cap each rank's micro-batch. A rank whose batch exceeds its
fit runs its step's slice as :meth:`micro_sizes` micro-batches and steps once
(gradient accumulation; :meth:`loss_scale` with ``micro`` keeps the gradient the
global batch's); ``accumulate=False`` caps its batch instead and moves the excess
to ranks with room (see :func:`corral.sdk._memory.memory_split`).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence, Sized
from typing import Any

from corral.sdk._env import info
from corral.sdk._memory import memory_split, micro_batch_fits, micro_sizes
from corral.sdk._weights import apportion, batch_sizes, resolve_weights, step_overheads

__all__ = ["WeightedDistributedSampler"]


def _torch() -> Any:
    try:
        import torch
    except ImportError as exc:
        raise ImportError("WeightedDistributedSampler needs torch: pip install torch") from exc
    return torch


def _topology(num_replicas: int | None, rank: int | None) -> tuple[int, int]:
    """(world, rank): the process group's when it is up, else the environment's."""
    world, me = None, None
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            world, me = dist.get_world_size(), dist.get_rank()
    except ImportError:
        pass
    if world is None or me is None:
        env = info()
        world, me = env.world_size, env.rank
    world = world if num_replicas is None else num_replicas
    me = me if rank is None else rank
    if world < 1 or not 0 <= me < world:
        raise ValueError(f"invalid rank {me} for num_replicas {world}")
    return world, me


class _Layout:
    """Per-step, per-rank slice sizes of one epoch: ``body`` steps of ``full`` sizes,
    then an optional ``tail`` step."""

    def __init__(self, body: int, full: Sequence[int], tail: Sequence[int] | None) -> None:
        self.body, self.full, self.tail = body, tuple(full), None if tail is None else tuple(tail)

    @property
    def steps(self) -> int:
        return self.body + (self.tail is not None)

    def sizes(self, step: int) -> tuple[int, ...]:
        if not 0 <= step < self.steps:
            raise IndexError(f"step {step} outside 0..{self.steps - 1}")
        return self.full if step < self.body or self.tail is None else self.tail

    def slices(self, rank: int) -> Iterator[tuple[int, int]]:
        """(start, stop) of ``rank``'s slice of each step in the epoch's permutation."""
        width = sum(self.full)
        offset = sum(self.full[:rank])
        for step in range(self.body):
            start = step * width + offset
            yield start, start + self.full[rank]
        if self.tail is not None:
            start = self.body * width + sum(self.tail[:rank])
            yield start, start + self.tail[rank]


def _layout(
    n: int,
    weights: Sequence[float],
    global_batch: int | None,
    drop_last: bool,
    capped: Sequence[int | None] | None = None,
) -> _Layout:
    world = len(weights)
    if global_batch is None:
        if drop_last:
            raise ValueError("drop_last needs global_batch (it drops the final partial step)")
        if n < world:
            raise ValueError(f"a dataset of {n} examples cannot give each of {world} ranks one")
        return _Layout(0, [0] * world, apportion(n, weights))
    if capped:  # no accumulation: batches capped at the fits, the excess moved
        split = memory_split(
            global_batch, weights, capped, accumulate=False, overheads=step_overheads()
        )
        full = tuple(m.batch for m in split)
    else:
        full = batch_sizes(global_batch, weights, world)
    body, rest = divmod(n, global_batch)
    if rest == 0 or drop_last:
        if body == 0:
            raise ValueError(
                f"drop_last with a dataset of {n} examples and a global batch of "
                f"{global_batch} leaves no step"
            )
        return _Layout(body, full, None)
    if rest >= world:
        return _Layout(body, full, apportion(rest, full))
    if body == 0:
        raise ValueError(f"a dataset of {n} examples cannot give each of {world} ranks one")
    extra = apportion(rest, full, minimum=0)
    return _Layout(body - 1, full, [a + b for a, b in zip(full, extra, strict=True)])


class WeightedDistributedSampler:
    """Indices of this rank's share of the dataset, proportional to its workload weight.

    ``weights`` default to ``CORRAL_WORKLOAD_WEIGHTS`` (else uniform);
    ``num_replicas``/``rank`` to the process group's, else the environment's.
    Pass ``global_batch`` to get equal steps on every rank with per-rank
    batches of :attr:`batch_size`; load with
    ``DataLoader(data, batch_sampler=sampler.batch_sampler())`` (or
    ``batch_size=sampler.batch_size, sampler=sampler``, the same batches unless
    a short tail was folded into the last step, see the module docstring).
    Like torch's ``DistributedSampler``, call :meth:`set_epoch` every epoch;
    the same ``seed`` and epoch give the same permutation on every rank.
    ``fits`` (one per rank, None: no limit; default ``CORRAL_MICRO_BATCH_FITS``)
    cap the micro-batches: see :attr:`accumulation` and :meth:`micro_sizes`.
    """

    def __init__(
        self,
        dataset: Sized,
        num_replicas: int | None = None,
        rank: int | None = None,
        weights: Sequence[float] | None = None,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        *,
        global_batch: int | None = None,
        fits: Sequence[int | None] | None = None,
        accumulate: bool = True,
    ) -> None:
        self.dataset = dataset
        self.num_replicas, self.rank = _topology(num_replicas, rank)
        self.weights = tuple(resolve_weights(weights, self.num_replicas))
        self.shuffle, self.seed, self.drop_last = shuffle, seed, drop_last
        self.global_batch = global_batch
        self.epoch = 0
        given = micro_batch_fits() if fits is None else fits
        self.fits: tuple[int | None, ...] = tuple(
            None if not f else int(f) for f in (given or (None,) * self.num_replicas)
        )
        if len(self.fits) != self.num_replicas:
            raise ValueError(f"{len(self.fits)} fits for {self.num_replicas} ranks: one per rank")
        self.accumulate = accumulate
        capped = None if accumulate or not any(self.fits) else self.fits
        self._layout = _layout(len(dataset), self.weights, global_batch, drop_last, capped)

    @property
    def batch_size(self) -> int | None:
        """This rank's batch size (None without ``global_batch``)."""
        return None if self.global_batch is None else self._layout.full[self.rank]

    @property
    def num_steps(self) -> int | None:
        """Steps per epoch, the same on every rank (None without ``global_batch``)."""
        return None if self.global_batch is None else self._layout.steps

    @property
    def shares(self) -> tuple[int, ...]:
        """Every rank's number of examples per epoch, in rank order."""
        layout = self._layout
        tail = layout.tail or (0,) * self.num_replicas
        return tuple(layout.body * f + t for f, t in zip(layout.full, tail, strict=True))

    @property
    def micro_batch(self) -> int | None:
        """This rank's largest micro-batch (None without ``global_batch``)."""
        return None if self.global_batch is None else self.micro_sizes(0)[0]

    @property
    def accumulation(self) -> int | None:
        """Micro-batches per full step on this rank (1: its batch fits; None without
        ``global_batch``); the last step may need fewer, see :meth:`micro_sizes`."""
        return None if self.global_batch is None else len(self.micro_sizes(0))

    def micro_sizes(self, step: int) -> tuple[int, ...]:
        """This rank's micro-batch sizes at ``step``: its batch cut to its fit."""
        return micro_sizes(self.step_sizes(step)[self.rank], self.fits[self.rank])

    def step_sizes(self, step: int) -> tuple[int, ...]:
        """Every rank's batch size at ``step`` (0-based, within the epoch)."""
        self._require_batches()
        return self._layout.sizes(step)

    def loss_scale(self, step: int, micro: int | None = None) -> float:
        """``world * b_i / B`` for ``step``'s actual sizes (the last step may be
        shorter); with ``micro``, ``world * m / B`` for that micro-batch of size ``m``
        (summed over the step's micro-batches: the whole step's factor)."""
        sizes = self.step_sizes(step)
        mine = sizes[self.rank] if micro is None else self.micro_sizes(step)[micro]
        return self.num_replicas * mine / sum(sizes)

    def set_epoch(self, epoch: int) -> None:
        """Use a different permutation for ``epoch`` (call before each epoch)."""
        self.epoch = epoch

    def _permutation(self) -> list[int]:
        n = len(self.dataset)
        if not self.shuffle:
            return list(range(n))
        torch = _torch()
        generator = torch.Generator()
        generator.manual_seed(self.seed + self.epoch)
        order: list[int] = torch.randperm(n, generator=generator).tolist()
        return order

    def batches(self) -> Iterator[list[int]]:
        """This rank's batches of the current epoch, one per step."""
        self._require_batches()
        order = self._permutation()
        for start, stop in self._layout.slices(self.rank):
            yield order[start:stop]

    def micro_batches(self) -> Iterator[list[int]]:
        """This rank's micro-batches of the current epoch, in order: step ``k``'s
        batch cut into ``len(micro_sizes(k))`` micro-batches."""
        for step, batch in enumerate(self.batches()):
            start = 0
            for size in self.micro_sizes(step):
                yield batch[start : start + size]
                start += size

    def batch_sampler(self, micro: bool = False) -> _BatchSampler:
        """A batch sampler for ``DataLoader(batch_sampler=...)``: :meth:`batches` each
        epoch, or :meth:`micro_batches` with ``micro``."""
        self._require_batches()
        return _BatchSampler(self, micro)

    def __iter__(self) -> Iterator[int]:
        order = self._permutation()
        return itertools.chain.from_iterable(
            order[start:stop] for start, stop in self._layout.slices(self.rank)
        )

    def __len__(self) -> int:
        return self.shares[self.rank]

    def _require_batches(self) -> None:
        if self.global_batch is None:
            raise ValueError("steps and batches need WeightedDistributedSampler(global_batch=...)")

    def __repr__(self) -> str:
        weights = ", ".join(f"{w:.3g}" for w in self.weights)
        return (
            f"WeightedDistributedSampler(rank {self.rank}/{self.num_replicas}, "
            f"weights [{weights}], {len(self)} of {len(self.dataset)} examples"
            + ("" if self.batch_size is None else f", batch {self.batch_size}")
            + ("" if (self.accumulation or 1) == 1 else f" in {self.accumulation} micro-batches")
            + f", epoch {self.epoch})"
        )


class _BatchSampler:
    """Iterates the batches (or micro-batches) of a :class:`WeightedDistributedSampler`."""

    def __init__(self, sampler: WeightedDistributedSampler, micro: bool = False) -> None:
        self.sampler, self.micro = sampler, micro

    def __iter__(self) -> Iterator[list[int]]:
        return self.sampler.micro_batches() if self.micro else self.sampler.batches()

    def __len__(self) -> int:
        steps = self.sampler.num_steps
        assert steps is not None  # batch_sampler() requires global_batch
        if self.micro:
            return sum(len(self.sampler.micro_sizes(k)) for k in range(steps))
        return steps
