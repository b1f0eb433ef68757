"""What a job's typed events mean to the people watching it: pure, no I/O.

:func:`notices` maps one event of :mod:`corral.job.events` (and the job as it is
after the event was folded in) to the notices it is worth:

- ``started``: the job's first attempt runs (every rank started);
- ``queued_started``: the same, for a job that waited in the queue;
- ``finished``: the job ended, with its final state (every end: succeeded,
  failed, timed out, cancelled, lost);
- ``failed``: it ended without success (failed, timed out, lost), with the root
  cause (host, rank, message); a cancelled job is only ``finished``;
- ``hang``: hang detection found no progress (before the job is stopped);
- ``host_lost``: a node stopped answering (or, in-place recovery, its group was lost);
- ``restarted``: a new attempt started after a failure;
- ``healed``: in-place recovery: a lost node's group trains again.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from corral.job.events import (
    AttemptStarted,
    Finished,
    GroupChanged,
    JobEvent,
    LaunchFailed,
    Lost,
    Message,
    NodeChanged,
    StateChanged,
)
from corral.job.states import JobState, NodeState

EventName = Literal[
    "started", "queued_started", "finished", "failed", "hang", "host_lost", "restarted", "healed"
]
EVENTS: tuple[str, ...] = get_args(EventName)
"""Every notice's name, the ``events`` a target may ask for."""
HANG_PREFIX = "hang detected: "
"""How the supervisor's message of a detected hang begins (:mod:`corral.job.supervisor`)."""
_UNSUCCESSFUL = frozenset({JobState.FAILED, JobState.TIMED_OUT, JobState.LOST})


@dataclass(frozen=True)
class JobFacts:
    """The job as the store has it once the event is folded in."""

    id: str
    state: str
    owner: str | None = None
    queued: float | None = None  # when it entered the queue (None: never queued)
    reason: str = ""
    exit_code: int | None = None
    root_cause: dict[str, Any] | None = None


@dataclass(frozen=True)
class Notice:
    """One thing to tell: its name, the job, when, one line of text, the details."""

    event: str
    job_id: str
    time: float
    text: str
    data: dict[str, Any] = field(default_factory=dict)


def notices(event: JobEvent, job: JobFacts) -> list[Notice]:
    """The notices ``event`` of ``job`` is worth (most events: none)."""
    found: list[tuple[str, str, dict[str, Any]]] = []
    match event:
        case StateChanged(state=JobState.RUNNING, attempt=0):
            found.append(("started", f"job {job.id} started", {"attempt": 0}))
            if job.queued is not None:
                waited = max(0.0, event.time - job.queued)
                found.append(
                    (
                        "queued_started",
                        f"job {job.id} started after {_duration(waited)} in the queue",
                        {"waited_s": round(waited, 1)},
                    )
                )
        case AttemptStarted() if event.number > 0:
            where = f" from {event.checkpoint}" if event.checkpoint else ""
            text = (
                f"job {job.id} restarted: attempt {event.number} on "
                f"{len(event.hosts)} host{'s' if len(event.hosts) != 1 else ''}{where}"
            )
            data = {"attempt": event.number, "hosts": list(event.hosts)}
            found.append(("restarted", text, {**data, "checkpoint": event.checkpoint}))
        case NodeChanged(state=NodeState.LOST):
            detail = f": {event.detail}" if event.detail else ""
            text = f"job {job.id} lost host {event.host}{detail}"
            found.append(("host_lost", text, {"host": event.host, "detail": event.detail}))
        case GroupChanged(change="lost"):
            text = f"job {job.id} lost host {event.host} (replica group {event.group})"
            found.append(("host_lost", text, {"host": event.host, "group": event.group}))
        case GroupChanged(change="rejoined"):
            peer = f" (healed from {event.healed_from})" if event.healed_from else ""
            at = f" at step {event.step}" if event.step is not None else ""
            text = f"job {job.id} healed: {event.host} trains again{at}{peer}"
            data = {"host": event.host, "step": event.step, "healed_from": event.healed_from}
            found.append(("healed", text, data))
        case Message(level="error") if event.text.startswith(HANG_PREFIX):
            found.append(("hang", f"job {job.id}: {event.text}", {"message": event.text}))
        case Finished() | LaunchFailed() | Lost():
            found.extend(_ended(event, job))
        case _:
            pass
    return [Notice(name, job.id, event.time, text, data) for name, text, data in found]


def _ended(event: JobEvent, job: JobFacts) -> list[tuple[str, str, dict[str, Any]]]:
    code: int | None
    if isinstance(event, Finished):
        state, code = event.state, event.exit_code
    elif isinstance(event, LaunchFailed):
        state, code = JobState.FAILED, event.exit_code
    else:
        state, code = JobState.LOST, job.exit_code
    how = state.value.replace("_", " ")
    text = f"job {job.id} finished: {how}" + (f" (exit code {code})" if code is not None else "")
    data: dict[str, Any] = {"state": state.value, "exit_code": code, "reason": job.reason}
    out: list[tuple[str, str, dict[str, Any]]] = [("finished", text, data)]
    if state in _UNSUCCESSFUL:
        cause = dict(job.root_cause or {"message": job.reason})
        cause.pop("log_tail", None)  # the rank's output stays on the server
        message = str(cause.get("message") or job.reason or how)
        where = _where(cause)
        out.append(("failed", f"job {job.id} {how}: {where}{message}", {"root_cause": cause}))
    return out


def _where(cause: dict[str, Any]) -> str:
    host, rank = cause.get("host"), cause.get("rank")
    if host is None:
        return ""
    message = str(cause.get("message") or "")
    if str(host) in message:  # the message names it already ("lost host gpu2: ...")
        return ""
    return f"rank {rank} on {host}: " if rank is not None else f"{host}: "


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
