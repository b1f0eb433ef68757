"""``/api/jobs``: every job with filters and paging, a job's status and files, and
its live events as Server-Sent Events."""

from __future__ import annotations

import functools
import json
import time
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Query, Request, Security
from sse_starlette import EventSourceResponse, ServerSentEvent

from corral.api.auth import Caller, bearer
from corral.api.routers.network import ERRORS
from corral.api.services import Services, services
from corral.api.streams import REVOKED_EVENT, revocable
from corral.service.chain import resubmitted, stored_request
from corral.service.eventlog import LoggedEvent
from corral.service.models import (
    MAX_AFTER,
    DistributedJobStatus,
    JobList,
    JobRequest,
    JobSummary,
    QueuedOut,
)
from corral.service.trust import shown_status

router = APIRouter(prefix="/api/jobs", tags=["jobs"], dependencies=[Security(bearer)])
OUTPUT_EVENTS = frozenset({"log"})
"""Events that carry a job's output: left out of the stream for anyone but the job's
owner and admins (everyone sees its state, nodes, progress and messages)."""
Svc = Annotated[Services, Depends(services)]


@router.get("", summary="Jobs, newest first, with filters and paging")
def list_jobs(
    svc: Svc,
    who: Caller,
    status: Annotated[
        str | None, Query(max_length=200, description="State(s), comma-separated.")
    ] = None,
    machine: Annotated[str | None, Query(max_length=255)] = None,
    task_id: Annotated[str | None, Query(max_length=64)] = None,
    kind: Annotated[str | None, Query(max_length=16)] = None,
    owner: Annotated[str | None, Query(max_length=64, description="A user's jobs.")] = None,
    mine: Annotated[bool, Query(description="The caller's own jobs.")] = False,
    limit: Annotated[int, Query(ge=1, le=1000)] = 50,
    offset: Annotated[int, Query(ge=0, le=2**31)] = 0,
) -> JobList:
    return svc.jobs.queries.list_jobs(
        state=status,
        machine=machine,
        task_id=task_id,
        kind=kind,
        owner=who.name if mine else owner,
        limit=limit,
        offset=offset,
    )


@router.post(
    "/queue",
    status_code=201,
    responses=ERRORS,
    summary="Queue a job: it starts when its machines are free (first in, first out)",
    description="The job waits in state `queued`; its `reason` says for what (`waiting for "
    "2 machines: gpu1 busy with J, gpu3 offline`; `alice has 2 running, limit 2`). The "
    "queue runs higher `priority` first, first in first out within a priority (above 0: "
    "admins only). A request "
    "that could never run, even with every machine free (or over the caller's machine "
    "limit), is a 409 (a 404 for an unknown machine) instead.",
)
def queue_job(
    body: JobRequest,
    svc: Svc,
    who: Caller,
    priority: Annotated[int, Query(ge=-1_000_000, le=1_000_000)] = 0,
) -> QueuedOut:
    who.may_prioritise(priority)
    return svc.tasks.queue_request(body, owner=who.name, priority=priority)


@router.post(
    "/{job_id}/resubmit",
    status_code=201,
    responses=ERRORS,
    summary="Queue a job again: a new job with the request it was submitted with",
    description="The new job is the caller's, queued with `priority` (it starts as soon "
    "as its machines are free) and `after` (repeatable: jobs that must succeed first; "
    "default: none). Only the job's owner or an admin may resubmit it. A job that ran "
    "with secret env values is a 409 naming the keys: the server never stored them.",
)
def resubmit_job(
    job_id: str,
    svc: Svc,
    who: Caller,
    priority: Annotated[int, Query(ge=-1_000_000, le=1_000_000)] = 0,
    after: Annotated[
        list[str] | None, Query(max_length=MAX_AFTER, description="Start after these succeed.")
    ] = None,
) -> QueuedOut:
    who.may_prioritise(priority)
    row = svc.jobs.row(job_id)
    who.require_owner(row.owner, f"resubmitting job {job_id}")
    request = resubmitted(row, after=after or ())
    return svc.tasks.queued.enqueue(
        request, kind=row.kind, owner=who.name, priority=priority, resubmitted=job_id
    )


@router.get(
    "/{job_id}/request",
    responses=ERRORS,
    summary="The request a job was submitted with (secret env values redacted)",
    description="What the new-job page's Clone fills the form with. Its owner and admins only.",
)
def job_request(job_id: str, svc: Svc, who: Caller) -> JobRequest:
    row = svc.jobs.row(job_id)
    who.require_reader(row.owner, f"reading job {job_id}'s request")
    return stored_request(job_id, row.request or {})


@router.get("/{job_id}", responses=ERRORS, summary="A job's status")
def get_job(job_id: str, svc: Svc, who: Caller) -> DistributedJobStatus:
    return shown_status(svc.jobs.status(job_id), who)


@router.delete(
    "/{job_id}",
    responses=ERRORS,
    summary="Forget a planned, queued or finished job (its run dir stays)",
)
def delete_job(job_id: str, svc: Svc, who: Caller) -> JobSummary:
    who.require_owner(svc.jobs.row(job_id).owner, f"deleting job {job_id}")
    return svc.jobs.delete(job_id, by=who.name)


@router.get("/{job_id}/files", responses=ERRORS, summary="The files of a job's run dir")
def job_files(job_id: str, svc: Svc, who: Caller) -> list[str]:
    who.require_reader(svc.jobs.row(job_id).owner, f"listing job {job_id}'s files")
    return svc.jobs.files(job_id)


@router.get(
    "/{job_id}/events",
    responses={**ERRORS, 200: {"content": {"text/event-stream": {}}}},
    response_class=EventSourceResponse,
    summary="Live events (SSE): state, node, progress, log, message, attempts, finished",
    description="Each event's `id` is the byte offset after it in the job's events file: "
    "reconnect with `Last-Event-ID` (or `?from=`) to resume without losing or repeating "
    "anything (a folded teardown's notes, one per node, resume at the same event: only the "
    "last of them carries the id, so no id is sent twice). The stream ends after the job's "
    "`finished` (or `error`) event, or with a "
    "`revoked` event within seconds of its token or web session being revoked. The `log` "
    "events (the job's output) go to the job's owner and admins only.",
)
async def job_events(
    job_id: str,
    request: Request,
    svc: Svc,
    start: Annotated[int | None, Query(alias="from", ge=0, le=2**62)] = None,
    last_event_id: Annotated[str | None, Header()] = None,
    *,
    who: Caller,
) -> EventSourceResponse:
    # 404 before the stream starts; a job's log lines are for its owner and admins
    owner = svc.jobs.row(job_id).owner
    reader = who.may_read_output(owner)
    pos = start or 0
    if last_event_id and last_event_id.isdigit():
        pos = int(last_event_id)

    async def stream() -> AsyncIterator[dict[str, Any] | bytes]:
        if not reader:  # said once, so the page and `corral job logs -f` tell why
            yield withheld_note(job_id, owner, pos)
        # the line as the supervisor wrote it (no re-encoding); a client that goes away
        # ends the stream through sse-starlette's own disconnect watch, a revoked token
        # or session through the re-check of revocable()
        # a note of the stream's own (the folded teardown: one per node, all resuming
        # at the event that ended it) is held until the next event shows whether the
        # next note shares its id: only the last of them carries it, so no id is sent
        # twice and a resume from it repeats none of them
        # (nor one the event just before them sent: a line between the teardown's
        # noise and the event that ended it ends where the notes resume)
        held: LoggedEvent | None = None
        sent = pos
        async for ev in revocable(request, svc.jobs.events(job_id, pos)):
            if held is not None:
                shared = ev is not None and not ev.raw and ev.next_pos == held.next_pos
                with_id = not shared and held.next_pos != sent
                yield _note(held, with_id=with_id)
                sent = held.next_pos if with_id else sent
                held = None
            if ev is None:
                yield REVOKED_EVENT
                return
            kind = str(ev.data.get("kind", "message"))
            if kind in OUTPUT_EVENTS and not reader:
                continue
            if ev.raw:
                yield _frame(ev.next_pos, kind, ev.raw)
                sent = ev.next_pos
            else:
                held = ev
        if held is not None:
            yield _note(held, with_id=held.next_pos != sent)

    return EventSourceResponse(stream(), ping=15)


def withheld_note(job_id: str, owner: str | None, pos: int) -> dict[str, Any]:
    """The message that opens the stream of a reader who may not see the output."""
    text = (
        f"the output of job {job_id} is shown to its owner ({owner or 'nobody'}) and "
        "admins only: its log lines are left out"
    )
    data = {"kind": "message", "job_id": job_id, "time": time.time(), "text": text}
    return {"id": str(pos), "event": "message", "data": json.dumps({**data, "level": "info"})}


def _note(ev: LoggedEvent, *, with_id: bool) -> dict[str, Any]:
    """A note of the stream's own as an SSE event (``with_id``: it carries its resume
    position)."""
    note: dict[str, Any] = {"event": str(ev.data.get("kind", "message"))}
    if with_id:
        note["id"] = str(ev.next_pos)
    return note | {"data": json.dumps(ev.data)}


@functools.lru_cache(maxsize=512)
def _frame(next_pos: int, kind: str, raw: bytes) -> bytes:
    """An event's SSE frame, encoded once for all the streams of its job: they are
    handed the same line by the job's one reader (``corral.service.fanout``)."""
    data = raw.decode("utf-8", "replace")
    sep = EventSourceResponse.DEFAULT_SEPARATOR
    return ServerSentEvent(data, id=str(next_pos), event=kind, sep=sep).encode()
