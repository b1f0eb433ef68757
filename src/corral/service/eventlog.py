"""A job's ``events.jsonl``: what its supervisor process tells the server.

The supervisor process (:mod:`corral.service.launch`) appends one JSON object
per engine event to ``<run_dir>/<job_id>/events.jsonl`` (0600), log chunks
included; the server reads it from a byte offset. An event's byte offset is its
id: the server stores the structured events under it, the SSE stream sends it as
``id:`` and resumes from ``Last-Event-ID``, and ``local_job_output`` pages the
merged output by it. Only whole lines are ever read, so a reader never sees a
half-written event.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from corral.job.events import (
    Checked,
    Finished,
    JobEvent,
    LogLines,
    json_of,
)
from corral.private import append_private, write_private

EVENTS_FILE = "events.jsonl"
SUPERVISOR_FILE = "supervisor.json"


def event_json(event: JobEvent) -> dict[str, Any]:
    """One engine event as a JSON-able dict (``kind`` says which)."""
    if isinstance(event, LogLines):
        return {
            "kind": "log",
            "time": event.time,
            "host": event.host,
            "rank": event.rank,
            "text": event.data.decode("utf-8", "replace"),
        }
    if isinstance(event, Checked):
        report = event.report
        return {
            "kind": "checked",
            "time": event.time,
            "blocking": event.blocking,
            "report": report.to_json() if hasattr(report, "to_json") else str(report),
        }
    if isinstance(event, Finished):
        from corral.job.engine import result_json

        return {
            "kind": "finished",
            "time": event.time,
            "state": event.state.value,
            "exit_code": event.exit_code,
            "result": result_json(event.result),
        }
    return json_of(event)


class EventWriter:
    """A job subscriber appending every event to ``events.jsonl`` (created 0600).

    Lines are written whole and flushed per event, so the server (another process)
    sees each as soon as it happened."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fh: IO[bytes] = append_private(path)

    def on_event(self, event: JobEvent) -> None:
        """Append ``event`` (the :data:`~corral.job.events.Subscriber` signature)."""
        self.write(event_json(event))

    def write(self, data: dict[str, Any]) -> int:
        """Append one JSON object as one line; the byte offset where it starts."""
        line = json.dumps(data, separators=(",", ":"), default=str).encode() + b"\n"
        pos = os.fstat(self._fh.fileno()).st_size
        self._fh.write(line)
        self._fh.flush()
        return pos

    def close(self) -> None:
        """Close the file."""
        self._fh.close()


def append_event(path: Path, data: dict[str, Any]) -> int:
    """Append one event to a job's events file whose writer is gone (the server's
    ``lost``); the byte offset where it starts."""
    path.parent.mkdir(parents=True, exist_ok=True)
    writer = EventWriter(path)
    try:
        return writer.write(data)
    finally:
        writer.close()


@dataclass(frozen=True)
class LoggedEvent:
    """One event read back: where it starts (its id), where the next one starts."""

    pos: int
    next_pos: int
    data: dict[str, Any]
    raw: bytes = b""  # the line as written (its JSON, without the newline)


def read_events(path: Path, pos: int = 0, *, max_bytes: int = 4 << 20) -> Iterator[LoggedEvent]:
    """The whole events at or after byte ``pos`` (at most about ``max_bytes`` of them);
    a line being written (no newline yet) is left for the next read. Lines that are
    not JSON (a crash mid-write) are skipped."""
    try:
        fh = open(path, "rb")  # noqa: SIM115 - closed below
    except FileNotFoundError:
        return
    with fh:
        fh.seek(pos)
        chunk = fh.read(max_bytes)
    start = 0
    while True:
        end = chunk.find(b"\n", start)
        if end < 0:
            if start == 0 and len(chunk) >= max_bytes:  # one line longer than max_bytes
                yield from read_events(path, pos, max_bytes=max_bytes * 2)
            return
        line = chunk[start:end]
        try:
            data = json.loads(line)
        except ValueError:
            data = None
        if isinstance(data, dict):
            yield LoggedEvent(pos + start, pos + end + 1, data, bytes(line))
        start = end + 1


def write_supervisor(job_dir: Path, pid: int, started: float) -> None:
    """Record the supervisor process (pid and start time) in the job dir."""
    write_private(job_dir / SUPERVISOR_FILE, json.dumps({"pid": pid, "started": started}))


def read_supervisor(job_dir: Path) -> tuple[int, float] | None:
    """The supervisor's (pid, start time) recorded in the job dir, if any."""
    try:
        data = json.loads((job_dir / SUPERVISOR_FILE).read_text())
        return int(data["pid"]), float(data["started"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
