"""What a job's typed events mean to the people watching it: pure, no I/O.

:func:`notices` maps one event of :mod:`corral.job.events` (and the job as it is
after the event was folded in) to the notices it is worth:

- ``started``: the job's first attempt runs (every rank started);
- ``queued_started``: the same, for a job that waited in the queue;
- ``finished``: the job ended, with its final state (every end: succeeded,
  failed, timed out, cancelled, lost);
- ``failed``: it ended without success (failed, timed out, lost), with the final
  state and the root cause (host, rank, message); a cancelled job is only ``finished``;
- ``hang``: hang detection found no progress (before the job is stopped);
- ``host_lost``: a node stopped answering ("lost host H: ..."), or, in-place recovery,
  a replica group was torn down, with what took it down ("lost replica group 2 on
  H: rank 3 on H killed by SIGKILL": the host itself may be healthy);
- ``restarted``: a new attempt started after a failure;
- ``healed``: in-place recovery: a lost node's group trains again.

``finished`` and ``failed`` are the two *terminal* notices: a target gets exactly
one of them per job (:func:`for_target`): ``failed`` when it asked for it and the
job ended without success, else ``finished``. Each notice's text names the job by
its ``--name`` and id ("job train-a (j1) ...") when it has a name.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
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
TERMINAL = ("finished", "failed")
"""The notices of a job's end; a target gets one of them (:func:`for_target`)."""


@dataclass(frozen=True)
class JobFacts:
    """The job as the store has it once the event is folded in."""

    id: str
    state: str
    name: str | None = None  # the job's --name (None: none given)
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
    label = _label(job)
    match event:
        case StateChanged(state=JobState.RUNNING, attempt=0):
            found.append(("started", f"job {label} started", {"attempt": 0}))
            if job.queued is not None:
                waited = max(0.0, event.time - job.queued)
                found.append(
                    (
                        "queued_started",
                        f"job {label} started after {duration(waited)} in the queue",
                        {"waited_s": round(waited, 1)},
                    )
                )
        case AttemptStarted() if event.number > 0:
            where = f" from {event.checkpoint}" if event.checkpoint else ""
            text = (
                f"job {label} restarted: attempt {event.number} on "
                f"{len(event.hosts)} host{'s' if len(event.hosts) != 1 else ''}{where}"
            )
            data = {"attempt": event.number, "hosts": list(event.hosts)}
            found.append(("restarted", text, {**data, "checkpoint": event.checkpoint}))
        case NodeChanged(state=NodeState.LOST):
            detail = f": {event.detail}" if event.detail else ""
            text = f"job {label} lost host {event.host}{detail}"
            data = {"host": event.host, "lost": "host", "detail": event.detail}
            found.append(("host_lost", text, data))
        case GroupChanged(change="lost"):
            # the group was torn down for what its detail says (a rank that died, a
            # hang, the host gone): the host itself may be healthy
            why = f": {event.detail}" if event.detail else ""
            text = f"job {label} lost replica group {event.group} on {event.host}{why}"
            data = {"host": event.host, "lost": "group", "group": event.group}
            found.append(("host_lost", text, {**data, "detail": event.detail}))
        case GroupChanged(change="rejoined"):
            peer = f" (healed from {event.healed_from})" if event.healed_from else ""
            at = f" at step {event.step}" if event.step is not None else ""
            text = f"job {label} healed: {event.host} trains again{at}{peer}"
            data = {"host": event.host, "step": event.step, "healed_from": event.healed_from}
            found.append(("healed", text, data))
        case Message(level="error") if event.text.startswith(HANG_PREFIX):
            found.append(("hang", f"job {label}: {event.text}", {"message": event.text}))
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
    label = _label(job)
    text = f"job {label} finished: {how}" + (f" (exit code {code})" if code is not None else "")
    data: dict[str, Any] = {"state": state.value, "exit_code": code, "reason": job.reason}
    out: list[tuple[str, str, dict[str, Any]]] = [("finished", text, data)]
    if state in _UNSUCCESSFUL:
        cause = dict(job.root_cause or {"message": job.reason})
        cause.pop("log_tail", None)  # the rank's output stays on the server
        message = str(cause.get("message") or job.reason or how)
        where = _where(cause)
        failed = f"job {label} {how}: {where}{message}"
        out.append(("failed", failed, {**data, "root_cause": cause}))
    return out


def for_target(found: Sequence[Notice], wanted: Collection[str]) -> list[Notice]:
    """The notices of ``found`` a target that asked for ``wanted`` gets, in order:
    at most one terminal notice, ``failed`` when it asked for it and there is one,
    else ``finished``."""
    picked = [n for n in found if n.event in wanted]
    ends = [n for n in picked if n.event in TERMINAL]
    if len(ends) > 1:
        keep = next((n for n in ends if n.event == "failed"), ends[0])
        picked = [n for n in picked if n.event not in TERMINAL or n is keep]
    return picked


def _label(job: JobFacts) -> str:
    return f"{job.name} ({job.id})" if job.name and job.name != job.id else job.id


def _where(cause: dict[str, Any]) -> str:
    host, rank = cause.get("host"), cause.get("rank")
    if host is None:
        return ""
    message = str(cause.get("message") or "")
    if str(host) in message:  # the message names it already ("lost host gpu2: ...")
        return ""
    return f"rank {rank} on {host}: " if rank is not None else f"{host}: "


def duration(seconds: float) -> str:
    """``seconds`` for a reader, to the second below an hour ("45 s", "2 min 30 s",
    "3 min"), to the minute above ("1 h 5 min")."""
    total = round(max(0.0, seconds))
    if total < 120:
        return f"{total} s"
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    return f"{minutes} min {secs} s" if secs else f"{minutes} min"
