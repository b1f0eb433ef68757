"""Tasks (saved job templates), the queue that starts them, and preferences.

Queuing a task, or a job request (``POST /api/jobs/queue``, ``corral job submit
--queue``), creates a job in state ``queued`` owned by the user who queued it,
with a priority (the request's, else the task's, else 0). The queue's order is
higher priority first, then first in first out; an admin may reorder it
(:meth:`TaskService.move`). The scheduler walks the queue in that order and starts
each job as soon as enough machines are free: it plans it (machine selection as
for ``/distributed/plan``, busy machines excluded) and dispatches it. The first
job that must wait for machines holds every job after it (nothing overtakes it);
a job whose owner is at their limit of running jobs or machines
(:meth:`corral.service.users.UserService.set_limits`) waits without holding the
others. Each queued job's reason says what it waits for (``waiting for 2
machines: gpu1 busy with J, gpu3 offline``; ``alice has 2 running, limit 2``). A
queued job that can never run (it asks for more machines than are registered or
than its owner's limit, or names a machine that was removed) fails with the
reason instead of blocking the queue; a request that could never run is refused
(409) instead of queued. Secret env values of a queued request are kept in memory
only: a server restart fails such a job with the reason.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time

from sqlalchemy import select

from corral.errors import Conflict, CorralError, Invalid, NotFound
from corral.job.resolve import new_job_id
from corral.service.jobs import JobManager
from corral.service.machines import ACTIVE_STATES
from corral.service.models import (
    JobRequest,
    Preferences,
    QueuedOut,
    QueueEntry,
    QueueMove,
    TaskIn,
    TaskOut,
)
from corral.service.planner import has_secrets, stored_request
from corral.service.queries import display_name
from corral.service.settings import new_id
from corral.service.users import UserService
from corral.store import Store
from corral.store.models import Job, Machine, Preference, Task
from corral.words import plural

PREFERENCES_KEY = "distributed"
TRANSIENT = ("busy with", "offline", "never health-checked")
"""Why a selected machine cannot take a job *now*: a queued job waits these out."""


def _task_out(t: Task) -> TaskOut:
    return TaskOut(
        id=t.id,
        name=t.name,
        kind=t.kind,
        request=dict(t.request),
        created=t.created,
        owner=t.owner,
        priority=t.priority or 0,
    )


def _machines_of(job: Job) -> int:
    """How many machines a queued job asks for."""
    request = job.request or {}
    selected = request.get("selected_machines") or []
    if request.get("machine_selection") == "manual" and selected:
        return len(selected)
    return int((request.get("resource_requirements") or {}).get("num_machines") or 1)


class TaskService:
    """Tasks, the queue and its scheduler, and the saved preferences."""

    def __init__(self, store: Store, jobs: JobManager, users: UserService) -> None:
        self.store = store
        self.jobs = jobs
        self.users = users
        self._wake = threading.Event()
        self._requests: dict[str, JobRequest] = {}  # queued requests with secret values
        jobs.on_finished.append(lambda _job_id: self._wake.set())

    # -- tasks ---------------------------------------------------------------------------

    def create(self, body: TaskIn, owner: str | None = None) -> TaskOut:
        """Save a task (``owner``'s). Secret env values are refused: a task is stored, and secrets
        never are."""
        if has_secrets(body.request):
            raise Invalid(
                "a task is stored, and secret env values never are: pass secrets when "
                "you plan or dispatch a job instead",
                details={"field": "request.env"},
            )
        if body.kind == "single" and body.request.resource_requirements.num_machines != 1:
            raise Invalid(
                "a single-machine task runs on one machine",
                details={"field": "request.resource_requirements.num_machines"},
            )
        self.jobs.planning.admit(body.request, owner)  # Forbidden: corral.service.trust
        task = Task(
            id=new_id("t"),
            name=body.name,
            kind=body.kind,
            request=stored_request(body.request),
            created=time.time(),
            owner=owner,
            priority=body.priority,
        )
        with self.store.session() as s:
            s.add(task)
        return _task_out(task)

    def list_tasks(self) -> list[TaskOut]:
        """Every task, oldest first."""
        with self.store.session() as s:
            return [_task_out(t) for t in s.scalars(select(Task).order_by(Task.created))]

    def get(self, task_id: str) -> TaskOut:
        """One task (NotFound when unknown)."""
        return _task_out(self._row(task_id))

    def row(self, task_id: str) -> Task:
        """The task's row (NotFound when unknown)."""
        return self._row(task_id)

    def _row(self, task_id: str) -> Task:
        with self.store.session() as s:
            task = s.get(Task, task_id)
        if task is None:
            raise NotFound(f"no task {task_id!r}", details={"task_id": task_id})
        return task

    def queue(
        self,
        task_id: str,
        machine_id: str | None = None,
        *,
        owner: str | None = None,
        priority: int | None = None,
    ) -> QueuedOut:
        """Queue a job of ``owner`` from the task (on one machine when ``machine_id`` is
        given), at ``priority`` (default: the task's)."""
        task = self._row(task_id)
        request = JobRequest.model_validate(task.request)
        kind = task.kind
        if machine_id is not None:
            machine = self.jobs.machines.row(machine_id)
            request = request.model_copy(
                update={
                    "machine_selection": "manual",
                    "selected_machines": [machine.id],
                    "resource_requirements": request.resource_requirements.model_copy(
                        update={"num_machines": 1}
                    ),
                }
            )
            kind = "single"
        chosen = (task.priority or 0) if priority is None else priority
        self.jobs.planning.admit(request, owner)  # Forbidden: corral.service.trust
        self._check_never_over_limit(owner, _request_machines(request))
        return self._enqueue(request, kind, task.id, "", owner, chosen)

    def queue_request(
        self, request: JobRequest, *, owner: str | None = None, priority: int = 0
    ) -> QueuedOut:
        """Queue ``owner``'s job from a request (``corral job submit --queue``). Its
        reason says what it waits for; a request that could never run, even with every
        machine free (or its owner's limit), is refused (Conflict) instead of queued;
        one its owner may not run at all (:mod:`corral.service.trust`) is Forbidden."""
        self.jobs.planning.admit(request, owner)
        self._check_never_over_limit(owner, _request_machines(request))
        reason = ""
        try:
            self.jobs.select(request, owner=owner)
        except Conflict as exc:
            if self._never(request, exc):
                raise
            reason = waiting_reason(request, exc)
        ahead = sum(1 for job in self._queued() if (job.priority or 0) >= priority)
        if ahead:
            reason = f"waiting behind the {plural(ahead, 'job')} queued first"
        reason = self.limit_reason(owner, _request_machines(request)) or reason
        queued = self._enqueue(request, "distributed", None, reason, owner, priority)
        if has_secrets(request):
            self._requests[queued.job_id] = request
        return queued

    def _enqueue(
        self,
        request: JobRequest,
        kind: str,
        task_id: str | None,
        reason: str,
        owner: str | None,
        priority: int,
    ) -> QueuedOut:
        job_id = new_job_id()
        with self.store.session() as s:
            s.add(
                Job(
                    id=job_id,
                    kind=kind,
                    state="queued",
                    reason=reason,
                    request=stored_request(request),
                    plan={},
                    machine_ids=[],
                    task_id=task_id,
                    created=time.time(),
                    queued=time.time(),
                    run_dir="",
                    owner=owner,
                    priority=priority,
                )
            )
        self._wake.set()
        return QueuedOut(
            job_id=job_id,
            task_id=task_id,
            status="queued",
            position=self._position(job_id),
            reason=reason,
            priority=priority,
            owner=owner,
        )

    def _queued(self) -> list[Job]:
        """The queued jobs in the queue's order: priority, then first in first out."""
        with self.store.session() as s:
            return list(
                s.scalars(
                    select(Job)
                    .where(Job.state == "queued")
                    .order_by(Job.priority.desc(), Job.queued, Job.created, Job.id)
                ).all()
            )

    def list_queue(self) -> list[QueueEntry]:
        """The queue, in its order, with what each job waits for."""
        return [
            QueueEntry(
                position=index,
                job_id=job.id,
                name=display_name(job, None),
                owner=job.owner,
                priority=job.priority or 0,
                queued=job.queued,
                machines=_machines_of(job),
                reason=job.reason or "",
            )
            for index, job in enumerate(self._queued())
        ]

    def move(self, job_id: str, body: QueueMove) -> QueueEntry:
        """Give a queued job a new priority (``top``: one above every other queued job)."""
        if body.top == (body.priority is not None):
            raise Invalid("give either a priority or top", details={"field": "priority"})
        row = self.jobs.row(job_id)
        if row.state != "queued":
            raise Conflict(
                f"job {job_id} is {row.state}, not queued: only a queued job can be moved",
                details={"job_id": job_id, "state": row.state},
            )
        priority = body.priority
        if priority is None:
            others = [j.priority or 0 for j in self._queued() if j.id != job_id]
            priority = max(others) + 1 if others else row.priority or 0
        self.jobs._set(job_id, priority=priority)
        self._wake.set()
        return next(e for e in self.list_queue() if e.job_id == job_id)

    # -- per-user limits -----------------------------------------------------------------

    def running(self, owner: str) -> tuple[int, int]:
        """How many active jobs ``owner`` has, and how many machines they hold."""
        with self.store.session() as s:
            rows = s.execute(
                select(Job.machine_ids).where(Job.owner == owner, Job.state.in_(ACTIVE_STATES))
            ).all()
        return len(rows), sum(len(ids or ()) for (ids,) in rows)

    def limit_reason(self, owner: str | None, machines: int) -> str:
        """Why ``owner``'s job of ``machines`` machines must wait for their own jobs to
        end (``alice has 2 running, limit 2``); empty when it need not."""
        if owner is None:
            return ""
        max_jobs, max_machines = self.users.limits(owner)
        if max_jobs is None and max_machines is None:
            return ""
        jobs, held = self.running(owner)
        if max_jobs is not None and jobs >= max_jobs:
            return f"{owner} has {jobs} running, limit {max_jobs}"
        if max_machines is not None and held + machines > max_machines:
            return (
                f"{owner}'s running jobs hold {plural(held, 'machine')}, limit {max_machines} "
                f"(this job needs {machines})"
            )
        return ""

    def check_limit(self, owner: str | None, machines: int) -> None:
        """Conflict when ``owner`` may not start a job of ``machines`` machines now."""
        self._check_never_over_limit(owner, machines)
        reason = self.limit_reason(owner, machines)
        if reason:
            raise Conflict(reason, details={"owner": owner, "limit": True})

    def _never_reason(self, owner: str | None, machines: int) -> str:
        _, max_machines = self.users.limits(owner)
        if max_machines is not None and machines > max_machines:
            return f"it needs {plural(machines, 'machine')} and {owner}'s limit is {max_machines}"
        return ""

    def _check_never_over_limit(self, owner: str | None, machines: int) -> None:
        never = self._never_reason(owner, machines)
        if never:
            raise Conflict(never, details={"owner": owner, "limit": True})

    def _position(self, job_id: str) -> int:
        return next((i for i, j in enumerate(self._queued()) if j.id == job_id), -1)

    # -- the scheduler -------------------------------------------------------------------

    def schedule_once(self) -> list[str]:
        """Start queued jobs in the queue's order while machines are free; the ids
        started. A job whose owner is at their limit waits without holding the others;
        the first job that waits for machines holds every job after it."""
        started: list[str] = []
        queued = self._queued()
        for index, job in enumerate(queued):
            machines = _machines_of(job)
            never = self._never_reason(job.owner, machines)
            if never:
                self._fail(job.id, never)
                continue
            limited = self.limit_reason(job.owner, machines)
            if limited:
                self.jobs._set(job.id, reason=limited)
                continue
            try:
                request = self._request_of(job)
                self.jobs.plan(request, kind=job.kind, task_id=job.task_id, job_id=job.id)
                row = self.jobs.row(job.id)
                self.jobs.start(row)
            except Conflict as exc:
                if self._never(request, exc):
                    self._fail(job.id, str(exc))
                    continue
                self.jobs._set(job.id, state="queued", reason=waiting_reason(request, exc))
                for later in queued[index + 1 :]:  # nothing overtakes the first waiting job
                    reason = self.limit_reason(later.owner, _machines_of(later))
                    self.jobs._set(
                        later.id, reason=reason or f"waiting behind job {job.id} (queued first)"
                    )
                break
            except (CorralError, ValueError) as exc:
                self._fail(job.id, str(exc))
                continue
            self._requests.pop(job.id, None)
            started.append(job.id)
        return started

    def _fail(self, job_id: str, why: str) -> None:
        """A queued job that can never run fails with the reason."""
        self._requests.pop(job_id, None)
        self.jobs._set(
            job_id,
            state="failed",
            reason=f"cannot run: {why}",
            ended=time.time(),
            root_cause={"message": why},
        )

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
        with self.store.session() as s:
            registered = len(s.scalars(select(Machine.id)).all())
        if request.machine_selection == "auto":
            return request.resource_requirements.num_machines > registered
        unavailable = exc.info.get("unavailable") or {}
        return any(
            not reason.startswith(TRANSIENT)
            for reasons in unavailable.values()
            for reason in reasons
        )

    async def run(self, interval: float = 1.0) -> None:
        """Schedule forever: at every ``interval`` and whenever a job ends or is queued."""
        log = logging.getLogger("corral.serve")
        while True:
            self._wake.clear()
            try:
                await asyncio.to_thread(self.schedule_once)
            except RuntimeError:
                return  # the loop's executor is shut down: the server is exiting
            except Exception:
                log.exception("scheduling queued jobs failed")  # the next round retries
            await asyncio.to_thread(self._wake.wait, interval)

    # -- preferences ---------------------------------------------------------------------

    def preferences(self) -> Preferences:
        """The saved DistributedPreferences (defaults when never saved)."""
        with self.store.session() as s:
            row = s.get(Preference, PREFERENCES_KEY)
        return Preferences.model_validate(row.value) if row else Preferences()

    def save_preferences(self, body: Preferences) -> Preferences:
        """Replace the saved preferences."""
        with self.store.session() as s:
            s.merge(Preference(key=PREFERENCES_KEY, value=body.model_dump(), updated=time.time()))
        return body


def _request_machines(request: JobRequest) -> int:
    """How many machines a request asks for."""
    if request.machine_selection == "manual" and request.selected_machines:
        return len(request.selected_machines)
    return request.resource_requirements.num_machines


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
