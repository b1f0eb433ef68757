"""Named section timings per rank: what the straggler scores are made of.

``with sdk.section("compute"): ...`` times the block; the next
:func:`corral.sdk.report` carries the mean seconds per section since the
previous report (``"sections": {"compute": 0.051}``), and corral scores every
rank against the others' median and its own best (see
:mod:`corral.diagnose.stragglers`). Sections whose name starts with ``wait``
are time spent waiting for other ranks: shown, never scored.

Cheap enough for every step of a fast GPU loop: entering and leaving a section
reads the clock and adds the timing to :data:`records`, the process's
timings and reports in call order (``deque.extend`` is atomic: no lock, no
syscall, and no object kept that the garbage collector would scan). Whoever
sends the reports (the SDK's reporter thread) or :func:`drain` adds them up
later, so each report still gets exactly the sections timed before it and after
the one before.

On a GPU (torch already imported, CUDA initialised) a section records a pair of
CUDA events on the current stream instead of reading a clock, and never
synchronises: the pair is read later (``Event.query()``, off the training
thread when the reporter sends), once the GPU has passed it; a pair the GPU
has not reached yet goes with a later report. Read events are reused.

:func:`straggler_hook` measures a DDP model without changing the training
loop: its communication hook times each rank's arrival at the gradient
all-reduce (``compute``: from the end of the previous all-reduce to this rank's
first bucket) and its wait there (``wait``: to the end of the last bucket).
The hook runs on the CPU, so on GPUs it sees when work was *issued*; use
sections there for GPU time.
"""

from __future__ import annotations

import collections
import math
import os
import sys
import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any

__all__ = [
    "MAX_PENDING",
    "MAX_SECTIONS",
    "Report",
    "drain",
    "records",
    "reports",
    "section",
    "straggler_hook",
]

#: CUDA event pairs kept for a later read at most (older ones are dropped).
MAX_PENDING = 4096
#: Distinct section names sent per report at most.
MAX_SECTIONS = 32
_MAX_NAME = 128
#: Records a section lets pile up before it adds them up itself (nobody drains them:
#: no reporter, e.g. outside corral).
_ABSORB_AT = 1 << 17
_POOL = 256  # read CUDA events kept for reuse

#: This process's section timings and reports, in call order, flat (each added by
#: one atomic ``extend``; no object the garbage collector tracks is kept per step):
#: ``name, nanoseconds`` (a CPU section), ``CUDA, name, start_event, end_event`` (a
#: CUDA section) and ``REPORT, step, total, monotonic_time, metrics``
#: (:func:`corral.sdk.report`).
records: collections.deque[Any] = collections.deque()
_extend = records.extend
#: The markers of a CUDA section and of a report in :data:`records`.
CUDA = object()
REPORT = object()

#: A report as :func:`reports` returns it: ``[step, total, time, metrics, sections]``,
#: ``sections`` the mean nanoseconds (an int) per section timed before it, or None.
Report = list[Any]

_perf_counter_ns = time.perf_counter_ns
_modules = sys.modules


class _Totals:
    """Adds up :data:`records` (one consumer at a time, under a lock): nanoseconds and
    counts per section since the last report, CUDA event pairs not read yet, and the
    reports met on the way with their sections."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sums: dict[str, int] = {}  # name -> nanoseconds
        self._counts: dict[str, int] = {}  # name -> count, only where more than 1
        self._pending: collections.deque[tuple[str, Any, Any]] = collections.deque(
            maxlen=MAX_PENDING
        )
        self._reports: list[Report] = []

    def _add(self, name: str, ns: int) -> None:
        total = self._sums.get(name)
        if total is None:
            if len(self._sums) < MAX_SECTIONS:
                self._sums[name] = ns
        else:
            self._sums[name] = total + ns
            self._counts[name] = self._counts.get(name, 1) + 1

    def _absorb(self) -> None:
        # the common step (one section, one report) allocates nothing here but the
        # report's sections dict: sums are plain ints, counts kept only above 1
        pop = records.popleft
        sums = self._sums
        reports = self._reports
        left = len(records)  # whole groups: each was added by one extend
        while left > 0:
            item = pop()
            if item is REPORT:
                left -= 5
                record = [pop(), pop(), pop(), pop(), None]
                if self._pending:
                    self._read_pending()
                if sums:
                    if self._counts:
                        for name, count in self._counts.items():
                            sums[name] //= count
                        self._counts = {}
                    record[4] = sums  # mean nanoseconds per section
                    sums = self._sums = {}
                reports.append(record)
            elif item is CUDA:
                left -= 4
                self._pending.append((pop(), pop(), pop()))
            else:  # a CPU section: its name, then nanoseconds (a clock difference: >= 0)
                left -= 2
                ns = pop()
                total = sums.get(item)
                if total is None:
                    if len(sums) < MAX_SECTIONS:
                        sums[item] = ns
                else:
                    sums[item] = total + ns
                    self._counts[item] = self._counts.get(item, 1) + 1

    def _read_pending(self) -> None:
        """Add the pairs the GPU has passed (in stream order: stop at the first not done)."""
        pending = self._pending
        while pending:
            name, start, end = pending[0]
            try:
                if not end.query():
                    return
                ns = float(start.elapsed_time(end)) * 1e6  # milliseconds
            except Exception:  # a broken context, an event of another device: drop it
                pending.popleft()
                continue
            pending.popleft()
            if math.isfinite(ns) and ns >= 0:
                self._add(name, int(ns))
            if len(_free_events) < _POOL:
                _free_events.extend((start, end))

    def _means(self) -> dict[str, float]:
        if self._pending:
            self._read_pending()
        if not self._sums:
            return {}
        (sums, self._sums), (counts, self._counts) = (self._sums, {}), (self._counts, {})
        return {name: total / counts.get(name, 1) / 1e9 for name, total in sums.items()}

    def drain(self) -> dict[str, float]:
        with self._lock:
            self._absorb()
            return self._means()

    def reports(self) -> list[Report]:
        with self._lock:
            self._absorb()
            taken, self._reports = self._reports, []
            return taken

    def absorb(self) -> None:
        if self._lock.acquire(blocking=False):  # else someone is at it already
            try:
                self._absorb()
            finally:
                self._lock.release()

    def forget(self) -> None:
        """In a forked child: the parent's records, events and lock are not ours."""
        self._lock = threading.Lock()
        self._sums = {}
        self._counts = {}
        self._pending.clear()
        self._reports = []


_totals = _Totals()
_free_events: list[Any] = []  # read CUDA events, recorded again by later sections


def drain() -> dict[str, float]:
    """The mean seconds per section since the last report (or call), sections whose
    GPU work is not done yet waiting for a later call; reports met on the way are
    kept for :func:`reports`."""
    return _totals.drain()


def reports() -> list[Report]:
    """The reports recorded since the last call, each with the mean nanoseconds per
    section timed before it (since the report before); what the reporter sends."""
    return _totals.reports()


def _forget_after_fork() -> None:
    global _cuda_event
    records.clear()
    _totals.forget()
    _free_events.clear()
    _cuda_event = None


os.register_at_fork(after_in_child=_forget_after_fork)

#: torch.cuda.Event once CUDA is known to be initialised in this process.
_cuda_event: Callable[..., Any] | None = None


def _cuda_events() -> Callable[..., Any] | None:
    """The CUDA event class when torch is imported and CUDA is initialised."""
    global _cuda_event
    if _cuda_event is not None:
        return _cuda_event
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    try:
        if not torch.cuda.is_initialized():  # initialised implies available
            return None
        _cuda_event = torch.cuda.Event
    except Exception:  # a broken CUDA setup: time on the CPU
        return None
    return _cuda_event


def _event(make: Callable[..., Any]) -> Any:
    try:
        return _free_events.pop()
    except IndexError:
        return make(enable_timing=True)


_known: set[str] = set()  # names checked already


def _check_name(name: object) -> str:
    if not isinstance(name, str) or not name or len(name) > _MAX_NAME:
        raise ValueError(f"section name must be a string of 1-{_MAX_NAME} characters: {name!r}")
    return name


class section:  # used as a function: ``with sdk.section("compute"):``
    """Time the block as section ``name`` of this rank (sent with the next report).

    ``cuda``: time GPU work with CUDA events (default: when torch has initialised
    CUDA in this process). Never synchronises the GPU and never raises from
    timing; a bad ``name`` is a ValueError. Also a decorator.
    """

    __slots__ = ("_cuda", "_start", "name")

    def __init__(self, name: str, *, cuda: bool | None = None) -> None:
        if name not in _known:
            _check_name(name)
            if len(_known) < 4096:
                _known.add(name)
        self.name = name
        self._cuda = cuda
        self._start: Any = None  # the CPU clock (int nanoseconds) or a CUDA event

    def __enter__(self) -> None:
        make = _cuda_event
        if make is None and "torch" in _modules:  # torch without CUDA (yet): ask it
            make = _cuda_events()
        if make is not None and self._cuda is not False:
            start = self._start = _event(make)
            start.record()
        else:
            self._start = _perf_counter_ns()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        start = self._start
        if start.__class__ is int:
            _extend((self.name, _perf_counter_ns() - start))
        else:
            end = _event(type(start))
            end.record()
            _extend((CUDA, self.name, start, end))
        if len(records) >= _ABSORB_AT:
            _totals.absorb()

    def __call__(self, func: Callable[..., Any]) -> Callable[..., Any]:
        """``@sdk.section("compute")``: time every call of ``func``."""
        import functools

        name, cuda = self.name, self._cuda

        @functools.wraps(func)
        def timed(*args: Any, **kwargs: Any) -> Any:
            with section(name, cuda=cuda):
                return func(*args, **kwargs)

        return timed


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
                    _extend((state.compute, int((now - state.last_done) * 1e9)))
        future = default_hooks.allreduce_hook(group, bucket)  # type: ignore[arg-type]  # None: WORLD
        if not bucket.is_last():
            return future

        def done(fut: Any) -> Any:
            finished = time.perf_counter()
            with state.lock:
                state.in_step = False
                _extend((state.wait, int((finished - state.arrived) * 1e9)))
                state.last_done = finished
            return fut.value()

        return future.then(done)

    # DDP checks the annotations against its own types; these are strings (PEP 563)
    hook.__annotations__ = {}
    model.register_comm_hook(None, hook)
    return model
