"""Ingest: a job's ``events.jsonl`` folded into the store, and the live wake-ups.

Every supervisor process appends its engine's events to the job's events file
(:mod:`corral.service.eventlog`); the server reads what is new every fraction of
a second, decodes each event once into its typed model
(:func:`corral.job.events.decode_event`) and folds it into the job's rows by type:
state, nodes, ranks, attempts, the result. Log lines stay in the file. A job
whose supervisor is gone without a result becomes ``lost`` (a ``lost`` event is
appended to its file). On start, :meth:`Ingest.reattach` goes on following the
jobs whose supervisor still runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from corral.job.events import (
    GPU_KEY,
    AttemptEnded,
    AttemptStarted,
    Finished,
    JobEvent,
    LaunchFailed,
    LogLines,
    Lost,
    NodeChanged,
    Progress,
    RankExited,
    StateChanged,
    decode_event,
)
from corral.job.states import (
    ACTIVE_STATES,
    JobState,
    NodeState,
    check_job_transition,
    state_values,
)
from corral.service.dispatch import alive
from corral.service.eventlog import (
    EVENTS_FILE,
    LoggedEvent,
    append_event,
    event_json,
    read_events,
)
from corral.service.jobrows import mirror
from corral.store import Store
from corral.store.models import Attempt, Event, Job, Node, Rank

log = logging.getLogger("corral.serve")

Observer = Callable[[Session, Job, JobEvent], None]
"""Told of each typed event once it is folded in, in the ingest's transaction (the
notifications, :meth:`corral.notify.Notifications.record`): it must be quick."""


class Live:
    """Wakes the readers waiting on a job (SSE streams) from any thread."""

    def __init__(self) -> None:
        self._waiters: dict[str, asyncio.Event] = {}
        self._loop: asyncio.AbstractEventLoop | None = None

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        """The event loop the readers wait on."""
        self._loop = loop

    def notify(self, job_id: str) -> None:
        """Wake the job's readers (safe from any thread)."""
        if self._loop is not None and not self._loop.is_closed():
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._wake, job_id)

    def _wake(self, job_id: str) -> None:
        waiter = self._waiters.pop(job_id, None)
        if waiter is not None:
            waiter.set()

    async def wait(self, job_id: str, timeout: float) -> None:
        """Until the job has news, or ``timeout`` seconds."""
        waiter = self._waiters.setdefault(job_id, asyncio.Event())
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(waiter.wait(), timeout)


class Ingest:
    """Folds the active jobs' new events into the store."""

    def __init__(self, store: Store, live: Live, observer: Observer | None = None) -> None:
        self.store = store
        self.live = live
        self.observer = observer
        self._lock = threading.Lock()  # the background round and a reader may both ask

    def active_ids(self) -> list[str]:
        """The jobs whose supervisor runs (or ran without a result yet)."""
        with self.store.session() as s:
            query = select(Job.id).where(Job.state.in_(state_values(ACTIVE_STATES)))
            return list(s.scalars(query).all())

    def reattach(self) -> dict[str, str]:
        """On start: follow every active job whose supervisor still runs; mark the
        others lost (after reading what they wrote). Job id -> what happened."""
        outcome: dict[str, str] = {}
        for job_id in self.active_ids():
            self.ingest(job_id)
            with self.store.session() as s:
                state = s.scalar(select(Job.state).where(Job.id == job_id))
            outcome[job_id] = "re-attached" if state in ACTIVE_STATES else str(state)
        return outcome

    def ingest(self, job_id: str) -> bool:
        """Apply the job's new events; True when it reached a final state now."""
        with self._lock:
            return self._ingest_locked(job_id)

    def catch_up(self, job_id: str) -> None:
        """Ingest an active job's events now, so what is read next includes all the
        supervisor wrote (the background round may be up to one interval behind)."""
        with self.store.session() as s:
            state = s.scalar(select(Job.state).where(Job.id == job_id))
        if state in ACTIVE_STATES:
            self.ingest(job_id)

    def _ingest_locked(self, job_id: str) -> bool:
        with self.store.session() as s:
            job = s.get(Job, job_id)
            if job is None or job.state not in ACTIVE_STATES:
                return False
            path = Path(job.run_dir) / EVENTS_FILE
            running = alive(job.supervisor_pid, job.supervisor_started)
            new = list(read_events(path, job.events_offset))
            names = machine_ids(job)
            for ev in new:
                event = apply(s, job, ev, names)
                job.events_offset = ev.next_pos
                if event is not None and self.observer is not None:
                    self.observer(s, job, event)
            gone = not running and job.supervisor_pid is not None
            if (
                job.state in ACTIVE_STATES
                and gone
                and not any(read_events(path, job.events_offset))
            ):
                lost = _lost(s, job, path)
                if self.observer is not None:
                    self.observer(s, job, lost)
            finished = job.state not in ACTIVE_STATES
        if new or finished:
            self.live.notify(job_id)
        return finished


def machine_ids(job: Job) -> dict[str, str]:
    """Host name -> machine id of the job's planned machines."""
    return {m["name"]: m["id"] for m in (job.plan or {}).get("machines", [])}


def _lost(s: Session, job: Job, path: Path) -> Lost:
    """The supervisor ended without a result: the job is lost (and says so in its
    events file, so a reader of the stream sees its end)."""
    job.state = check_job_transition(JobState(job.state), JobState.LOST).value
    job.reason = (
        f"the supervisor process (pid {job.supervisor_pid}) ended without reporting a "
        "result (killed, or the machine restarted)"
    )
    job.ended = time.time()
    job.root_cause = job.root_cause or {"message": job.reason}
    event = Lost(job_id=job.id, reason=job.reason)
    pos = append_event(path, event_json(event))
    s.add(
        Event(job_id=job.id, pos=pos, time=event.time, kind=event.kind, data={"reason": job.reason})
    )
    job.events_offset = path.stat().st_size if path.exists() else pos
    return event


def apply(s: Session, job: Job, ev: LoggedEvent, names: dict[str, str]) -> JobEvent | None:
    """Fold one event of the job's file into its rows (every event but the log lines
    is kept as an :class:`~corral.store.models.Event`, as written); the typed event
    (None for log lines and what is not understood)."""
    event = decode_event(ev.data, job.id)
    if isinstance(event, LogLines):
        return None
    if event is None:
        log.warning("job %s: event at byte %d not understood; kept as is", job.id, ev.pos)
    else:
        _fold(s, job, event, names)
    when = event.time if event is not None else float(ev.data.get("time") or time.time())
    s.add(
        Event(
            job_id=job.id,
            pos=ev.pos,
            time=when,
            kind=str(ev.data.get("kind", "")),
            data={k: v for k, v in ev.data.items() if k not in ("kind", "time")},
        )
    )
    return event


def _fold(s: Session, job: Job, event: JobEvent, names: dict[str, str]) -> None:
    match event:
        case StateChanged():
            # the final state is taken from the finished/error event that follows, so
            # the job stays active (and ingested) until its result is in
            if not event.state.terminal:
                mirror(job, event.state)
            job.reason = event.reason or job.reason or ""
            job.attempt = event.attempt or job.attempt
        case AttemptStarted():
            _attempt_started(s, job, event, names)
        case AttemptEnded():
            attempt = s.get(Attempt, (job.id, event.number))
            if attempt is not None:
                attempt.ended = event.time
                attempt.record = dict(event.record)
                attempt.restart = event.restart
                attempt.decision = event.decision
            if event.restart:
                job.restarts += 1
        case NodeChanged():
            node = s.get(Node, (job.id, event.host))
            if node is None:
                node = Node(
                    job_id=job.id,
                    host=event.host,
                    node_rank=0,
                    machine_id=names.get(event.host),
                    started=event.time,
                )
                s.add(node)
            node.state = event.state.value
            node.detail = event.detail
            if event.state.terminal:
                node.ended = event.time
        case Progress():
            _progress(s, job, event)
        case RankExited():
            rank = _rank(s, job, event.rank, event.host)
            rank.code = event.code
        case Finished():
            _finished(job, event)
        case LaunchFailed():
            mirror(job, JobState.FAILED)
            job.reason = event.message
            job.exit_code = event.exit_code or 3
            job.ended = event.time
            job.root_cause = {
                "type": event.type,
                "message": event.message,
                "details": event.details,
            }
        case _:
            # messages, the pre-flight report, stragglers, hang reports, a lost event:
            # kept as events only (the status and /metrics read them from there)
            pass


def _attempt_started(s: Session, job: Job, event: AttemptStarted, names: dict[str, str]) -> None:
    job.attempt = event.number
    s.merge(
        Attempt(
            job_id=job.id,
            number=event.number,
            started=event.time,
            hosts=list(event.hosts),
            world_size=event.world_size,
            checkpoint=event.checkpoint,
            record={},
            restart=False,
            decision="",
            workload_weights=list(event.workload_weights) or None,
        )
    )
    job.world_size = event.world_size or job.world_size
    s.execute(delete(Node).where(Node.job_id == job.id))
    for i, host in enumerate(event.hosts):
        s.add(
            Node(
                job_id=job.id,
                host=host,
                node_rank=i,
                machine_id=names.get(host),
                state=NodeState.STARTING.value,
                detail="",
                started=event.time,
            )
        )


RANK_STRIDE = 1_000_000
"""An in-place job's rank rows (``recovery: in-place``: each node is its own replica
group, and every group counts its ranks from 0) are keyed ``slot * RANK_STRIDE + rank``,
one slot per host, so that the groups' rank 0s are kept apart;
:func:`rank_number` gives the rank back."""


def rank_number(key: int) -> int:
    """The rank (as its host's group numbers it) of a rank row's key."""
    return key % RANK_STRIDE


def in_place(job: Job) -> bool:
    """Whether the job recovers in place (its replica groups number their ranks alone)."""
    return (job.request or {}).get("recovery") == "in-place"


_SLOTS: weakref.WeakKeyDictionary[Job, dict[str, int]] = weakref.WeakKeyDictionary()
"""An in-place job's host -> slot, read once per loaded row (an ingest round)."""


def _rank(s: Session, job: Job, number: int, host: str) -> Rank:
    key = number
    if in_place(job):
        slots = _SLOTS.get(job)
        if slots is None:
            rows = s.execute(select(Rank.rank, Rank.host).where(Rank.job_id == job.id)).all()
            slots = _SLOTS[job] = {where: k // RANK_STRIDE for k, where in rows}
        if host not in slots:
            slots[host] = max(slots.values(), default=-1) + 1
        key = slots[host] * RANK_STRIDE + number
    rank = s.get(Rank, (job.id, key))
    if rank is None:
        rank = Rank(job_id=job.id, rank=key, host=host, metrics={})
        s.add(rank)
    return rank


def _progress(s: Session, job: Job, event: Progress) -> None:
    rank = _rank(s, job, event.rank, event.host)
    when, step = event.time, event.step
    if step is not None and rank.step is not None and rank.updated and when > rank.updated:
        rate = (step - rank.step) / (when - rank.updated)
        if rate >= 0:  # smoothed
            old = rank.steps_per_s
            rank.steps_per_s = rate if old is None else 0.7 * rate + 0.3 * old
    if step is not None:
        rank.step = step
    if event.total is not None:
        rank.total = event.total
    rank.metrics = dict(event.metrics)
    if event.gpu:  # the rank's GPU sample rides with its metrics (GPU_KEY, not a metric)
        rank.metrics[GPU_KEY] = dict(event.gpu)
    rank.updated = when
    rank.host = event.host
    if event.rank == 0 or not job.last_metrics:
        job.last_metrics = {
            "rank": event.rank,
            "host": rank.host,
            "step": rank.step,
            "total": rank.total,
            "time": when,
            **{k: v for k, v in rank.metrics.items() if k != GPU_KEY},
        }


def _finished(job: Job, event: Finished) -> None:
    result: dict[str, Any] = event.result if isinstance(event.result, dict) else {}
    mirror(job, event.state)
    job.exit_code = event.exit_code
    job.ended = float(result.get("ended") or event.time)
    succeeded = event.state == JobState.SUCCEEDED
    job.reason = str(result.get("reason") or ("" if succeeded else job.reason))
    failures = result.get("failures") or []
    if failures:
        cause = dict(failures[0])
        cause["log_tail"] = log_tail(Path(job.run_dir), cause.get("host"), cause.get("rank"))
        job.root_cause = cause
    elif not succeeded:
        job.root_cause = {"message": job.reason}


def log_tail(directory: Path, host: Any, rank: Any, lines: int = 30) -> list[str]:
    """The last lines a failed rank printed (its traceback, usually)."""
    if host is None or rank is None:
        return []
    path = directory / "logs" / f"{host}.{rank}.log"
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - 16384))
            text = fh.read().decode("utf-8", "replace")
    except OSError:
        return []
    return text.splitlines()[-lines:]
