"""The queue of ``corral serve``: queued jobs, their order, why each waits, and the
scheduler that starts them.

Queuing a task, or a job request (``POST /api/jobs/queue``, ``corral job submit
--queue``), creates a job in state ``queued`` owned by the user who queued it, with a
priority. The queue's order is higher priority first, then first in first out; an
admin may reorder it (:meth:`JobQueue.move`). A user may have at most
``--max-queued`` jobs queued (their own cap: ``corral serve user limit NAME
--queued N``); one more is a 429 naming the cap.

The scheduler walks the queue in that order and starts each job as soon as enough
machines are free: it plans it (machine selection as for ``/distributed/plan``, busy
machines excluded) and dispatches it. The first job that must wait for machines (the
queue's *head*) holds every job after it (nothing overtakes it); a job whose owner is
at their limit of running jobs or machines waits without holding the others. A queued
job that can never run (more machines than are registered or than its owner's limit,
a machine that was removed) fails with the reason instead of blocking the queue; a
request that could never run is refused (409) instead of queued. Secret env values
of a queued request are kept in memory only: a server restart fails such a job.

What it costs: a round reads the queue from its start only up to its head (an index
range, in small chunks), skipping the owners at their limit in the query itself, and
writes only what changed (a job started or failed, the head's reason when it is not
what is stored). Why a job waits is computed when it is read (:meth:`JobQueue.reason`):
its owner's limit, else behind the head, else what was found when it was queued or
tried; its position is a count over the queue's index. Enqueuing counts the owner's
queued jobs and the jobs ahead over indexes, never loading the queue.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from sqlalchemy import ColumnElement, and_, func, or_, select

from corral.errors import Conflict, CorralError, Invalid, NotFound, TooMany
from corral.job.ids import new_job_id
from corral.job.states import JobState
from corral.service.audit import record_change
from corral.service.chain import after_of
from corral.service.jobs import JobManager
from corral.service.machines import ACTIVE_STATES
from corral.service.models import JobRequest, QueuedOut, QueueEntry, QueueMove
from corral.service.planner import has_secrets, stored_request
from corral.service.queries import display_name
from corral.service.users import UserService
from corral.store import Store
from corral.store.models import Job, Machine
from corral.words import plural

QUEUED = JobState.QUEUED.value
ORDER = (Job.priority.desc(), Job.queued, Job.created, Job.id)
"""The queue's order (the columns of the index ``ix_jobs_queue``)."""
CHUNK = 32
"""Queued jobs a scheduler round reads at a time (it usually stops at the first)."""
QUIET_WAIT = 8.0
"""Seconds at most between scheduler rounds while they change nothing."""
TRANSIENT = ("busy with", "offline", "never health-checked")
"""Why a selected machine cannot take a job *now*: a queued job waits these out."""

Key = tuple[int, float, float, str]


def queue_key(job: Job) -> Key:
    """The job's place in the queue's order (smaller: earlier)."""
    return (-(job.priority or 0), job.queued or 0.0, job.created or 0.0, job.id)


def _ordered(key: Key, *, before: bool) -> ColumnElement[bool]:
    """Queued jobs strictly before (or after) ``key`` in the queue's order."""
    priority, queued, created, job_id = -key[0], key[1], key[2], key[3]
    if before:
        return or_(
            Job.priority > priority,
            and_(
                Job.priority == priority,
                or_(
                    Job.queued < queued,
                    and_(
                        Job.queued == queued,
                        or_(Job.created < created, and_(Job.created == created, Job.id < job_id)),
                    ),
                ),
            ),
        )
    return or_(
        Job.priority < priority,
        and_(
            Job.priority == priority,
            or_(
                Job.queued > queued,
                and_(
                    Job.queued == queued,
                    or_(Job.created > created, and_(Job.created == created, Job.id > job_id)),
                ),
            ),
        ),
    )


def machines_of(job: Job) -> int:
    """How many machines a queued job asks for."""
    request = job.request or {}
    selected = request.get("selected_machines") or []
    if request.get("machine_selection") == "manual" and selected:
        return len(selected)
    return int((request.get("resource_requirements") or {}).get("num_machines") or 1)


def request_machines(request: JobRequest) -> int:
    """How many machines a request asks for."""
    if request.machine_selection == "manual" and request.selected_machines:
        return len(request.selected_machines)
    return request.resource_requirements.num_machines


@dataclass
class Usage:
    """One user's limits and what their active jobs hold now."""

    max_jobs: int | None
    max_machines: int | None
    jobs: int = 0
    held: int = 0

    def wait_reason(self, owner: str, machines: int) -> str:
        """Why their job of ``machines`` machines waits for their own jobs to end
        (``alice has 2 running, limit 2``); empty when it need not."""
        if self.max_jobs is not None and self.jobs >= self.max_jobs:
            return f"{owner} has {self.jobs} running, limit {self.max_jobs}"
        if self.max_machines is not None and self.held + machines > self.max_machines:
            return (
                f"{owner}'s running jobs hold {plural(self.held, 'machine')}, limit "
                f"{self.max_machines} (this job needs {machines})"
            )
        return ""

    def never(self, owner: str, machines: int) -> str:
        """Why their job of ``machines`` machines can never run; empty when it can."""
        if self.max_machines is not None and machines > self.max_machines:
            needs = plural(machines, "machine")
            return f"it needs {needs} and {owner}'s limit is {self.max_machines}"
        return ""

    @property
    def full(self) -> bool:
        """Whether no job of theirs can start now."""
        return (self.max_jobs is not None and self.jobs >= self.max_jobs) or (
            self.max_machines is not None and self.held >= self.max_machines
        )


class JobQueue:
    """The queued jobs, their order and reasons, and the scheduler."""

    def __init__(self, store: Store, jobs: JobManager, users: UserService) -> None:
        self.store = store
        self.jobs = jobs
        self.users = users
        self.max_queued = jobs.settings.max_queued
        self._wake = threading.Event()
        self._requests: dict[str, JobRequest] = {}  # queued requests with secret values
        self._head: tuple[str, Key] | None = None  # the job the queue waits for
        self.quiet = False  # whether the last round changed nothing
        jobs.on_finished.append(lambda _job_id: self._wake.set())
        jobs.queries.queued_reason = self.reason

    # -- limits --------------------------------------------------------------------------

    def usage(self, owners: Iterable[str | None] | None = None) -> dict[str, Usage]:
        """The limits and active jobs of the users that have a limit (of ``owners``
        only, when given)."""
        limits = self.users.all_limits()
        if owners is not None:
            wanted = set(owners)
            limits = {name: lim for name, lim in limits.items() if name in wanted}
        out = {name: Usage(jobs, machines) for name, (jobs, machines) in limits.items()}
        if not out:
            return out
        with self.store.session() as s:
            rows = s.execute(
                select(Job.owner, Job.machine_ids).where(
                    Job.owner.in_(list(out)), Job.state.in_(ACTIVE_STATES)
                )
            ).all()
        for owner, ids in rows:
            out[owner].jobs += 1
            out[owner].held += len(ids or ())
        return out

    def limit_reason(self, owner: str | None, machines: int) -> str:
        """Why ``owner``'s job of ``machines`` machines must wait for their own jobs to
        end; empty when it need not."""
        usage = self.usage([owner]).get(owner) if owner else None
        return usage.wait_reason(owner, machines) if usage and owner else ""

    def check_limit(self, owner: str | None, machines: int) -> None:
        """Conflict when ``owner`` may not start a job of ``machines`` machines now."""
        usage = self.usage([owner]).get(owner) if owner else None
        if usage is None or owner is None:
            return
        reason = usage.never(owner, machines) or usage.wait_reason(owner, machines)
        if reason:
            raise Conflict(reason, details={"owner": owner, "limit": True})

    def _check_cap(self, owner: str | None) -> None:
        """TooMany (429) when ``owner`` has as many jobs queued as they may."""
        cap = self.users.queued_cap(owner, self.max_queued)
        if cap is None or owner is None:
            return
        with self.store.session() as s:
            queued = s.scalar(
                select(func.count()).select_from(Job).where(Job.owner == owner, Job.state == QUEUED)
            )
        if (queued or 0) >= cap:
            raise TooMany(
                f"{owner} has {plural(int(queued or 0), 'job')} queued, the limit is {cap} per "
                f"user: wait for some to start, or ask an admin (corral serve user limit "
                f"{owner} --queued N)",
                details={"owner": owner, "queued": int(queued or 0), "limit": cap},
            )

    # -- queuing -------------------------------------------------------------------------

    def enqueue(
        self,
        request: JobRequest,
        *,
        kind: str = "distributed",
        task_id: str | None = None,
        owner: str | None = None,
        priority: int = 0,
        probe: bool = True,
        resubmitted: str | None = None,
    ) -> QueuedOut:
        """Queue ``owner``'s job (audited as their change; ``resubmitted``: the job it
        is submitted again from, a ``job.resubmit``). ``probe``: try to select
        its machines now, so that its reason says what it waits for and a request
        that could never run, even with every machine free, is refused (Conflict); one
        ``owner`` may not run at all is Forbidden (:mod:`corral.service.trust`)."""
        self.jobs.planning.admit(request, owner)
        self.jobs.chain.check(request)  # the jobs it is to start after exist, may succeed
        machines = request_machines(request)
        usage = self.usage([owner]) if owner else {}
        never = usage[owner].never(owner, machines) if owner in usage and owner else ""
        if never:
            raise Conflict(never, details={"owner": owner, "limit": True})
        self._check_cap(owner)
        reason = ""
        if probe and not after_of(request):  # one that waits for jobs is tried then
            try:
                self.jobs.select(request, owner=owner)
            except Conflict as exc:
                if self._never(request, exc):
                    raise
                reason = waiting_reason(request, exc)
        now = time.time()
        job = Job(
            id=new_job_id(),
            kind=kind,
            state=QUEUED,
            reason=reason,
            request=stored_request(request),
            plan={},
            machine_ids=[],
            task_id=task_id,
            created=now,
            queued=now,
            run_dir="",
            owner=owner,
            priority=priority,
        )
        with self.store.session() as s:
            s.add(job)
            s.flush()
            after = {"priority": priority, "owner": owner, "task_id": task_id, "kind": kind}
            action = "job.queue"
            if resubmitted is not None:
                action, after["from"] = "job.resubmit", resubmitted
            record_change(s, owner or "server", action, job.id, after=after)
        if has_secrets(request):
            self._requests[job.id] = request
        self._wake.set()
        return QueuedOut(
            job_id=job.id,
            task_id=task_id,
            status=QUEUED,
            position=self.position(job),
            reason=self.reason(job, usage),
            priority=priority,
            owner=owner,
        )

    # -- reading -------------------------------------------------------------------------

    def position(self, job: Job) -> int:
        """How many queued jobs are ahead of ``job`` (a count over the queue's index)."""
        with self.store.session() as s:
            ahead = s.scalar(
                select(func.count())
                .select_from(Job)
                .where(Job.state == QUEUED, _ordered(queue_key(job), before=True))
            )
        return int(ahead or 0)

    def reason(self, job: Job, usage: dict[str, Usage] | None = None) -> str:
        """Why the queued ``job`` waits, now: its owner's limit; else the job the queue
        waits for, when that is ahead of it; else what was found when it was queued or
        last tried. ``usage``: :meth:`usage` of its owner, when already read. A job
        that starts after others waits for them first (:mod:`corral.service.chain`)."""
        after = self.jobs.chain.reason(job)
        if after:
            return after
        if job.owner:
            if usage is None:
                usage = self.usage([job.owner])
            mine = usage.get(job.owner)
            limited = mine.wait_reason(job.owner, machines_of(job)) if mine else ""
            if limited:
                return limited
        head = self._head
        if head is not None and head[0] != job.id and queue_key(job) > head[1]:
            return f"waiting behind job {head[0]} (queued first)"
        return job.reason or ""

    def entries(self, limit: int | None = None, offset: int = 0) -> list[QueueEntry]:
        """The queue in its order from ``offset`` (``limit`` jobs; None: all), with
        what each job waits for."""
        with self.store.session() as s:
            query = select(Job).where(Job.state == QUEUED).order_by(*ORDER).offset(offset)
            rows = list(s.scalars(query if limit is None else query.limit(limit)).all())
        usage = self.usage({job.owner for job in rows})
        return [self._entry(job, offset + index, usage) for index, job in enumerate(rows)]

    def _entry(self, job: Job, position: int, usage: dict[str, Usage]) -> QueueEntry:
        return QueueEntry(
            position=position,
            job_id=job.id,
            name=display_name(job, None),
            owner=job.owner,
            priority=job.priority or 0,
            queued=job.queued,
            machines=machines_of(job),
            reason=self.reason(job, usage),
        )

    def move(self, job_id: str, body: QueueMove, *, by: str) -> QueueEntry:
        """Give a queued job a new priority (``top``: one above every other queued
        job); audited as ``by``'s change, with the priority before and after."""
        if body.top == (body.priority is not None):
            raise Invalid("give either a priority or top", details={"field": "priority"})
        with self.store.session() as s:
            row = s.get(Job, job_id)
            if row is None:
                raise NotFound(f"no job {job_id!r}", details={"job_id": job_id})
            if row.state != QUEUED:
                raise Conflict(
                    f"job {job_id} is {row.state}, not queued: only a queued job can be moved",
                    details={"job_id": job_id, "state": row.state},
                )
            before = row.priority or 0
            priority = body.priority
            if priority is None:
                highest = s.scalar(
                    select(func.max(Job.priority)).where(Job.state == QUEUED, Job.id != job_id)
                )
                priority = before if highest is None else int(highest) + 1
            row.priority = priority
            was, now = {"priority": before}, {"priority": priority}
            record_change(s, by, "queue.move", job_id, before=was, after=now)
        self._wake.set()
        return self._entry(row, self.position(row), self.usage([row.owner]))

    # -- the scheduler -------------------------------------------------------------------

    def _walk(self, skip: list[str]) -> Iterator[Job]:
        """The queued jobs in the queue's order, but those of the owners ``skip``, read
        a chunk at a time (each in its own short session)."""
        after: Key | None = None
        while True:
            query = select(Job).where(Job.state == QUEUED)
            if skip:
                query = query.where(or_(Job.owner.is_(None), Job.owner.not_in(skip)))
            if after is not None:
                query = query.where(_ordered(after, before=False))
            with self.store.session() as s:
                rows = list(s.scalars(query.order_by(*ORDER).limit(CHUNK)).all())
            yield from rows
            if len(rows) < CHUNK:
                return
            after = queue_key(rows[-1])

    def schedule_once(self) -> list[str]:
        """Start queued jobs in the queue's order while machines are free; the ids
        started. A job whose owner is at their limit waits without holding the others;
        the first job that waits for machines holds every job after it."""
        started: list[str] = []
        usage = self.usage()
        head: Job | None = None
        changed = False  # anything written (a job started, failed, a reason)
        for job in self._walk([name for name, u in usage.items() if u.full]):
            machines = machines_of(job)
            if after_of(job.request):  # it starts after others: it waits, holding nobody
                never = self.jobs.chain.broken(job)
                if never:
                    self.jobs.chain.cancel(job.id, f"not started: {never}")
                    changed = True
                if never or self.jobs.chain.reason(job):
                    continue
            mine = usage.get(job.owner) if job.owner else None
            if mine is not None and job.owner:
                never = mine.never(job.owner, machines)
                if never:
                    self._fail(job.id, never)
                    changed = True
                    continue
                if mine.wait_reason(job.owner, machines):
                    continue
            planned = False
            request: JobRequest | None = None
            try:
                request = self._request_of(job)
                self.jobs.plan(request, kind=job.kind, task_id=job.task_id, job_id=job.id)
                planned = True
                self.jobs.start(self.jobs.row(job.id))
            except Conflict as exc:
                assert request is not None  # _request_of raises Invalid, never Conflict
                if self._never(request, exc):
                    self._fail(job.id, str(exc))
                    changed = True
                    continue
                changed |= self._wait(job, waiting_reason(request, exc), planned)
                head = job
                break
            except (CorralError, ValueError) as exc:
                self._fail(job.id, str(exc))
                changed = True
                continue
            self._requests.pop(job.id, None)
            before = {"state": QUEUED, "priority": job.priority}
            self.jobs.audit("scheduler", "job.dispatch", job.id, before=before)
            started.append(job.id)
            if mine is not None:
                mine.jobs, mine.held = mine.jobs + 1, mine.held + machines
        new_head = (head.id, queue_key(head)) if head is not None else None
        self.quiet = not (changed or started) and new_head == self._head
        self._head = new_head
        return started

    def _wait(self, job: Job, reason: str, planned: bool) -> bool:
        """The job stays queued with ``reason``: written only when it changed (or the
        job was planned before its machines turned out busy); whether it was."""
        if planned:
            self.jobs._set(job.id, state=QUEUED, reason=reason)
        elif reason != (job.reason or ""):
            self.jobs._set(job.id, reason=reason)
        else:
            return False
        return True

    def _fail(self, job_id: str, why: str) -> None:
        """A queued job that can never run fails with the reason."""
        self._requests.pop(job_id, None)
        self.jobs._set(
            job_id,
            state=JobState.FAILED.value,
            reason=f"cannot run: {why}",
            ended=time.time(),
            root_cause={"message": why},
        )
        self.jobs.chain.ended(job_id)  # the jobs that were to start after it

    def _request_of(self, job: Job) -> JobRequest:
        """The queued job's request: as stored, or with its secret values from memory
        (Invalid when the server restarted since and has lost them)."""
        request = self._requests.get(job.id)
        if request is not None:
            return request
        request = JobRequest.model_validate(job.request)
        if has_secrets(request):
            raise Invalid(
                "it was queued with secret env values, which the server keeps only in "
                "memory and lost when it restarted: submit it again",
                details={"job_id": job.id},
            )
        return request

    def _never(self, request: JobRequest, exc: Conflict) -> bool:
        """Whether the request could not run even with every machine free."""
        if request.machine_selection == "auto":
            with self.store.session() as s:
                registered = s.scalar(select(func.count()).select_from(Machine)) or 0
            return request.resource_requirements.num_machines > registered
        unavailable = exc.info.get("unavailable") or {}
        return any(
            not reason.startswith(TRANSIENT)
            for reasons in unavailable.values()
            for reason in reasons
        )

    async def run(self, interval: float = 1.0) -> None:
        """Schedule forever: at once when a job ends or is queued or moved, else every
        ``interval``, or less often while rounds change nothing (twice the wait after
        each quiet round, up to :data:`QUIET_WAIT`: machines freed by something else,
        a health check, are seen within that)."""
        log = logging.getLogger("corral.serve")
        wait = interval
        while True:
            self._wake.clear()
            try:
                await asyncio.to_thread(self.schedule_once)
            except RuntimeError:
                return  # the loop's executor is shut down: the server is exiting
            except Exception:
                log.exception("scheduling queued jobs failed")  # the next round retries
                self.quiet = False
            wait = min(wait * 2, max(interval, QUIET_WAIT)) if self.quiet else interval
            await asyncio.to_thread(self._wake.wait, wait)


def waiting_reason(request: JobRequest, exc: Conflict) -> str:
    """What a queued job waits for, from the Conflict that kept it from starting:
    ``waiting for 2 machines: gpu1 busy with J, gpu3 offline``."""
    info = exc.info
    if "unavailable" in info or "busy" in info:  # manual selection; or taken since planned
        unavailable: dict[str, list[str]] = dict(info.get("unavailable") or {})
        for name, jobs in (info.get("busy") or {}).items():
            unavailable[name] = [f"busy with {', '.join(jobs)}"]
        names = request.selected_machines or list(unavailable)
        why = ", ".join(f"{n} {'; '.join(r)}" for n, r in unavailable.items())
        return f"waiting for {', '.join(names)}: {why}"
    if "needed" in info:
        why = ", ".join(
            f"{m['name']} {'; '.join(m['reasons'])}"
            for m in info.get("suggestions") or []
            if not m.get("eligible")
        )
        free = f" ({info.get('available', 0)} free)" if info.get("available") else ""
        return f"waiting for {plural(int(info['needed']), 'machine')}{free}: {why}"
    return f"waiting: {exc}"
