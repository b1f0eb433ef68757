"""Named section timings per rank: what the straggler scores are made of.

``with sdk.section("compute"): ...`` adds the section's duration to this
process's totals; the next :func:`corral.sdk.report` sends the mean seconds
per section since the previous report (``"sections": {"compute": 0.051}``),
and corral scores every rank against the others' median and its own best (see
:mod:`corral.diagnose.stragglers`). Sections whose name starts with ``wait``
are time spent waiting for other ranks: shown, never scored.

On a GPU (torch already imported, CUDA initialised) a section records a pair of
CUDA events on the current stream instead of reading a clock, and never
synchronises: the pair is read by a later report once the GPU has passed it
(``Event.query()``), so a step's GPU time arrives a report or so later.

:func:`straggler_hook` measures a DDP model without changing the training
loop: its communication hook times each rank's arrival at the gradient
all-reduce (``compute``: from the end of the previous all-reduce to this rank's
first bucket) and its wait there (``wait``: to the end of the last bucket).
The hook runs on the CPU, so on GPUs it sees when work was *issued*; use
sections there for GPU time.
"""

from __future__ import annotations

import collections
import contextlib
import math
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["MAX_PENDING", "MAX_SECTIONS", "drain", "section", "straggler_hook"]

#: CUDA event pairs kept for a later read at most (older ones are dropped).
MAX_PENDING = 4096
#: Distinct section names sent per report at most.
MAX_SECTIONS = 32
_MAX_NAME = 128


class _Totals:
    """Seconds and counts per section since the last :meth:`drain`, plus CUDA event
    pairs not read yet; shared by every thread of the process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sums: dict[str, list[float]] = {}
        self._pending: collections.deque[tuple[str, Any, Any]] = collections.deque(
            maxlen=MAX_PENDING
        )

    def add(self, name: str, seconds: float) -> None:
        if not math.isfinite(seconds) or seconds < 0:
            return
        with self._lock:
            entry = self._sums.get(name)
            if entry is None:
                if len(self._sums) >= MAX_SECTIONS:
                    return
                entry = self._sums[name] = [0.0, 0.0]
            entry[0] += seconds
            entry[1] += 1

    def pend(self, name: str, start: Any, end: Any) -> None:
        with self._lock:
            self._pending.append((name, start, end))

    def drain(self) -> dict[str, float]:
        with self._lock:
            pending = list(self._pending)
            self._pending.clear()
        later = []
        for index, (name, start, end) in enumerate(pending):
            try:
                ready = bool(end.query())
            except Exception:  # a broken context: drop the pair
                continue
            if not ready:  # in stream order: the later pairs are not done either
                later = pending[index:]
                break
            try:
                self.add(name, float(start.elapsed_time(end)) / 1000.0)
            except Exception:  # e.g. an event recorded on another device
                continue
        with self._lock:
            self._pending.extendleft(reversed(later))
            sums, self._sums = self._sums, {}
        return {name: total / count for name, (total, count) in sums.items() if count}


_totals = _Totals()


def drain() -> dict[str, float]:
    """The mean seconds per section since the last call (sections whose GPU work is
    not done yet wait for a later call); what :func:`corral.sdk.report` sends."""
    return _totals.drain()


def _cuda_events() -> Callable[[], Any] | None:
    """A maker of timing CUDA events when torch is imported and CUDA is initialised."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    try:
        if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
            return None
    except Exception:  # a broken CUDA setup: time on the CPU
        return None
    return lambda: torch.cuda.Event(enable_timing=True)


def _check_name(name: object) -> str:
    if not isinstance(name, str) or not name or len(name) > _MAX_NAME:
        raise ValueError(f"section name must be a string of 1-{_MAX_NAME} characters: {name!r}")
    return name


@contextlib.contextmanager
def section(name: str, *, cuda: bool | None = None) -> Iterator[None]:
    """Time the block as section ``name`` of this rank (sent with the next report).

    ``cuda``: time GPU work with CUDA events (default: when torch has initialised
    CUDA in this process). Never synchronises the GPU and never raises from
    timing; a bad ``name`` is a ValueError.
    """
    _check_name(name)
    make = _cuda_events() if cuda is not False else None
    if make is not None:
        start = make()
        start.record()
        try:
            yield
        finally:
            end = make()
            end.record()
            _totals.pend(name, start, end)
        return
    began = time.perf_counter()
    try:
        yield
    finally:
        _totals.add(name, time.perf_counter() - began)


class _HookState:
    """Per-model timestamps of the DDP hook (the future's callback runs on another
    thread, so under a lock)."""

    def __init__(self, compute: str, wait: str) -> None:
        self.compute = compute
        self.wait = wait
        self.lock = threading.Lock()
        self.in_step = False
        self.arrived = 0.0
        self.last_done: float | None = None


def straggler_hook(model: Any, *, compute: str = "compute", wait: str = "wait") -> Any:
    """Register a communication hook on a ``DistributedDataParallel`` model that
    times, per step, this rank's ``compute`` (end of the previous all-reduce to its
    first gradient bucket) and ``wait`` (first bucket to the end of the last one),
    then all-reduces as DDP's default does. Returns ``model``.

    Call it once, after wrapping the model and before the first backward; it
    replaces no other hook (DDP allows one).
    """
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    _check_name(compute)
    _check_name(wait)
    state = _HookState(compute, wait)
    group = getattr(model, "process_group", None)

    def hook(_: object, bucket: Any) -> Any:
        now = time.perf_counter()
        with state.lock:
            if not state.in_step:
                state.in_step = True
                state.arrived = now
                if state.last_done is not None:
                    _totals.add(state.compute, now - state.last_done)
        future = default_hooks.allreduce_hook(group, bucket)  # type: ignore[arg-type]  # None: WORLD
        if not bucket.is_last():
            return future

        def done(fut: Any) -> Any:
            finished = time.perf_counter()
            with state.lock:
                state.in_step = False
                _totals.add(state.wait, finished - state.arrived)
                state.last_done = finished
            return fut.value()

        return future.then(done)

    # DDP checks the annotations against its own types; these are strings (PEP 563)
    hook.__annotations__ = {}
    model.register_comm_hook(None, hook)
    return model
