"""The job routes of ``corral serve`` as functions: submit (plan and dispatch, or
queue), read back, follow, stop.

Statuses and plans are the server's JSON (``DistributedJobStatus``, the execution
plan); events are typed (:mod:`corral.client.events`).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any

from corral.client.events import EXIT_LOST, Lost, decode, exit_code_of_event
from corral.client.http import Client, segment
from corral.errors import CorralError, ServerUnreachable
from corral.job.events import Finished, JobEvent
from corral.job.states import TERMINAL_STATES, JobState
from corral.outcomes import EXIT_INTERRUPTED, EXIT_TIMEOUT

STATE_EXIT_CODES = {
    JobState.SUCCEEDED: 0,
    JobState.FAILED: 1,
    JobState.TIMED_OUT: EXIT_TIMEOUT,
    JobState.CANCELLED: EXIT_INTERRUPTED,
    JobState.LOST: EXIT_LOST,
}
"""Exit codes of ended jobs that carry none (as ``corral run`` exits)."""
PAGE_LINES = 2000
POLL = 0.5


def exit_code_of(status: dict[str, Any]) -> int:
    """What ``corral run`` would have exited with for this job; 0 while it runs."""
    state = str(status.get("status"))
    if state not in TERMINAL_STATES:
        return 0
    if state == JobState.LOST:
        return EXIT_LOST
    code = status.get("exit_code")
    return int(code) if code is not None else STATE_EXIT_CODES[JobState(state)]


def plan(client: Client, body: dict[str, Any]) -> dict[str, Any]:
    """Plan a job (``JobRequest`` body): ``{"job_id", "status", "execution_plan"}``."""
    planned: dict[str, Any] = client.call("POST", "/api/network/distributed/plan", json=body)
    return planned


def submit(client: Client, body: dict[str, Any]) -> dict[str, Any]:
    """Plan a job and start it; its plan. A job that cannot start is not left planned."""
    planned = plan(client, body)
    job_id = str(planned["job_id"])
    try:
        client.call("POST", "/api/network/distributed/dispatch", json={"job_id": job_id})
    except CorralError:
        with contextlib.suppress(CorralError):
            stop(client, job_id)
        raise
    execution_plan: dict[str, Any] = planned["execution_plan"]
    return execution_plan


def queue(client: Client, body: dict[str, Any], *, priority: int = 0) -> dict[str, Any]:
    """Queue a job: it starts when its machines are free (higher priority first, then
    first in first out). ``{"job_id", "status", "position", "reason", "priority"}``."""
    params = {"priority": priority} if priority else None
    queued: dict[str, Any] = client.call("POST", "/api/jobs/queue", json=body, params=params)
    return queued


def resubmit(
    client: Client, job_id: str, *, priority: int = 0, after: list[str] | None = None
) -> dict[str, Any]:
    """Queue a job again (a new job with its request): ``QueuedOut`` of the new job."""
    params: dict[str, Any] = {"priority": priority} if priority else {}
    if after:
        params["after"] = after
    queued: dict[str, Any] = client.call(
        "POST", f"/api/jobs/{segment(job_id)}/resubmit", params=params or None
    )
    return queued


def list_queue(client: Client) -> list[dict[str, Any]]:
    """The queue in its order: position, job_id, name, owner, priority, machines, reason."""
    entries: list[dict[str, Any]] = client.call("GET", "/api/queue")
    return entries


def move(
    client: Client, job_id: str, *, priority: int | None = None, top: bool = False
) -> dict[str, Any]:
    """Give a queued job a new priority, or put it at the top (admins only)."""
    body: dict[str, Any] = {"top": True} if top else {"priority": priority}
    entry: dict[str, Any] = client.call("POST", f"/api/queue/{segment(job_id)}/move", json=body)
    return entry


def status(client: Client, job_id: str) -> dict[str, Any]:
    """A job's status (``DistributedJobStatus``)."""
    data: dict[str, Any] = client.call("GET", f"/api/jobs/{segment(job_id)}")
    return data


def list_jobs(
    client: Client,
    *,
    states: str | None = None,
    limit: int = 20,
    mine: bool = False,
    owner: str | None = None,
) -> dict[str, Any]:
    """A page of jobs, newest first (``mine``: the caller's; ``owner``: that user's); a
    job made from a task and given no name of its own is named after the task (as the
    web lists it)."""
    params: dict[str, Any] = {"limit": limit}
    if states:
        params["status"] = states
    if mine:
        params["mine"] = "true"
    if owner:
        params["owner"] = owner
    page: dict[str, Any] = client.call("GET", "/api/jobs", params=params)
    if any(job.get("task_id") and not job.get("name") for job in page["jobs"]):
        names = {t["id"]: t["name"] for t in client.call("GET", "/api/tasks")}
        for job in page["jobs"]:
            if job.get("task_id") and not job.get("name"):
                job["name"] = names.get(job["task_id"])
    return page


def output(client: Client, job_id: str) -> Iterator[str]:
    """The job's merged ``[host:rank] text`` lines so far, page by page."""
    offset = 0
    while True:
        page = client.call(
            "GET",
            f"/api/network/local_job_output/{segment(job_id)}",
            params={"offset": offset, "limit": PAGE_LINES},
        )
        yield from page["lines"]
        if page["next_offset"] <= offset:
            return
        offset = page["next_offset"]


def stop(client: Client, job_id: str, *, force: bool = False) -> dict[str, Any]:
    """Stop a job on every node (a planned or queued one is cancelled): ``StopOut``."""
    answer: dict[str, Any] = client.call(
        "POST",
        f"/api/network/distributed/stop/{segment(job_id)}",
        params={"force": "true"} if force else None,
    )
    return answer


def wait_until_started(
    client: Client, job_id: str, on_wait: Callable[[dict[str, Any]], None] | None = None
) -> dict[str, Any]:
    """Wait while the job is queued; its status once it is not. ``on_wait`` sees each
    status whose waiting reason differs from the last one."""
    last_reason: str | None = None
    while True:
        data = status(client, job_id)
        if data["status"] != JobState.QUEUED:
            return data
        if on_wait is not None and data.get("reason") != last_reason:
            on_wait(data)
        last_reason = data.get("reason")
        time.sleep(POLL)


def wait_until_ended(client: Client, job_id: str, within: float = 10.0) -> dict[str, Any]:
    """The job's status once the server has recorded its end (or after ``within`` s)."""
    deadline = time.monotonic() + within
    data = status(client, job_id)
    while data["status"] not in TERMINAL_STATES and time.monotonic() < deadline:
        time.sleep(0.2)
        data = status(client, job_id)
    return data


def _ending(data: dict[str, Any]) -> JobEvent:
    """The last event of a job that ended unseen, from its status."""
    if data["status"] == JobState.LOST:
        return Lost(job_id=data["job_id"], reason=str(data.get("reason") or ""))
    return Finished(
        job_id=data["job_id"],
        state=JobState(data["status"]),
        exit_code=exit_code_of(data),
        result=None,
    )


def follow(
    client: Client, job_id: str, on_wait: Callable[[dict[str, Any]], None] | None = None
) -> Iterator[JobEvent]:
    """The job's events, typed, from its first to its last (a :class:`Finished`,
    :class:`~corral.client.events.LaunchFailed` or :class:`Lost`), live; a queued job's
    once it has started (``on_wait`` as for :func:`wait_until_started`). A stream that
    ends with no last event (the job ended unseen, or the server restarted) is
    resumed, or ended from the job's status."""
    wait_until_started(client, job_id, on_wait)
    last_id: str | None = None
    while True:
        for sse in client.events(job_id, last_id):
            last_id = sse.id or last_id
            event = decode(sse, job_id)
            if event is None:
                continue
            yield event
            if exit_code_of_event(event) is not None:
                return
        time.sleep(POLL)
        try:
            data = status(client, job_id)
        except ServerUnreachable:
            continue  # reconnecting (for a while) is the stream's to do
        if data["status"] in TERMINAL_STATES:
            yield _ending(data)
            return
