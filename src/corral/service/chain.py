"""Jobs that follow jobs: a job that starts after others succeed (``after``), and a
job submitted again (resubmit).

A request's ``after`` names jobs that must succeed before it starts (Slurm's
``afterok``). Such a job is queued: the scheduler leaves it waiting, without holding
the jobs behind it, with the reason ``waiting for job A to succeed``; when one of
them ends otherwise (failed, timed out, cancelled, lost) or is deleted, the job is
cancelled with a reason naming it (``job A, which it waits for, failed``), and so on
down the chain. Dispatching such a job before its jobs succeeded is a Conflict. What
it costs: nothing for a job without ``after``; one query over the jobs it names.

Resubmitting queues a new job, owned by whoever resubmits it, with the stored
request of an earlier one (its secret env values were never stored: such a job is
refused, naming the keys, to be submitted again with them).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from pydantic import ValidationError
from sqlalchemy import String, cast, select

from corral.errors import Conflict, Invalid, NotFound
from corral.job.states import TERMINAL_STATES, WAITING_STATES, JobState
from corral.redact import REDACTED
from corral.service.jobrows import move
from corral.service.models import JobRequest
from corral.store import Store
from corral.store.models import Job

SUCCEEDED = JobState.SUCCEEDED.value
ENDED_BADLY = TERMINAL_STATES - {JobState.SUCCEEDED}
"""The ends of a job that cancel the jobs waiting for it to succeed."""


def after_of(request: JobRequest | dict[str, Any] | None) -> list[str]:
    """The jobs a request (or a stored one) waits for, each once, in its order."""
    if request is None:
        return []
    names = request.after if isinstance(request, JobRequest) else request.get("after") or []
    return list(dict.fromkeys(str(n) for n in names))


def _states(store: Store, ids: Sequence[str]) -> dict[str, str]:
    """The state of each of ``ids`` that exists."""
    if not ids:
        return {}
    with store.session() as s:
        rows = s.execute(select(Job.id, Job.state).where(Job.id.in_(list(ids)))).all()
    return {job_id: state for job_id, state in rows}


def _ended_badly(after: Sequence[str], states: dict[str, str]) -> str:
    """Why a job waiting for ``after`` will never start; empty while it may."""
    for job_id in after:
        state = states.get(job_id)
        if state is None:
            return f"job {job_id}, which it waits for, was deleted"
        if state in ENDED_BADLY:
            return f"job {job_id}, which it waits for, {state.replace('_', ' ')}"
    return ""


def _waiting(after: Sequence[str], states: dict[str, str]) -> list[str]:
    """The jobs of ``after`` that have not succeeded yet."""
    return [job_id for job_id in after if states.get(job_id) != SUCCEEDED]


def waiting_text(ids: Sequence[str]) -> str:
    """``waiting for job A to succeed`` (``jobs A, B``)."""
    jobs = "job" if len(ids) == 1 else "jobs"
    return f"waiting for {jobs} {', '.join(ids)} to succeed"


class Chain:
    """The jobs' ``after``: checked when a job is queued or dispatched, a waiting
    job's reason, and the cancelling of the jobs waiting for one that ended badly."""

    def __init__(self, store: Store, notify: Callable[[str], None]) -> None:
        self.store = store
        self.notify = notify  # a job's readers (its event stream) are woken

    def check(self, request: JobRequest) -> None:
        """At queueing: NotFound for a job ``after`` names that does not exist; Conflict
        when one already ended otherwise than succeeded (the job would never start)."""
        after = after_of(request)
        states = _states(self.store, after)
        missing = [job_id for job_id in after if job_id not in states]
        if missing:
            raise NotFound(
                f"after: no job {', '.join(missing)}", details={"field": "after", "jobs": missing}
            )
        never = _ended_badly(after, states)
        if never:
            raise Conflict(
                f"after: {never}, so this job would never start",
                details={"field": "after", "states": states},
            )

    def reason(self, job: Job) -> str:
        """Why a queued job waits for the jobs it names (``waiting for job A to
        succeed``); empty when it does not (none named, or all succeeded)."""
        after = after_of(job.request)
        if not after:
            return ""
        return self._reason(after, _states(self.store, after))

    @staticmethod
    def _reason(after: Sequence[str], states: dict[str, str]) -> str:
        never = _ended_badly(after, states)
        if never:
            return never
        waiting = _waiting(after, states)
        return waiting_text(waiting) if waiting else ""

    def broken(self, job: Job) -> str:
        """Why a queued job will never start (one of its ``after`` ended badly); empty
        while it may."""
        after = after_of(job.request)
        return _ended_badly(after, _states(self.store, after)) if after else ""

    def require_met(self, request: JobRequest | dict[str, Any] | None, what: str) -> None:
        """At dispatch: Conflict while a job the request names has not succeeded
        (``what``: the job, as the message names it)."""
        after = after_of(request)
        if not after:
            return
        states = _states(self.store, after)
        reason = self._reason(after, states)
        if reason:
            raise Conflict(
                f"{what} cannot start now ({reason}): queue it (POST /api/jobs/queue, "
                "corral job submit --after) to have it start then",
                details={"after": states},
            )

    def cancel(self, job_id: str, why: str) -> list[str]:
        """Cancel the waiting job ``job_id`` with ``why``, and the jobs waiting for it;
        the ids cancelled."""
        done: list[str] = []
        if move(
            self.store,
            job_id,
            JobState.CANCELLED,
            only_from=WAITING_STATES,
            reason=why,
            ended=time.time(),
        ):
            done.append(job_id)
            self.notify(job_id)
            done += self.ended(job_id)
        return done

    def ended(self, job_id: str) -> list[str]:
        """``job_id`` ended (or was deleted): the queued jobs waiting for it are
        cancelled (and theirs) when it did not succeed; the ids cancelled."""
        states = _states(self.store, [job_id])
        if states.get(job_id) == SUCCEEDED:
            return []
        done: list[str] = []
        for row in self.dependents(job_id):
            why = _ended_badly([job_id], states)
            if why:
                done += self.cancel(row.id, f"not started: {why}")
        return done

    def dependents(self, job_id: str) -> list[Job]:
        """The waiting jobs that name ``job_id`` in their ``after`` (the request's text
        is searched for the id in SQL, then each candidate's list checked)."""
        needle = f'%"{job_id}"%'
        with self.store.session() as s:
            rows = s.scalars(
                select(Job).where(
                    Job.state.in_([w.value for w in WAITING_STATES]),
                    cast(Job.request, String).like(needle),
                )
            ).all()
        return [row for row in rows if job_id in after_of(row.request)]


def resubmitted(row: Job, *, after: Iterable[str] = ()) -> JobRequest:
    """The request of the job ``row`` as it was stored, to queue again (``after``: the
    jobs the new one waits for instead of the old one's). Conflict when it carried
    secret env values (never stored) or has no stored request."""
    if not row.request:
        raise Conflict(
            f"job {row.id} has no stored request to submit again", details={"job_id": row.id}
        )
    data = dict(row.request)
    secrets = [k for k, v in (data.get("env") or {}).items() if v == REDACTED]
    if secrets:
        raise Conflict(
            f"job {row.id} ran with secret env values ({', '.join(secrets)}), which the "
            "server never stores: submit it again with them (corral job submit --env KEY)",
            details={"job_id": row.id, "secret_env": secrets},
        )
    given = list(after)
    if given:
        data["after"] = given
    else:
        data.pop("after", None)
    return stored_request(row.id, data)


def stored_request(job_id: str, data: dict[str, Any]) -> JobRequest:
    """A job's stored request as a :class:`JobRequest` (Invalid naming the field when
    it no longer validates: an ``after`` given with it, an older server's request)."""
    try:
        return JobRequest.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"])
        raise Invalid(
            f"job {job_id}'s request: {field}: {first['msg']}", details={"field": field}
        ) from exc
