"""The job manager: one facade over planning, dispatch, ingest and the views.

A job of ``corral serve`` is planned (:mod:`corral.service.planning`: machines
chosen, the job description fixed and stored, state ``planned``), dispatched
(:mod:`corral.service.dispatch`: that stored description handed to its own
supervisor process, ``python -m corral.service.launch``, which runs it with the
engine ``corral run`` uses and appends every event to ``events.jsonl`` in the
job's run dir), ingested (:mod:`corral.service.ingest`: the events folded into
the store every fraction of a second) and read (:mod:`corral.service.queries`).
The server can be killed and started again without stopping training: on start
(:meth:`JobManager.reattach`) it goes on ingesting the jobs whose supervisor is
alive and marks the others ``lost`` with the reason.

Job states are :class:`corral.job.states.JobState`: ``planned`` and ``queued``
(waiting for machines, see :mod:`corral.service.tasks`), then the engine's, and
``lost``; every change follows :data:`corral.job.states.JOB_TRANSITIONS`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from sqlalchemy import select

from corral.job.describe import JobDescription
from corral.job.states import JobState
from corral.notify import Notifications
from corral.service.audit import record_change
from corral.service.dispatch import Dispatch
from corral.service.eventlog import LoggedEvent
from corral.service.ingest import Ingest, Live
from corral.service.jobrows import job_row, move, set_values
from corral.service.machines import MachineService
from corral.service.models import (
    DispatchIn,
    DistributedJobStatus,
    JobList,
    JobRequest,
    JobSummary,
    OutputPage,
    PlanOut,
    StopOut,
)
from corral.service.planner import Selection
from corral.service.planning import Planning
from corral.service.queries import FILE_ALIASES, Queries, prefixed_lines
from corral.service.settings import ServerSettings, delivery_policy
from corral.store import Store
from corral.store.models import Job, Machine

__all__ = ["FILE_ALIASES", "JobManager", "prefixed_lines"]


class JobManager:
    """Jobs over the store: planning, supervisor processes, ingest, status, output."""

    def __init__(self, store: Store, settings: ServerSettings, machines: MachineService) -> None:
        self.store = store
        self.settings = settings
        self.machines = machines
        launches: dict[str, JobDescription] = {}  # planned jobs, secret values included
        self.live = Live()
        self.planning = Planning(store, settings, machines, launches)
        self.dispatcher = Dispatch(store, settings, launches, self.live.notify)
        self.chain = self.dispatcher.chain  # jobs that start after others succeed
        self.notifications = Notifications(store, delivery_policy(settings))
        self.ingester = Ingest(store, self.live, self.notifications.record)
        self.queries = Queries(store, self.ingester, self.live, launches)
        self.on_finished: list[Callable[[str], Any]] = []  # when a job ends (the scheduler)

    # -- planning and dispatch -----------------------------------------------------------

    def select(
        self,
        request: JobRequest,
        busy: dict[str, list[str]] | None = None,
        *,
        owner: str | None = None,
    ) -> Selection:
        """The machines ``request`` would run on now for ``owner`` (Conflict when it
        cannot; Forbidden when ``owner`` may not run it: :mod:`corral.service.trust`)."""
        return self.planning.select(request, busy, owner=owner)

    def plan(
        self,
        request: JobRequest,
        *,
        kind: str = "distributed",
        task_id: str | None = None,
        job_id: str | None = None,
    ) -> PlanOut:
        """Choose machines, fix the job description and store the job as ``planned``."""
        return self.planning.plan(request, kind=kind, task_id=task_id, job_id=job_id)

    def dispatch(self, body: DispatchIn, *, by: str = "server") -> DistributedJobStatus:
        """Run a planned job's stored job description (Conflict when it is not planned,
        or its machines changed since the plan or are busy); audited as ``by``'s."""
        before = {"state": self.row(body.job_id).state}
        self.dispatcher.dispatch(body)
        self.audit(by, "job.dispatch", body.job_id, before=before)
        return self.status(body.job_id)

    def start(self, row: Job) -> None:
        """Claim a planned (or queued) job and start its supervisor."""
        self.dispatcher.start(row)

    def execute_here(self, request: JobRequest, owner: str | None = None) -> DistributedJobStatus:
        """Run ``owner``'s job on the server's own machine (one local node), now
        (Forbidden unless ``owner`` is an admin)."""
        self.chain.require_met(request, "this job")
        job_id = self.planning.plan_here(request, owner)
        self.dispatcher.claim(job_id)
        self.dispatcher.launch(job_id, self.dispatcher.planned_launch(self.row(job_id)))
        self.audit(owner or "server", "job.execute", job_id)
        return self.status(job_id)

    def stop(
        self, job_id: str, *, force: bool = False, by: str = "the API", who: str | None = None
    ) -> StopOut:
        """Cancel a waiting job, tear a running one down (``force``: kill now; ``by``:
        who stopped it and from where, ``alice (web)``, as its reason names them).
        Audited as ``who``'s change (default ``by``) unless it changed nothing (the job
        had ended, or was asked to stop already and this is no ``force``)."""
        before = {"state": self.row(job_id).state}
        asked = job_id in self.dispatcher.stop_sent and not force
        out = self.dispatcher.stop(job_id, force=force, by=by)
        if (out.stopping and not asked) or out.status != before["state"]:
            self.audit(
                who or by,
                "job.stop",
                job_id,
                before=before,
                after={"state": out.status, "stopping": out.stopping, "force": force},
                reason=f"stopped by {by}",
            )
        return out

    def audit(
        self,
        who: str,
        action: str,
        job_id: str,
        *,
        before: dict[str, Any] | None = None,
        after: dict[str, Any] | None = None,
        reason: str | None = None,
    ) -> None:
        """The audit entry of ``who``'s change to the job: ``after`` is its state, owner
        and machines now (None once it is gone; what ``after`` gives replaces those;
        ``reason``: why)."""
        with self.store.session() as s:
            row = s.get(Job, job_id)
            now: dict[str, Any] = {}
            if row is not None:
                ids = list(row.machine_ids or [])
                names = s.scalars(select(Machine.name).where(Machine.id.in_(ids))).all()
                now = {
                    "state": row.state,
                    "owner": row.owner,
                    "machines": sorted(names) or ([row.master] if row.master else []),
                }
            now |= after or {}
            if reason is not None:
                now["reason"] = reason
            record_change(s, who, action, job_id, before=before, after=now or None)

    def _set(self, job_id: str, **values: Any) -> None:
        """Write the job's columns; a ``state`` only along the transition table."""
        state = values.pop("state", None)
        if state is None:
            set_values(self.store, job_id, **values)
        else:
            move(self.store, job_id, JobState(state), **values)

    # -- ingest --------------------------------------------------------------------------

    def reattach(self) -> dict[str, str]:
        """On start: follow the active jobs whose supervisor runs, mark the others lost."""
        return self.ingester.reattach()

    def ingest_once(self) -> list[str]:
        """Read new events of every active job; the ids of jobs that ended."""
        self.dispatcher.reap()
        ended = [job_id for job_id in self.ingester.active_ids() if self.ingester.ingest(job_id)]
        for job_id in ended:
            self.dispatcher.stop_sent.discard(job_id)
            self.chain.ended(job_id)  # the jobs waiting for it: cancelled unless it succeeded
            for callback in self.on_finished:
                callback(job_id)  # must be thread-safe (the scheduler's wake is)
        return ended

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        """The event loop SSE readers wait on (notified from any thread)."""
        self.live.bind(loop)

    async def run_ingest(self) -> None:
        """Ingest forever (the server's background task)."""
        self.bind(asyncio.get_running_loop())
        log = logging.getLogger("corral.serve")
        while True:
            try:
                await asyncio.to_thread(self.ingest_once)
            except RuntimeError:
                return  # the loop's executor is shut down: the server is exiting
            except Exception:
                log.exception("ingesting job events failed")  # the next round retries
            await asyncio.sleep(self.settings.ingest_interval)

    def catch_up(self, job_id: str) -> None:
        """Ingest an active job's events now."""
        self.ingester.catch_up(job_id)

    # -- reading -------------------------------------------------------------------------

    def row(self, job_id: str) -> Job:
        """The job's row (NotFound when unknown)."""
        return job_row(self.store, job_id)

    def status(self, job_id: str) -> DistributedJobStatus:
        """The seed's DistributedJobStatus of a job."""
        return self.queries.status(job_id)

    def list_jobs(
        self,
        *,
        state: str | None = None,
        machine: str | None = None,
        task_id: str | None = None,
        kind: str | None = None,
        limit: int = 50,
        offset: int = 0,
    ) -> JobList:
        """Jobs, newest first, filtered by state, machine, task or kind."""
        return self.queries.list_jobs(
            state=state, machine=machine, task_id=task_id, kind=kind, limit=limit, offset=offset
        )

    def output(self, job_id: str, offset: int = 0, limit: int = 1000) -> OutputPage:
        """Merged ``[host:rank]`` output from byte ``offset`` of the events file."""
        return self.queries.output(job_id, offset, limit)

    def file(self, job_id: str, key: str) -> Path:
        """A file of the job's run dir by alias or relative path."""
        return self.queries.file(job_id, key)

    def files(self, job_id: str) -> list[str]:
        """The job's files (relative paths; logs included)."""
        return self.queries.files(job_id)

    def events(self, job_id: str, start: int = 0) -> AsyncIterator[LoggedEvent]:
        """Every event of the job from byte ``start`` on, live, until it has ended."""
        return self.queries.events(job_id, start)

    def delete(self, job_id: str, *, by: str = "server") -> JobSummary:
        """Forget a job that is not active (Conflict while it runs); the jobs waiting
        for it to succeed are cancelled. Audited as ``by``'s change."""
        row = self.row(job_id)
        before = {"state": row.state, "owner": row.owner, "kind": row.kind}
        summary = self.queries.delete(job_id)
        self.audit(by, "job.delete", job_id, before=before)
        self.chain.ended(job_id)
        return summary
