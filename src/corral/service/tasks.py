"""Tasks (saved job templates), the FIFO queue that starts them, and preferences.

Queuing a task, or a job request (``POST /api/jobs/queue``, ``corral job submit
--queue``), creates a job in state ``queued``. The scheduler looks at the oldest
queued job (first in, first out: a job never overtakes an older one) and starts
it as soon as enough machines are free: it plans it (machine selection as for
``/distributed/plan``, busy machines excluded) and dispatches it. Until then the
job's reason says what it waits for (``waiting for 2 machines: gpu1 busy with J,
gpu3 offline``). A queued job that can never run (it asks for more machines than
are registered, or names a machine that was removed) fails with the reason
instead of blocking the queue; a request that could never run is refused (409)
instead of queued. Secret env values of a queued request are kept in memory only:
a server restart fails such a job with the reason.
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
from corral.service.models import JobRequest, Preferences, QueuedOut, TaskIn, TaskOut
from corral.service.planner import has_secrets, stored_request
from corral.service.settings import new_id
from corral.store import Store
from corral.store.models import Job, Machine, Preference, Task
from corral.words import plural

PREFERENCES_KEY = "distributed"
TRANSIENT = ("busy with", "offline", "never health-checked")
"""Why a selected machine cannot take a job *now*: a queued job waits these out."""


def _task_out(t: Task) -> TaskOut:
    return TaskOut(id=t.id, name=t.name, kind=t.kind, request=dict(t.request), created=t.created)


class TaskService:
    """Tasks, the queue and its scheduler, and the saved preferences."""

    def __init__(self, store: Store, jobs: JobManager) -> None:
        self.store = store
        self.jobs = jobs
        self._wake = threading.Event()
        self._requests: dict[str, JobRequest] = {}  # queued requests with secret values
        jobs.on_finished.append(lambda _job_id: self._wake.set())

    # -- tasks ---------------------------------------------------------------------------

    def create(self, body: TaskIn) -> TaskOut:
        """Save a task. Secret env values are refused: a task is stored, and secrets
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
        task = Task(
            id=new_id("t"),
            name=body.name,
            kind=body.kind,
            request=stored_request(body.request),
            created=time.time(),
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

    def _row(self, task_id: str) -> Task:
        with self.store.session() as s:
            task = s.get(Task, task_id)
        if task is None:
            raise NotFound(f"no task {task_id!r}", details={"task_id": task_id})
        return task

    def queue(self, task_id: str, machine_id: str | None = None) -> QueuedOut:
        """Queue a job from the task (on one machine when ``machine_id`` is given)."""
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
        return self._enqueue(request, kind, task.id, "")

    def queue_request(self, request: JobRequest) -> QueuedOut:
        """Queue a job from a request (``corral job submit --queue``). Its reason says
        what it waits for; a request that could never run, even with every machine
        free, is refused (Conflict) instead of queued."""
        reason = ""
        try:
            self.jobs.select(request)
        except Conflict as exc:
            if self._never(request, exc):
                raise
            reason = waiting_reason(request, exc)
        ahead = len(self._queued())
        if ahead:
            reason = f"waiting behind the {plural(ahead, 'job')} queued first"
        queued = self._enqueue(request, "distributed", None, reason)
        if has_secrets(request):
            self._requests[queued.job_id] = request
        return queued

    def _enqueue(
        self, request: JobRequest, kind: str, task_id: str | None, reason: str
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
                )
            )
        self._wake.set()
        return QueuedOut(
            job_id=job_id,
            task_id=task_id,
            status="queued",
            position=self._position(job_id),
            reason=reason,
        )

    def _queued(self) -> list[Job]:
        with self.store.session() as s:
            return list(
                s.scalars(
                    select(Job).where(Job.state == "queued").order_by(Job.queued, Job.created)
                ).all()
            )

    def _position(self, job_id: str) -> int:
        return next((i for i, j in enumerate(self._queued()) if j.id == job_id), -1)

    # -- the scheduler -------------------------------------------------------------------

    def schedule_once(self) -> list[str]:
        """Start queued jobs, oldest first, while machines are free; the ids started."""
        started: list[str] = []
        queued = self._queued()
        for index, job in enumerate(queued):
            try:
                request = self._request_of(job)
                self.jobs.plan(request, kind=job.kind, task_id=job.task_id, job_id=job.id)
                row = self.jobs.row(job.id)
                self.jobs.start(row)
            except Conflict as exc:
                if self._never(request, exc):
                    self._requests.pop(job.id, None)
                    self.jobs._set(
                        job.id,
                        state="failed",
                        reason=f"cannot run: {exc}",
                        ended=time.time(),
                        root_cause={"message": str(exc)},
                    )
                    continue
                self.jobs._set(job.id, state="queued", reason=waiting_reason(request, exc))
                for later in queued[index + 1 :]:  # FIFO: nothing overtakes the oldest job
                    self.jobs._set(later.id, reason=f"waiting behind job {job.id} (queued first)")
                break
            except (CorralError, ValueError) as exc:
                self._requests.pop(job.id, None)
                self.jobs._set(
                    job.id,
                    state="failed",
                    reason=f"cannot run: {exc}",
                    ended=time.time(),
                    root_cause={"message": str(exc)},
                )
                continue
            self._requests.pop(job.id, None)
            started.append(job.id)
        return started

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
