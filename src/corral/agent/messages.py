"""Messages from a node's ranks to its agent (the control socket), validated.

Each line a rank's SDK sends on its ``ctl`` connection is one JSON object with
a ``type``: ``reports`` (what :func:`corral.sdk.report` buffered: a list of
progress reports ``[step, total, age_ms, metrics, sections_ns]``, ``sections_ns``
the timings of ``sdk.section``, forwarded one ``progress`` event each, sections in
seconds),
``progress`` (one report), ``checkpoint``
(``save_checkpoint``'s announcement, ``"ack": true`` when the rank waits for
the coordinator's answer), ``quorum`` (``sdk.fault_tolerant``'s quorum changes),
``chunk`` (``sdk.chunks``' progress) or ``exit`` (the rank wrapper's exit code).
Every event the SDK sends is one of these (a contract test holds the two halves
to it). Anything
else, or a field of the wrong type or size, is rejected with ``ValueError``.

Only validated fields are forwarded. The agent then sets the keys it owns
(:data:`AGENT_KEYS`) itself, after them: the rank is the one of the
connection, the time is the agent's, and a rank can never make its line look
like another event (``rank_exit``, ``node_exit``, ...).
"""

from __future__ import annotations

import functools
import json
import math
import time
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, TypeAdapter, ValidationError

from corral.agent.protocol import Complaints

__all__ = [
    "AGENT_KEYS",
    "MAX_MESSAGE",
    "MAX_SECTIONS",
    "CheckpointMessage",
    "ChunkMessage",
    "Complaints",
    "ExitMessage",
    "ProgressMessage",
    "QuorumMessage",
    "RankMessage",
    "ReportEntry",
    "ReportsMessage",
    "first_error",
    "forwarded",
    "parse_message",
    "report_event",
]

#: Longest line accepted from a rank (bytes, newline included).
MAX_MESSAGE = 64 * 1024
MAX_METRICS = 64
MAX_SECTIONS = 32
MAX_KEY = 128
MAX_PATH = 4096
#: Most progress reports in one ``reports`` message.
MAX_REPORTS = 1024
#: Most seconds a ``reports`` line may wait to be read: its ``sent`` is believed
#: within them (the agent reads late while busy, e.g. importing pydantic at the first).
MAX_SEND_LAG = 10.0
#: Keys of a forwarded event that only the agent sets.
AGENT_KEYS = frozenset({"event", "rank", "time"})

Step = Annotated[int, Field(ge=-(2**62), le=2**62)]
MetricName = Annotated[str, StringConstraints(min_length=1, max_length=MAX_KEY)]
Seconds = Annotated[float, Field(ge=0, le=1e7)]
Count = Annotated[int, Field(ge=0, le=2**31)]


class _Message(BaseModel):
    """Strict types, no NaN; unknown keys (e.g. the SDK's own ``rank``/``time``) are dropped."""

    model_config = ConfigDict(
        strict=True, extra="ignore", allow_inf_nan=False, frozen=True, defer_build=True
    )


Metrics = Annotated[dict[MetricName, float | None], Field(max_length=MAX_METRICS)]
#: ``sdk.section`` timings since the previous report: mean seconds per section.
Sections = Annotated[dict[MetricName, Seconds], Field(max_length=MAX_SECTIONS)]


class ProgressMessage(_Message):
    """``report(step, total, **metrics)``: how far a rank is."""

    type: Literal["progress"]
    step: Step
    total: Step | None = None
    metrics: Metrics = Field(default_factory=dict)
    sections: Sections = Field(default_factory=dict)


Nanoseconds = Annotated[int, Field(ge=0, le=10**16)]
#: One report of a ``reports`` message: ``[step, total, age, metrics, sections]``,
#: ``age`` the milliseconds it waited in the rank's buffer before it was sent,
#: ``sections`` the mean nanoseconds per section (sent as integers: cheaper to print).
ReportEntry = tuple[
    Step,
    Step | None,
    Count,
    Metrics,
    Annotated[dict[MetricName, Nanoseconds], Field(max_length=MAX_SECTIONS)] | None,
]


class ReportsMessage(_Message):
    """The progress reports a rank's SDK buffered since its previous send, in order;
    ``dropped``: how many invalid ones the agent left out (see :func:`parse_message`)."""

    type: Literal["reports"]
    reports: Annotated[list[ReportEntry], Field(min_length=1, max_length=MAX_REPORTS)]
    dropped: Count = 0
    #: the rank's clock (the node's) when the SDK took the batch, the ages' origin
    sent: float | None = None


class CheckpointMessage(_Message):
    """A checkpoint a rank saved; with ``ack`` it waits for a ``replicated`` reply."""

    type: Literal["checkpoint"]
    step: Step
    path: Annotated[str, StringConstraints(min_length=1, max_length=MAX_PATH)]
    ack: bool = False


class QuorumMessage(_Message):
    """A replica group's quorum changed (``sdk.fault_tolerant``, see
    docs/fault-tolerance.md): ``kind`` ``quorum``, ``healing`` or ``sending``."""

    type: Literal["quorum"]
    kind: Literal["quorum", "healing", "sending"]
    group: Count
    step: Step
    participants: Count | None = None
    participating: bool | None = None


class ChunkMessage(_Message):
    """``sdk.chunks``: chunk ``chunk`` of ``total`` is done (``percent`` of them)."""

    type: Literal["chunk"]
    chunk: Annotated[int, Field(ge=1, le=2**31)]
    total: Annotated[int, Field(ge=1, le=2**31)]
    percent: Annotated[int, Field(ge=0, le=100)]


class ExitMessage(_Message):
    """The rank wrapper's exit code (kept by the agent, never forwarded as such)."""

    type: Literal["exit"]
    code: Annotated[int, Field(ge=-255, le=255)]


#: What a message may become: ``report`` events for the coordinator.
Forwardable = ProgressMessage | ReportsMessage | CheckpointMessage | QuorumMessage | ChunkMessage
AnyMessage = Forwardable | ExitMessage
RankMessage = Annotated[AnyMessage, Field(discriminator="type")]


@functools.cache
def _adapter() -> TypeAdapter[AnyMessage]:
    """The validator, built on first use (building every model costs ~0.1 s of CPU,
    which a process that never validates, or not yet, should not pay at import)."""
    return TypeAdapter(RankMessage, config=ConfigDict(defer_build=True))


@functools.cache
def _entry_adapter() -> TypeAdapter[ReportEntry]:
    return TypeAdapter(ReportEntry, config=ConfigDict(strict=True, allow_inf_nan=False))


def first_error(exc: ValidationError, limit: int = 200) -> str:
    """The first problem of a validation error on one short printable line."""
    error = exc.errors(include_url=False, include_input=False)[0]
    where = ".".join(str(part) for part in error["loc"])
    text = f"{where}: {error['msg']}" if where else str(error["msg"])
    if len(text) > limit:
        text = text[:limit] + "..."
    return "".join(c if c.isprintable() else "?" for c in text)


def parse_message(line: bytes) -> AnyMessage:
    """Validate one line from a rank; ValueError with a short reason when it is invalid.

    A ``reports`` message with some invalid reports keeps its valid ones (each report
    is judged alone, as when each was a line of its own), ``dropped`` counting the rest.
    """
    if len(line) > MAX_MESSAGE:
        raise ValueError(f"message of {len(line)} bytes (at most {MAX_MESSAGE})")
    try:
        return _adapter().validate_json(line)
    except ValidationError as exc:
        kept = _valid_reports(line)
        if kept is None:
            raise ValueError(first_error(exc)) from None
        return kept


def _valid_reports(line: bytes) -> ReportsMessage | None:
    """The valid reports of an invalid ``reports`` line (None: not one, or none valid)."""
    try:
        data = json.loads(line)
    except ValueError:
        return None
    if not isinstance(data, dict) or data.get("type") != "reports":
        return None
    entries = data.get("reports")
    if not isinstance(entries, list) or not 0 < len(entries) <= MAX_REPORTS:
        return None
    kept = []
    for entry in entries:
        try:  # JSON mode: the same strictness as a whole line's
            kept.append(_entry_adapter().validate_json(json.dumps(entry)))
        except (ValidationError, ValueError):
            continue
    if not kept:
        return None
    sent = data.get("sent")
    if isinstance(sent, bool) or not isinstance(sent, int | float) or not math.isfinite(sent):
        sent = None
    dropped = len(entries) - len(kept)
    return ReportsMessage(type="reports", reports=kept, dropped=dropped, sent=sent)


def report_event(
    message: ProgressMessage | CheckpointMessage | QuorumMessage | ChunkMessage,
    rank: int,
    now: float | None = None,
) -> dict[str, Any]:
    """The ``report`` event forwarded to the coordinator: the validated fields, then
    the agent's own keys (``event``, the connection's ``rank``, the agent's ``time``)."""
    fields = message.model_dump()
    if not fields.get("sections", True):
        del fields["sections"]  # no sdk.section timings in this report
    fields.update(event="report", rank=rank, time=time.time() if now is None else now)
    return fields


def forwarded(
    message: Forwardable,
    rank: int,
    now: float | None = None,
) -> list[dict[str, Any]]:
    """The ``report`` events a message becomes: one per progress report of a
    ``reports`` message (``type: progress``, as :func:`report_event` makes it for a
    ``progress`` message, timed its ``age`` before the batch's ``sent``: never after
    ``now``, when the line was read, nor more than :data:`MAX_SEND_LAG` s before it),
    else the message's own."""
    now = time.time() if now is None else now
    if not isinstance(message, ReportsMessage):
        return [report_event(message, rank, now)]
    sent = now if message.sent is None else min(now, max(now - MAX_SEND_LAG, message.sent))
    events = []
    for step, total, age, metrics, sections in message.reports:
        event: dict[str, Any] = {"type": "progress", "step": step, "total": total}
        event["metrics"] = metrics
        if sections:
            event["sections"] = {name: ns / 1e9 for name, ns in sections.items()}
        event.update(event="report", rank=rank, time=max(0.0, sent - age / 1000.0))
        events.append(event)
    return events
