"""A job's row in the store, and its state changed only along the transition table.

Every state the server writes goes through :func:`move`: an ``UPDATE`` made
conditional on the states the table (:data:`corral.job.states.JOB_TRANSITIONS`)
allows the new state from, so two writers (a stop and a dispatch, the scheduler
and a user) can never take a job along a transition the table does not have.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from sqlalchemy import update

from corral.errors import NotFound
from corral.job.states import JobState, job_sources, state_values
from corral.store import Store
from corral.store.models import Job

log = logging.getLogger("corral.serve")


def job_row(store: Store, job_id: str) -> Job:
    """The job's row (NotFound when unknown)."""
    with store.session() as s:
        row = s.get(Job, job_id)
    if row is None:
        raise NotFound(f"no job {job_id!r}", details={"job_id": job_id})
    return row


def set_values(store: Store, job_id: str, **values: Any) -> None:
    """Write columns of the job other than its state."""
    if "state" in values:
        raise ValueError("a job's state changes through move()")
    with store.session() as s:
        s.execute(update(Job).where(Job.id == job_id).values(**values))


def move(
    store: Store,
    job_id: str,
    new: JobState,
    *,
    only_from: Iterable[JobState] | None = None,
    **values: Any,
) -> bool:
    """Move the job to ``new`` (and write ``values``) if its state allows it now
    (and is one of ``only_from`` when given); whether it moved."""
    sources = job_sources(new)
    if only_from is not None:
        sources = sources & frozenset(only_from)
    with store.session() as s:
        result = s.execute(
            update(Job)
            .where(Job.id == job_id, Job.state.in_(state_values(sources)))
            .values(state=new.value, **values)
        )
    moved = rowcount(result) > 0
    if not moved:
        log.info("job %s: not moved to %s (its state does not allow it)", job_id, new.value)
    return moved


def mirror(job: Job, new: JobState) -> None:
    """Set a loaded row's state to what its supervisor reported (the engine checked
    the transition against the same table; one it did not have is logged)."""
    old = JobState(job.state)
    if new != old and old not in job_sources(new):
        log.warning(
            "job %s: its supervisor reported %s -> %s, which the transition table "
            "does not have; recorded as reported",
            job.id,
            old.value,
            new.value,
        )
    job.state = new.value


def rowcount(result: Any) -> int:
    """Rows an UPDATE or DELETE changed."""
    return int(result.rowcount)
