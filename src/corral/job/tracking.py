"""The job's side of ``--track``: its events as experiment-tracker records.

:func:`attach_tracking` subscribes a :class:`TrackingSubscriber` to a job (in
:func:`~corral.job.build.new_job`, so ``corral run`` and the server's supervisor
process track alike). The coordinator forwards what the ranks report
(``corral.sdk.report``), the ranks themselves know nothing of it:

- at the first attempt, the job's parameters (script, args, launcher, world size,
  hosts, ranks per node, owner, workload weights) open each tracker's run, named
  after the job's ``--name`` (its id when it has none);
- every :class:`~corral.job.events.Progress` gives its numeric metrics at its step
  (rank 0's under their own names, rank R's as ``rankR/NAME``), the rank's
  throughput (``throughput/rankR/steps_per_s``, and ``examples_per_s`` when it
  reports ``examples``; over :data:`THROUGHPUT_WINDOW` at least) and its GPU sample
  (``gpu/rankR/util``, ``mem_used_mib``);
- every attempt logs ``attempt`` and ``world_size`` (a restart shows on the chart);
- :class:`~corral.job.events.Finished` records the final state, and waits (a
  bounded time) for the trackers to write everything.

The trackers run on a background thread (:class:`~corral.track.forward.Forwarder`);
their errors come back as warning messages of the job, never as its failure.
"""

from __future__ import annotations

import getpass
import math
import shlex
from pathlib import Path
from typing import Any

from corral.job.engine import Job
from corral.job.events import AttemptStarted, Finished, JobEvent, Message, Progress
from corral.plan.spec import JobSpec
from corral.track.base import FinalState, ParamValue, Point, RunInfo
from corral.track.forward import Forwarder
from corral.track.targets import TrackPolicy

_GPU_KEYS = ("util", "mem_used_mib")
THROUGHPUT_WINDOW = 0.5
"""Seconds a rank's throughput is measured over at least (reports that arrive in a
burst, as the first ones of a rank do, make no rate of their own)."""


def _local_user() -> str | None:
    """The user this process runs as (None when the system cannot say)."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return None


def _number(value: Any) -> float | None:
    """``value`` as a finite float (None for anything else: text, bools, NaN, nested)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


class TrackingSubscriber:
    """Turns one job's events into tracker records (on the job's event loop, quickly)."""

    def __init__(
        self, job: Job, spec: JobSpec, forwarder: Forwarder, policy: TrackPolicy | None = None
    ) -> None:
        self.job = job
        self.spec = spec
        self.forwarder = forwarder
        self.name = policy.name if policy is not None else None
        self.owner = (policy.owner if policy is not None else None) or _local_user()
        self.started = False
        self.attempts = 0
        self.step = 0  # the highest step reported so far
        self._anchor: dict[int, tuple[float, int]] = {}  # rank -> (time, step) measured from
        self._examples: dict[int, float] = {}  # rank -> examples reported since its anchor
        self._reports: dict[int, int] = {}  # rank -> reports without a step so far

    def on_event(self, event: JobEvent) -> None:
        """Handle one event (the subscriber of ``Job.subscribe``)."""
        if isinstance(event, Progress):
            self.forwarder.log(self._points(event))
        elif isinstance(event, AttemptStarted):
            self._attempt(event)
        elif isinstance(event, Finished):
            self._finished(event)
        if not isinstance(event, Message):
            self._say_warnings()

    def _attempt(self, event: AttemptStarted) -> None:
        self.attempts += 1
        self._anchor.clear()
        self._examples.clear()
        if not self.started:
            self.started = True
            self.forwarder.start_run(
                RunInfo(
                    job_id=self.spec.job_id,
                    params=self._params(event),
                    job_dir=Path(self.spec.run_dir) / self.spec.job_id,
                    name=self.name,
                    owner=self.owner,
                )
            )
        self.forwarder.log(
            [
                Point("attempt", float(event.number), self.step, event.time),
                Point("world_size", float(event.world_size), self.step, event.time),
            ]
        )

    def _params(self, event: AttemptStarted) -> dict[str, ParamValue]:
        spec = self.spec
        params: dict[str, ParamValue] = {
            "job_id": spec.job_id,
            "script": spec.script,
            "args": shlex.join(spec.args),
            "launcher": event.launcher or spec.launcher,
            "world_size": event.world_size,
            "nnodes": len(event.hosts),
            "hosts": ",".join(event.hosts),
        }
        if self.name:
            params["name"] = self.name
        if self.owner:
            params["owner"] = self.owner
        nproc = self._nproc(event)
        if nproc is not None:
            params["nproc_per_node"] = nproc
        if event.workload_weights:
            params["workload_weights"] = ",".join(f"{w:g}" for w in event.workload_weights)
        if spec.checkpoint_dir:
            params["checkpoint_dir"] = spec.checkpoint_dir
        return params

    def _nproc(self, event: AttemptStarted) -> ParamValue | None:
        """The ranks per node: as asked, else each host's slots (one number when they
        are all alike, else one per host in node order)."""
        if self.spec.nproc_per_node is not None:
            return self.spec.nproc_per_node
        cluster = getattr(self.job, "cluster", None)
        slots = {h.name: h.slots for h in cluster.hosts} if cluster is not None else {}
        counts = [slots.get(host) for host in event.hosts]
        if not counts or None in counts:
            return None
        return counts[0] if len(set(counts)) == 1 else ",".join(map(str, counts))

    def _points(self, event: Progress) -> list[Point]:
        rank, now = event.rank, event.time
        if isinstance(event.step, int) and not isinstance(event.step, bool):
            step = event.step
        else:  # a report without a step: its count stands in
            step = self._reports[rank] = self._reports.get(rank, -1) + 1
        self.step = max(self.step, step)
        prefix = "" if rank == 0 else f"rank{rank}/"
        points = [
            Point(f"{prefix}{name}", value, step, now)
            for name, raw in event.metrics.items()
            if (value := _number(raw)) is not None
        ]
        points.extend(self._throughput(rank, step, now, _number(event.metrics.get("examples"))))
        for key in _GPU_KEYS:
            value = _number((event.gpu or {}).get(key))
            if value is not None:
                points.append(Point(f"gpu/rank{rank}/{key}", value, step, now))
        return points

    def _throughput(self, rank: int, step: int, now: float, examples: float | None) -> list[Point]:
        """The rank's steps/s (and examples/s) since its anchor, once a window has passed."""
        anchor = self._anchor.get(rank)
        if anchor is None:
            self._anchor[rank] = (now, step)
            return []
        if examples is not None:
            self._examples[rank] = self._examples.get(rank, 0.0) + examples
        elapsed = now - anchor[0]
        if elapsed < THROUGHPUT_WINDOW:
            return []
        self._anchor[rank] = (now, step)
        points = []
        if step > anchor[1]:
            rate = (step - anchor[1]) / elapsed
            points.append(Point(f"throughput/rank{rank}/steps_per_s", rate, step, now))
        if rank in self._examples:
            rate = self._examples.pop(rank) / elapsed
            points.append(Point(f"throughput/rank{rank}/examples_per_s", rate, step, now))
        return points

    def _finished(self, event: Finished) -> None:
        if self.started:
            result = event.result
            summary: dict[str, ParamValue] = {}
            cause = getattr(result, "root_cause", None)
            if cause is not None:
                where = cause.host if cause.rank is None else f"{cause.host} rank {cause.rank}"
                summary["root_cause"] = f"{where}: {cause.message}"
            self.forwarder.finish(
                FinalState(
                    state=event.state.value,
                    exit_code=event.exit_code,
                    attempts=max(self.attempts, len(getattr(result, "attempts", []) or [])),
                    reason=str(getattr(result, "reason", "") or ""),
                    summary=summary,
                )
            )
        self.forwarder.close()

    def _say_warnings(self) -> None:
        """The forwarder's warnings as the job's warning messages (before this event
        reaches the later subscribers: this one is subscribed first)."""
        for text in self.forwarder.warnings():
            self.job.emit(Message(job_id=self.job.job_id, text=text, level="warning"))


def attach_tracking(job: Job, spec: JobSpec, policy: TrackPolicy) -> Forwarder | None:
    """Forward ``job``'s reports to the trackers of ``policy`` (None: none asked)."""
    if not policy.track:
        return None
    forwarder = Forwarder(policy.targets)
    job.subscribe(TrackingSubscriber(job, spec, forwarder, policy).on_event)
    return forwarder
