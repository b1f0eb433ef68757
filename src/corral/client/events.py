"""A job's live events, decoded once into the engine's typed events.

The server streams each line of the job's ``events.jsonl`` as one Server-Sent Event
(see :mod:`corral.service.eventlog` for the shape). :func:`decode` turns one into
the :mod:`corral.job.events` model of its kind with the one decoder the server's
ingest uses too (:func:`corral.job.events.decode_event`); the two kinds only the
server writes are :class:`~corral.job.events.LaunchFailed` (``error``: the job could
not start) and :class:`~corral.job.events.Lost` (``lost``: its supervisor ended
without a result).
"""

from __future__ import annotations

import json
from typing import Any

from corral.client.sse import SseEvent
from corral.job.events import Finished, JobEvent, LaunchFailed, Lost, decode_event
from corral.outcomes import EXIT_LOST

__all__ = ["EXIT_LOST", "FINAL", "LaunchFailed", "Lost", "decode", "exit_code_of_event"]

FINAL = (Finished, LaunchFailed, Lost)
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
    if not data.get("kind") and event.event:
        data = {**data, "kind": event.event}
    return decode_event(data, job_id)


def exit_code_of_event(event: JobEvent) -> int | None:
    """The job's exit code when ``event`` is its last one, else None."""
    if isinstance(event, FINAL):
        return int(event.exit_code)
    return None
