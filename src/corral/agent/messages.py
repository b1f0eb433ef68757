"""Messages from a node's ranks to its agent (the control socket), validated.

Each line a rank's SDK sends on its ``ctl`` connection is one JSON object with
a ``type``: ``reports`` (what :func:`corral.sdk.report` buffered: a list of
progress reports, each with the ``sections`` timings of ``sdk.section`` and its
``age``, forwarded one event each), ``progress`` (one report), ``checkpoint``
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
    "ProgressEntry",
    "ProgressMessage",
    "QuorumMessage",
    "RankMessage",
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


class _Progress(_Message):
    """``report(step, total, **metrics)``: how far a rank is."""

    step: Step
    total: Step | None = None
    metrics: Annotated[dict[MetricName, float | None], Field(max_length=MAX_METRICS)] = Field(
        default_factory=dict
    )
    #: ``sdk.section`` timings since the previous report: mean seconds per section.
    sections: Annotated[dict[MetricName, Seconds], Field(max_length=MAX_SECTIONS)] = Field(
        default_factory=dict
    )


class ProgressMessage(_Progress):
    """One progress report."""

    type: Literal["progress"]


class ProgressEntry(_Progress):
    """A progress report in a ``reports`` message; ``age``: seconds it waited in the
    rank's buffer before it was sent."""

    age: Seconds = 0.0


class ReportsMessage(_Message):
    """The progress reports a rank's SDK buffered since its previous send, in order."""

    type: Literal["reports"]
    reports: Annotated[list[ProgressEntry], Field(min_length=1, max_length=MAX_REPORTS)]


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


def first_error(exc: ValidationError, limit: int = 200) -> str:
    """The first problem of a validation error on one short printable line."""
    error = exc.errors(include_url=False, include_input=False)[0]
    where = ".".join(str(part) for part in error["loc"])
    text = f"{where}: {error['msg']}" if where else str(error["msg"])
    if len(text) > limit:
        text = text[:limit] + "..."
    return "".join(c if c.isprintable() else "?" for c in text)


def parse_message(line: bytes) -> AnyMessage:
    """Validate one line from a rank; ValueError with a short reason when it is invalid."""
    if len(line) > MAX_MESSAGE:
        raise ValueError(f"message of {len(line)} bytes (at most {MAX_MESSAGE})")
    try:
        return _adapter().validate_json(line)
    except ValidationError as exc:
        raise ValueError(first_error(exc)) from None


def report_event(
    message: ProgressMessage | ProgressEntry | CheckpointMessage | QuorumMessage | ChunkMessage,
    rank: int,
    now: float | None = None,
) -> dict[str, Any]:
    """The ``report`` event forwarded to the coordinator: the validated fields, then
    the agent's own keys (``event``, the connection's ``rank``, the agent's ``time``)."""
    fields = message.model_dump(exclude={"age"})
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
    ``reports`` message (``type: progress``, timed its ``age`` before ``now``), else
    the message's own (:func:`report_event`)."""
    now = time.time() if now is None else now
    if not isinstance(message, ReportsMessage):
        return [report_event(message, rank, now)]
    events = []
    for entry in message.reports:
        event = report_event(entry, rank, max(0.0, now - entry.age))
        event["type"] = "progress"
        events.append(event)
    return events
