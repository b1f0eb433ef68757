"""Tasks (saved job templates), queuing them, and preferences.

A task queues a job with the task's request and priority (a request's own priority
wins); the queue itself, its reasons, limits and scheduler are
:mod:`corral.service.queue`.
"""

from __future__ import annotations

import time

from sqlalchemy import select

from corral.errors import Invalid, NotFound
from corral.service.audit import record_change
from corral.service.jobs import JobManager
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
from corral.service.queue import JobQueue
from corral.service.settings import new_id
from corral.service.users import UserService
from corral.store import Store
from corral.store.models import Preference, Task

PREFERENCES_KEY = "distributed"


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


class TaskService:
    """Tasks, the queue and its scheduler, and the saved preferences."""

    def __init__(self, store: Store, jobs: JobManager, users: UserService) -> None:
        self.store = store
        self.jobs = jobs
        self.users = users
        self.queued = JobQueue(store, jobs, users)

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
            after = {"name": body.name, "kind": body.kind, "owner": owner}
            record_change(s, owner or "server", "task.create", task.id, after=after)
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
        return self.queued.enqueue(
            request, kind=kind, task_id=task.id, owner=owner, priority=chosen, probe=False
        )

    def queue_request(
        self, request: JobRequest, *, owner: str | None = None, priority: int = 0
    ) -> QueuedOut:
        """Queue ``owner``'s job from a request (``corral job submit --queue``)."""
        return self.queued.enqueue(request, owner=owner, priority=priority)

    def list_queue(self, limit: int | None = None, offset: int = 0) -> list[QueueEntry]:
        """The queue, in its order, with what each job waits for."""
        return self.queued.entries(limit, offset)

    def move(self, job_id: str, body: QueueMove, *, by: str) -> QueueEntry:
        """Give a queued job a new priority (``top``: ahead of every other)."""
        return self.queued.move(job_id, body, by=by)

    def check_limit(self, owner: str | None, machines: int) -> None:
        """Conflict when ``owner`` may not start a job of ``machines`` machines now."""
        self.queued.check_limit(owner, machines)

    def schedule_once(self) -> list[str]:
        """One round of the queue's scheduler: the ids of the jobs started."""
        return self.queued.schedule_once()

    async def run(self, interval: float = 1.0) -> None:
        """Schedule forever (:meth:`corral.service.queue.JobQueue.run`)."""
        await self.queued.run(interval)

    # -- preferences ---------------------------------------------------------------------

    def preferences(self) -> Preferences:
        """The saved DistributedPreferences (defaults when never saved)."""
        with self.store.session() as s:
            row = s.get(Preference, PREFERENCES_KEY)
        return Preferences.model_validate(row.value) if row else Preferences()

    def save_preferences(self, body: Preferences, *, by: str) -> Preferences:
        """Replace the saved preferences (audited as ``by``'s change)."""
        with self.store.session() as s:
            old = s.get(Preference, PREFERENCES_KEY)
            before = dict(old.value) if old is not None else None
            s.merge(Preference(key=PREFERENCES_KEY, value=body.model_dump(), updated=time.time()))
            record_change(
                s, by, "preferences.set", PREFERENCES_KEY, before=before, after=body.model_dump()
            )
        return body
