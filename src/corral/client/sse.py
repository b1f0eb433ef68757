"""Server-Sent Events: the ``text/event-stream`` of a job's live events, parsed."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass


@dataclass(frozen=True)
class SseEvent:
    """One Server-Sent Event: its id (a byte offset of the job's events file), name
    and data."""

    id: str | None
    event: str
    data: str


def parse_sse(lines: Iterable[str]) -> Iterator[SseEvent]:
    """The events of a ``text/event-stream`` given line by line (comments skipped;
    an event's id is the last ``id:`` seen, as the standard says)."""
    event_id: str | None = None
    name = "message"
    data: list[str] = []
    for line in lines:
        if not line:
            if data:
                yield SseEvent(event_id, name, "\n".join(data))
            name, data = "message", []
            continue
        if line.startswith(":"):
            continue
        field, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if field == "data":
            data.append(value)
        elif field == "event":
            name = value
        elif field == "id" and "\0" not in value:
            event_id = value
