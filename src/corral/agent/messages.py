"""Messages from a node's ranks to its agent (the control socket), validated.

Each line a rank's SDK sends on its ``ctl`` connection is one JSON object with
a ``type``: ``progress`` (:func:`corral.sdk.report`, with the ``sections``
timings of ``sdk.section``), ``checkpoint``
(``save_checkpoint``'s announcement, ``"ack": true`` when the rank waits for
the coordinator's answer) or ``exit`` (the rank wrapper's exit code). Anything
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
    "Complaints",
    "ExitMessage",
    "ProgressMessage",
    "RankMessage",
    "first_error",
    "parse_message",
    "report_event",
]

#: Longest line accepted from a rank (bytes, newline included).
MAX_MESSAGE = 64 * 1024
MAX_METRICS = 64
MAX_SECTIONS = 32
MAX_KEY = 128
MAX_PATH = 4096
#: Keys of a forwarded event that only the agent sets.
AGENT_KEYS = frozenset({"event", "rank", "time"})

Step = Annotated[int, Field(ge=-(2**62), le=2**62)]
MetricName = Annotated[str, StringConstraints(min_length=1, max_length=MAX_KEY)]
Seconds = Annotated[float, Field(ge=0, le=1e7)]


class _Message(BaseModel):
    """Strict types, no NaN; unknown keys (e.g. the SDK's own ``rank``/``time``) are dropped."""

    model_config = ConfigDict(
        strict=True, extra="ignore", allow_inf_nan=False, frozen=True, defer_build=True
    )


class ProgressMessage(_Message):
    """``report(step, total, **metrics)``: how far a rank is."""

    type: Literal["progress"]
    step: Step
    total: Step | None = None
    metrics: Annotated[dict[MetricName, float | None], Field(max_length=MAX_METRICS)] = Field(
        default_factory=dict
    )
    #: ``sdk.section`` timings since the previous report: mean seconds per section.
    sections: Annotated[dict[MetricName, Seconds], Field(max_length=MAX_SECTIONS)] = Field(
        default_factory=dict
    )


class CheckpointMessage(_Message):
    """A checkpoint a rank saved; with ``ack`` it waits for a ``replicated`` reply."""

    type: Literal["checkpoint"]
    step: Step
    path: Annotated[str, StringConstraints(min_length=1, max_length=MAX_PATH)]
    ack: bool = False


class ExitMessage(_Message):
    """The rank wrapper's exit code (kept by the agent, never forwarded as such)."""

    type: Literal["exit"]
    code: Annotated[int, Field(ge=-255, le=255)]


RankMessage = Annotated[
    ProgressMessage | CheckpointMessage | ExitMessage, Field(discriminator="type")
]


@functools.cache
def _adapter() -> TypeAdapter[ProgressMessage | CheckpointMessage | ExitMessage]:
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


def parse_message(line: bytes) -> ProgressMessage | CheckpointMessage | ExitMessage:
    """Validate one line from a rank; ValueError with a short reason when it is invalid."""
    if len(line) > MAX_MESSAGE:
        raise ValueError(f"message of {len(line)} bytes (at most {MAX_MESSAGE})")
    try:
        return _adapter().validate_json(line)
    except ValidationError as exc:
        raise ValueError(first_error(exc)) from None


def report_event(
    message: ProgressMessage | CheckpointMessage, rank: int, now: float | None = None
) -> dict[str, Any]:
    """The ``report`` event forwarded to the coordinator: the validated fields, then
    the agent's own keys (``event``, the connection's ``rank``, the agent's ``time``)."""
    fields = message.model_dump()
    if not fields.get("sections", True):
        del fields["sections"]  # no sdk.section timings in this report
    fields.update(event="report", rank=rank, time=time.time() if now is None else now)
    return fields
