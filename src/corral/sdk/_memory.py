"""A split that knows memory: the largest micro-batch a rank fits, and accumulation.

:func:`probe_fit` finds the largest micro-batch one training step fits: it doubles
the batch until a step runs out of memory (or ``limit`` is reached), then bisects
between the last batch that fitted and the first that did not. Out of memory is
``torch.cuda.OutOfMemoryError`` (and any ``MemoryError``) caught; with a declared
cap (``CORRAL_MEM_CAP_MB``, a node's env or ``corral calibrate --mem-cap
HOST=MB``) it is also a step whose measured peak exceeds the cap, so a CPU node is
capped as a smaller card would be. The peak of a step is what it allocated while it
ran: Python allocations (``tracemalloc``), the tensors autograd keeps for the
backward pass plus the model's parameters and gradients (torch on the CPU), and
``torch.cuda.max_memory_allocated`` on a GPU.

:func:`memory_split` is the rule the weighted sampler follows (pure): the global
batch ``B`` is split in proportion to the ranks' throughput weights; a rank whose
share ``b_i`` exceeds its fit ``f_i`` runs ``ceil(b_i / f_i)`` micro-batches of at
most ``f_i`` and steps once (gradient accumulation), so its share of the work and
the gradient are unchanged while its memory is respected. Work shifts away from a
memory-capped rank through its weight: the calibration measures each rank's
throughput at the micro-batch it fits, so a rank that has to run small
micro-batches is charged for them. ``accumulate=False`` instead caps ``b_i`` at
``f_i`` and gives the excess to the ranks with room, in proportion to their
weights.
"""

from __future__ import annotations

import gc
import math
import os
import sys
import tracemalloc
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from corral.contract import MEM_CAP_ENV, MICRO_BATCH_FITS_ENV, REPLICA_GROUP_ENV
from corral.sdk._weights import apportion, equal_time_batches, plan_order_list

__all__ = [
    "MEM_CAP_ENV",
    "MICRO_BATCH_FITS_ENV",
    "Fit",
    "MemoryCapExceeded",
    "MicroSplit",
    "is_out_of_memory",
    "memory_cap",
    "memory_split",
    "micro_batch_fits",
    "micro_sizes",
    "parse_fits",
    "probe_fit",
    "step_peak_bytes",
]

MIB = 1024 * 1024
#: The largest batch :func:`probe_fit` tries by default.
DEFAULT_LIMIT = 1 << 16


class MemoryCapExceeded(MemoryError):
    """A step's measured peak memory exceeded the node's declared cap."""

    def __init__(self, batch: int, peak: int, cap: int) -> None:
        super().__init__(
            f"a step of micro-batch {batch} peaked at {peak / MIB:.1f} MiB, over the "
            f"declared cap of {cap / MIB:.1f} MiB ({MEM_CAP_ENV})"
        )
        self.batch, self.peak, self.cap = batch, peak, cap


@dataclass(frozen=True)
class Fit:
    """What :func:`probe_fit` found: the largest micro-batch that fitted, and whether
    a larger one ran out of memory (False: every batch up to the limit fitted)."""

    batch: int
    limited: bool


@dataclass(frozen=True)
class MicroSplit:
    """One rank's part of a global step: its examples, and how it runs them."""

    batch: int
    """Examples per optimizer step."""
    micro: int
    """Its largest micro-batch (at most its fit)."""
    accumulation: int
    """Micro-batches per optimizer step (1: no accumulation)."""

    @property
    def sizes(self) -> tuple[int, ...]:
        """The micro-batches of one step, largest first, summing to :attr:`batch`."""
        return micro_sizes(self.batch, self.micro)


def memory_cap(env: Mapping[str, str] | None = None) -> int | None:
    """The declared memory cap in bytes (``CORRAL_MEM_CAP_MB``), or None; ValueError
    naming the variable when it is not a positive number."""
    raw = (os.environ if env is None else env).get(MEM_CAP_ENV, "").strip()
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{MEM_CAP_ENV}={raw!r} is not a positive number of MiB")
    return int(value * MIB)


def is_out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` says a step ran out of memory (a declared cap, a MemoryError,
    torch's CUDA OOM, or a backend's or torch's CPU allocator's RuntimeError saying so)."""
    if isinstance(exc, MemoryError):
        return True
    torch = sys.modules.get("torch")
    oom = getattr(getattr(torch, "cuda", None), "OutOfMemoryError", None)
    if isinstance(oom, type) and isinstance(exc, oom):
        return True
    text = str(exc).lower()
    # CUDA/MPS say "out of memory"; torch's CPU allocator "can't allocate memory"
    return isinstance(exc, RuntimeError) and (
        "out of memory" in text or "can't allocate memory" in text
    )


def _storage_key(tensor: Any) -> tuple[int, int]:
    storage = tensor.untyped_storage()
    return storage.data_ptr(), storage.nbytes()


@contextmanager
def _torch_cpu_bytes(torch: Any, found: list[int], seen: set[tuple[int, int]]) -> Iterator[None]:
    """Count the bytes of the CPU tensors autograd saves for the backward pass into
    ``found[0]``, each storage once and none already in ``seen`` (the parameters)."""

    def pack(tensor: Any) -> Any:
        if tensor.device.type == "cpu":
            key = _storage_key(tensor)
            if key not in seen:
                seen.add(key)
                found[0] += key[1]
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        yield


def _params_keys(params: Sequence[Any]) -> set[tuple[int, int]]:
    """The storages of the parameters and their gradients (CPU)."""
    return {
        _storage_key(tensor)
        for p in params
        for tensor in (p, p.grad)
        if tensor is not None and tensor.device.type == "cpu"
    }


def step_peak_bytes(step: Callable[[int], object], batch: int, params: Sequence[Any] = ()) -> int:
    """Run ``step(batch)`` once; the peak memory it took (see the module docstring).
    ``params``: the model's parameters, counted with their gradients (torch, CPU)."""
    torch: Any = sys.modules.get("torch")
    cuda = torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized()
    was_tracing = tracemalloc.is_tracing()
    if not was_tracing:
        tracemalloc.start()
    tracemalloc.reset_peak()
    base, _ = tracemalloc.get_traced_memory()
    saved = [0]
    held = _params_keys(params) if torch is not None else set()
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    try:
        if torch is not None:
            with _torch_cpu_bytes(torch, saved, set(held)):
                step(batch)
        else:
            step(batch)
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        if not was_tracing:
            tracemalloc.stop()
    if torch is not None:
        peak += saved[0] + sum(size for _, size in _params_keys(params))
    if cuda:
        torch.cuda.synchronize()
        peak += torch.cuda.max_memory_allocated()  # the card's, the model's included
    return max(0, peak)


def _release() -> None:
    """Give back what a failed step held (its frames, the CUDA cache)."""
    gc.collect()
    torch: Any = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def probe_fit(
    step: Callable[[int], object],
    *,
    start: int = 1,
    limit: int = DEFAULT_LIMIT,
    cap_mb: float | None = None,
    params: Sequence[Any] = (),
) -> Fit:
    """The largest micro-batch ``step(batch)`` (one training step) runs without
    running out of memory: double from ``start`` until one does or ``limit`` is
    reached, then bisect. ``cap_mb`` (default ``CORRAL_MEM_CAP_MB``) declares the
    node's memory: a step whose measured peak exceeds it counts as out of memory.
    MemoryError when not even a micro-batch of 1 fits; other errors propagate."""
    if start < 1 or limit < start:
        raise ValueError(f"need 1 <= start <= limit (got start={start}, limit={limit})")
    cap = memory_cap() if cap_mb is None else int(cap_mb * MIB)

    def fits(batch: int) -> bool:
        try:
            if cap is None:
                step(batch)
            else:
                peak = step_peak_bytes(step, batch, params)
                if peak > cap:
                    raise MemoryCapExceeded(batch, peak, cap)
        except Exception as exc:
            if not is_out_of_memory(exc):
                raise
            del exc
            _release()
            return False
        return True

    good, bad = 0, None
    batch = start
    while True:
        if not fits(batch):
            bad = batch
            break
        good = batch
        if batch >= limit:
            return Fit(good, limited=False)
        batch = min(2 * batch, limit)
    while bad - good > 1:
        middle = (good + bad) // 2
        if fits(middle):
            good = middle
        else:
            bad = middle
    if good == 0:
        raise MemoryError(
            "not even a micro-batch of 1 fits in this node's memory"
            + ("" if cap is None else f" (declared cap {cap / MIB:.1f} MiB, {MEM_CAP_ENV})")
        )
    return Fit(good, limited=True)


def micro_sizes(batch: int, fit: int | None) -> tuple[int, ...]:
    """``batch`` cut into the fewest micro-batches of at most ``fit`` (None: no
    limit), as even as possible, largest first."""
    if batch < 0:
        raise ValueError(f"batch must be >= 0, got {batch}")
    if fit is None or batch <= fit:
        return (batch,)
    if fit < 1:
        raise ValueError(f"a fit must be at least 1, got {fit}")
    count = -(-batch // fit)
    base, extra = divmod(batch, count)
    return (base + 1,) * extra + (base,) * (count - extra)


def _capped(total: int, weights: Sequence[float], fits: Sequence[int | None]) -> list[int]:
    """``total`` in proportion to ``weights`` with no part above its fit: a part
    over its fit is set to it and the rest re-split over the others (water-filling)."""
    room = sum(f for f in fits if f is not None) if all(f is not None for f in fits) else None
    if room is not None and room < total:
        raise ValueError(
            f"a global batch of {total} does not fit: the ranks fit {room} examples per "
            "step together; use gradient accumulation (accumulate=True) or a smaller batch"
        )
    parts: list[int | None] = [None] * len(weights)
    left = total
    while True:
        free = [i for i, part in enumerate(parts) if part is None]
        split = dict(zip(free, apportion(left, [weights[i] for i in free]), strict=True))
        over = [i for i in free if (f := fits[i]) is not None and split[i] > f]
        if not over:
            return [split[i] if part is None else part for i, part in enumerate(parts)]
        for i in over:
            parts[i] = fits[i]
            left -= fits[i] or 0


def memory_split(
    global_batch: int,
    weights: Sequence[float],
    fits: Sequence[int | None] | None = None,
    *,
    accumulate: bool = True,
    overheads: Sequence[float] | None = None,
) -> tuple[MicroSplit, ...]:
    """Every rank's :class:`MicroSplit` of ``global_batch`` (see the module docstring):
    proportional to ``weights`` (equal in step time with ``overheads``, each rank's
    fixed per-step cost in examples: :func:`~corral.sdk._weights.equal_time_batches`);
    ``fits`` (one per rank, None or 0: no limit) cap the micro-batch, with
    accumulation (default) or by moving the excess to other ranks."""
    world = len(weights)
    limits = [None if not f else int(f) for f in (fits or [None] * world)]
    if len(limits) != world:
        raise ValueError(f"{len(limits)} fits for {world} ranks: one per rank")
    if any(f is not None and f < 1 for f in limits):
        raise ValueError(f"fits must be positive (or 0/None: no limit), got {list(fits or [])}")
    if global_batch < world:
        raise ValueError(
            f"global batch {global_batch} is smaller than the world size {world}: "
            "every rank needs at least one example per step"
        )
    targets = equal_time_batches(global_batch, weights, overheads)
    sizes = (
        apportion(global_batch, targets) if accumulate else _capped(global_batch, targets, limits)
    )
    out = []
    for batch, fit in zip(sizes, limits, strict=True):
        parts = micro_sizes(batch, fit)
        out.append(MicroSplit(batch=batch, micro=parts[0], accumulation=len(parts)))
    return tuple(out)


def parse_fits(raw: str, world_size: int | None = None) -> tuple[int | None, ...]:
    """``CORRAL_MICRO_BATCH_FITS``'s entries (``0``: no limit -> None); ValueError
    naming the variable for a bad entry or a count other than ``world_size``."""
    fits: list[int | None] = []
    for position, part in enumerate(p.strip() for p in raw.split(",")):
        if not part.isdigit():
            raise ValueError(
                f"{MICRO_BATCH_FITS_ENV}={raw!r}: entry {position} ({part!r}) is not a "
                "whole number (0: no limit)"
            )
        fits.append(int(part) or None)
    if world_size is not None and len(fits) != world_size:
        raise ValueError(
            f"{MICRO_BATCH_FITS_ENV}={raw!r} has {len(fits)} entries for a world size of "
            f"{world_size}: one per global rank"
        )
    return tuple(fits)


def micro_batch_fits(env: Mapping[str, str] | None = None) -> tuple[int | None, ...] | None:
    """Every rank's largest micro-batch from the calibration (rank order; None in a
    place: no limit), or None when the job has none (nor in an in-place replica
    group, whose split is per group). Under torchrun they are matched to ranks through
    the process group, as the workload weights are."""
    e = os.environ if env is None else env
    raw = e.get(MICRO_BATCH_FITS_ENV, "").strip()
    if not raw or e.get(REPLICA_GROUP_ENV, "").strip():
        return None  # in-place (torchft) groups split by group, not by these ranks
    fits = parse_fits(raw)
    in_rank_order = plan_order_list([float(f or 0) for f in fits], e, MICRO_BATCH_FITS_ENV)
    return parse_fits(",".join(str(int(f)) for f in in_rank_order), len(in_rank_order))
