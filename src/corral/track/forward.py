"""The forwarding thread: the job's event loop hands records over without waiting.

:class:`Forwarder` owns the trackers of one job and a background thread that
calls them. :meth:`Forwarder.log` only puts the points on a bounded queue (a full
queue drops points and says so once: a slow tracker never slows the job);
:meth:`Forwarder.start_run` and :meth:`Forwarder.finish` are never dropped (they
wait, a bounded time, for room); the thread drains
the queue in batches. A tracker that raises is dropped with one warning line
(:meth:`Forwarder.warnings`); the job goes on. :meth:`Forwarder.close` waits, a
bounded time, for everything queued to be written (the job's end).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from corral.track.base import FinalState, Point, RunInfo, Tracker
from corral.track.targets import TrackTarget

QUEUE_SIZE = 10_000
"""Records (a batch of points is one) waiting for the thread at most."""
BATCH = 2_000
"""Points handed to a tracker in one call at most."""
FLUSH_TIMEOUT = 30.0
"""Seconds :meth:`Forwarder.close` waits for the trackers at the job's end."""


def open_tracker(target: TrackTarget) -> Tracker:
    """The backend of ``target`` (its package imported here, on first use)."""
    if target.backend == "mlflow":
        from corral.track.mlflow import MlflowTracker

        return MlflowTracker(target)
    if target.backend == "tensorboard":
        from corral.track.tensorboard import TensorBoardTracker

        return TensorBoardTracker(target)
    from corral.track.wandb import WandbTracker

    return WandbTracker(target)


@dataclass(frozen=True)
class _Stop:
    """The last record: the thread ends after it."""


_Record = RunInfo | list[Point] | FinalState | _Stop


class Forwarder:
    """The trackers of one job, fed from a background thread."""

    def __init__(
        self,
        targets: Sequence[TrackTarget],
        *,
        opener: Callable[[TrackTarget], Tracker] = open_tracker,
        queue_size: int = QUEUE_SIZE,
    ) -> None:
        self.targets = tuple(targets)
        self._opener = opener
        self._queue: queue.Queue[_Record] = queue.Queue(maxsize=queue_size)
        self._warnings: queue.SimpleQueue[str] = queue.SimpleQueue()
        self._trackers: list[Tracker] = []
        self._dropped = 0
        self._closed = False
        self._thread = threading.Thread(target=self._work, name="corral-track", daemon=True)
        self._thread.start()

    # -- the event loop's side (never blocks) ----------------------------------------------

    def start_run(self, run: RunInfo) -> None:
        """Open every tracker's run with the job's parameters."""
        self._put(run)

    def log(self, points: list[Point]) -> None:
        """Queue metric points."""
        if points:
            self._put(points)

    def finish(self, final: FinalState) -> None:
        """Queue the final state; the thread ends every run after it."""
        self._put(final)
        self._put(_Stop())

    def warnings(self) -> list[str]:
        """The warning lines since the last call (trackers that failed, dropped points)."""
        lines: list[str] = []
        while True:
            try:
                lines.append(self._warnings.get_nowait())
            except queue.Empty:
                return lines

    def close(self, timeout: float = FLUSH_TIMEOUT) -> bool:
        """Stop after what is queued and wait up to ``timeout`` seconds for the trackers
        to write it; False (and a warning) when they did not finish in time."""
        if not self._closed:
            self._put(_Stop())
        self._thread.join(timeout)
        if self._thread.is_alive():
            self._warnings.put(
                f"tracking: the trackers did not finish writing within {timeout:g} s; "
                "what is left is not recorded"
            )
            return False
        return True

    def _put(self, record: _Record) -> None:
        if self._closed:
            return
        if not isinstance(record, list):  # never dropped: wait for room (a bounded time)
            self._closed = isinstance(record, _Stop)
            try:
                self._queue.put(record, timeout=FLUSH_TIMEOUT)
            except queue.Full:
                self._closed = True
                self._warnings.put("tracking: the trackers are stuck; they record nothing more")
            return
        try:
            self._queue.put_nowait(record)
        except queue.Full:
            if self._dropped == 0:
                self._warnings.put(
                    "tracking: the trackers fall behind; metric points are dropped "
                    "until they catch up"
                )
            self._dropped += 1

    # -- the thread ------------------------------------------------------------------------

    def _work(self) -> None:
        for target in self.targets:
            try:
                self._trackers.append(self._opener(target))
            except Exception as exc:  # a tracker's error is a warning
                self._warn(target, "could not be opened", exc)
        pending: _Record | None = None
        while True:
            record = pending if pending is not None else self._queue.get()
            pending = None
            if isinstance(record, _Stop):
                return
            if isinstance(record, RunInfo | FinalState):
                self._handle(record)
            else:
                batch = list(record)
                while len(batch) < BATCH:  # the point batches right behind it: one call
                    try:
                        more = self._queue.get_nowait()
                    except queue.Empty:
                        break
                    if not isinstance(more, list):
                        pending = more  # handled after this batch
                        break
                    batch.extend(more)
                for i in range(0, len(batch), BATCH):
                    self._log(batch[i : i + BATCH])

    def _handle(self, record: RunInfo | FinalState) -> None:
        if isinstance(record, RunInfo):
            self._each("could not start its run", lambda t: t.start(record))
        else:
            self._each("could not record the end", lambda t: t.finish(record))

    def _log(self, points: list[Point]) -> None:
        self._each("could not log metrics", lambda t: t.log(points))

    def _each(self, what: str, call: Callable[[Tracker], None]) -> None:
        for tracker in list(self._trackers):
            try:
                call(tracker)
            except Exception as exc:  # a tracker's error is a warning
                self._trackers.remove(tracker)
                self._warn(tracker.target, what, exc)

    def _warn(self, target: TrackTarget, what: str, exc: BaseException) -> None:
        text = " ".join(str(exc).split())[:300] or type(exc).__name__
        self._warnings.put(
            f"tracking: {target.backend} ({target.where}) {what}: {text}; "
            "it records nothing more for this job"
        )
