"""A job's live events, decoded once into the engine's typed events.

The server streams each line of the job's ``events.jsonl`` as one Server-Sent Event
(see :mod:`corral.service.eventlog` for the shape). :func:`decode` turns one into
the :mod:`corral.job.events` model of its kind; the two kinds only the server
writes are :class:`StartFailed` (``error``: the job could not start) and
:class:`Lost` (``lost``: its supervisor ended without a result).
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import Field, ValidationError

from corral.client.sse import SseEvent
from corral.job.events import (
    AttemptEnded,
    AttemptStarted,
    Checked,
    Finished,
    JobEvent,
    LogLines,
    Message,
    NodeChanged,
    Progress,
    RankExited,
    StateChanged,
)

EXIT_COULD_NOT_START = 3
EXIT_LOST = 255


class StartFailed(JobEvent):
    """The job could not start (its supervisor's ``error`` event): why, and the exit
    code ``corral run`` would have had."""

    kind: Literal["error"] = "error"
    type: str = ""
    message: str = ""
    details: list[str] = Field(default_factory=list)
    exit_code: int = EXIT_COULD_NOT_START


class Lost(JobEvent):
    """The job's supervisor ended without a result (the server's ``lost`` event)."""

    kind: Literal["lost"] = "lost"
    reason: str = ""
    exit_code: int = EXIT_LOST


MODELS: dict[str, type[JobEvent]] = {
    model.model_fields["kind"].default: model
    for model in (
        StateChanged,
        NodeChanged,
        RankExited,
        Progress,
        Message,
        Checked,
        AttemptStarted,
        AttemptEnded,
        Finished,
        StartFailed,
        Lost,
    )
}
"""The model of each event kind but ``log`` (whose text travels as text)."""
FINAL = (Finished, StartFailed, Lost)
"""The kinds of a job's last event."""


def decode(event: SseEvent, job_id: str) -> JobEvent | None:
    """The typed event of one SSE event of job ``job_id``; None for what this client
    does not know (a newer server's kind, a line that is no event)."""
    try:
        data: Any = json.loads(event.data)
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    return decode_json(data, job_id, default_kind=event.event)


def decode_json(data: dict[str, Any], job_id: str, *, default_kind: str = "") -> JobEvent | None:
    """The typed event of one line of a job's events file (a JSON object)."""
    kind = str(data.get("kind") or default_kind)
    fields = {k: v for k, v in data.items() if k != "kind"}
    try:
        if kind == "log":
            return LogLines(
                job_id=job_id,
                host=str(data.get("host", "")),
                rank=int(data.get("rank", -1)),
                data=str(data.get("text", "")).encode(),
                **({"time": data["time"]} if "time" in data else {}),
            )
        model = MODELS.get(kind)
        return None if model is None else model.model_validate({**fields, "job_id": job_id})
    except (ValidationError, ValueError, TypeError):
        return None


def exit_code_of_event(event: JobEvent) -> int | None:
    """The job's exit code when ``event`` is its last one, else None."""
    if isinstance(event, (Finished, StartFailed, Lost)):
        return int(event.exit_code)
    return None
