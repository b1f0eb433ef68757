"""What a running job tells its subscribers (the terminal, the server's store).

The engine emits one typed event per thing that happened, in order, to every
subscriber (``Job.subscribe``): state changes of the job and its nodes, per-rank
progress, chunks of log lines, corral's own messages, the pre-flight report,
attempts starting and ending, and finally the result. Subscribers must be quick
(they run on the engine's event loop); log lines arrive as whole-line chunks of
one rank (a chunk may end in ``\\r``: a progress bar's update, see
:mod:`corral.agent.protocol`).

Events are frozen dataclasses, made by the engine without pydantic (a launch does
not wait for its import); reading one back from JSON (:func:`decode_event`)
validates it with pydantic, and :func:`json_of` writes it.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from corral.job.states import JobState, NodeState
from corral.outcomes import EXIT_LOST
from corral.outcomes import Level as Level  # how a message matters (a leaf, for recovery/)

if TYPE_CHECKING:
    from pydantic import TypeAdapter


@dataclass(frozen=True, kw_only=True)
class JobEvent:
    """Base of every event: which job, when (the coordinator's clock)."""

    job_id: str
    time: float = field(default_factory=time.time)


@dataclass(frozen=True, kw_only=True)
class StateChanged(JobEvent):
    """The job moved from ``old`` to ``state`` (see :mod:`corral.job.states`)."""

    kind: Literal["state"] = "state"
    old: JobState
    state: JobState
    attempt: int = 0
    reason: str = ""


@dataclass(frozen=True, kw_only=True)
class NodeChanged(JobEvent):
    """A node (host) of the current attempt changed state."""

    kind: Literal["node"] = "node"
    host: str
    state: NodeState
    detail: str = ""


@dataclass(frozen=True, kw_only=True)
class RankExited(JobEvent):
    """A rank ended with ``code`` (None: no status, negative: killed by that signal);
    ``last`` when every rank of its node has now ended."""

    kind: Literal["rank_exit"] = "rank_exit"
    host: str
    rank: int
    code: int | None = None
    last: bool = False


@dataclass(frozen=True, kw_only=True)
class Progress(JobEvent):
    """A rank's progress report (``corral.sdk.report``); ``gpu``: its GPU's last
    sample on a host with NVIDIA GPUs (``index``, ``util`` %, ``mem_used_mib``,
    ``mem_total_mib``, ``temp_c``: :mod:`corral.agent.gpusample`)."""

    kind: Literal["progress"] = "progress"
    host: str
    rank: int
    step: int | None = None
    total: int | None = None
    metrics: dict[str, Any] = field(default_factory=dict)
    gpu: dict[str, Any] | None = None


GPU_KEY = "gpu"
"""Where the store keeps a rank's last :attr:`Progress.gpu` in its metrics."""


@dataclass(frozen=True, kw_only=True)
class LogLines(JobEvent):
    """A chunk of one rank's output (``rank`` -1: the node's own output, e.g. torchrun's).

    ``data`` holds whole lines (ending in ``\\n``), or ends in ``\\r`` when a progress
    bar updated its line."""

    kind: Literal["log"] = "log"
    host: str
    rank: int
    data: bytes


@dataclass(frozen=True, kw_only=True)
class Message(JobEvent):
    """One line of corral's own (status, warnings, the reason a job stops)."""

    kind: Literal["message"] = "message"
    text: str
    level: Level = "info"


@dataclass(frozen=True, kw_only=True)
class Checked(JobEvent):
    """The pre-flight checklist ran: ``report`` is its
    :class:`~corral.checks.result.ChecklistReport`; ``blocking`` when it refused the
    launch."""

    kind: Literal["checked"] = "checked"
    report: Any
    blocking: bool = False


@dataclass(frozen=True, kw_only=True)
class AttemptStarted(JobEvent):
    """Attempt ``number`` starts on ``hosts`` with ``world_size`` ranks;
    ``workload_weights`` are this attempt's (one per planned rank, in host order then
    local rank; empty for an even split), which ``--rebalance`` may change at a restart."""

    kind: Literal["attempt_started"] = "attempt_started"
    number: int
    hosts: list[str]
    world_size: int
    checkpoint: str | None = None
    log_dir: str = ""
    launcher: str = ""
    workload_weights: list[float] = field(default_factory=list)


@dataclass(frozen=True, kw_only=True)
class AttemptEnded(JobEvent):
    """Attempt ``number`` ended; ``record`` is its
    :class:`~corral.recovery.restart.AttemptRecord` as JSON; ``restart`` says
    whether another attempt follows and ``decision`` why (or why not)."""

    kind: Literal["attempt_ended"] = "attempt_ended"
    number: int
    record: dict[str, Any]
    restart: bool = False
    decision: str = ""


@dataclass(frozen=True, kw_only=True)
class GroupChanged(JobEvent):
    """``--recovery in-place``: a node's replica group changed (``lost``: torn down,
    the others go on; ``restarting``: started again on ``host``; ``rejoined``: it
    trains again at ``step``, ``healed_from`` the live peer it healed from;
    ``continuing``: the others go on without it; ``fallback``: the attempt ends and
    the whole job restarts from the disk checkpoint). ``participants`` is the number
    of live groups after the change (the ``/metrics`` gauge)."""

    kind: Literal["group"] = "group"
    host: str
    group: int
    change: Literal["lost", "restarting", "rejoined", "continuing", "fallback"]
    participants: int
    step: int | None = None
    healed_from: str | None = None
    detail: str = ""


@dataclass(frozen=True, kw_only=True)
class StragglerFound(JobEvent):
    """A rank the job waits for (:mod:`corral.diagnose.stragglers`): its ``section``
    took ``ratio`` times the ``basis`` (``median`` of the other ranks, or its own
    ``best``) for ``span`` steps up to ``step``; ``text`` is the live line."""

    kind: Literal["straggler"] = "straggler"
    host: str
    rank: int
    section: str
    ratio: float
    basis: Literal["median", "best"]
    span: int
    step: int | None = None
    text: str = ""


@dataclass(frozen=True, kw_only=True)
class OddRank:
    """A rank of a hang report whose stack differs from the majority's: ``where`` it
    is (the collective site, or its innermost frames), ``frames`` innermost first,
    ``waiting`` when that place is collective machinery."""

    host: str
    rank: int
    where: str = ""
    frames: list[str] = field(default_factory=list)
    waiting: bool = False


@dataclass(frozen=True, kw_only=True)
class MismatchedRank:
    """A rank that was in another ``collective`` at the stuck one's place."""

    rank: int
    collective: str


@dataclass(frozen=True, kw_only=True)
class StuckCollective:
    """The flight recorder's finding (NCCL's or gloo's): the first ``collective`` (its
    ``sequence`` number in process ``group``) that ``missing_ranks`` never entered, or
    that the ``mismatched`` ranks entered as another collective."""

    collective: str
    sequence: int
    group: str = ""
    state: str = ""
    missing_ranks: list[int] = field(default_factory=list)
    expected_ranks: list[int] = field(default_factory=list)
    mismatched: list[MismatchedRank] = field(default_factory=list)


@dataclass(frozen=True, kw_only=True)
class HangReported(JobEvent):
    """The hang report was written (:mod:`corral.diagnose.hangreport`), once per hang:
    its one-line ``summary``, the detection's ``message``, the ``odd`` ranks out, the
    ``collective`` the flight recorder names and ``report``, the path of
    ``report.md`` (``report.json`` beside it; None when it could not be written)."""

    kind: Literal["hang_report"] = "hang_report"
    summary: str
    message: str = ""
    odd: list[OddRank] = field(default_factory=list)
    collective: StuckCollective | None = None
    report: str | None = None

    @classmethod
    def of(cls, job_id: str, report: Mapping[str, Any], path: str | None) -> HangReported:
        """The event of a report as :func:`corral.diagnose.hangs.hang_report` makes it."""
        flight = report.get("flight_recorder")
        return cls(
            job_id=job_id,
            summary=str(report.get("summary") or ""),
            message=str(report.get("message") or ""),
            odd=[validated(OddRank, o) for o in report.get("odd") or []],
            collective=validated(StuckCollective, flight) if flight else None,
            report=path,
        )


@dataclass(frozen=True, kw_only=True)
class Finished(JobEvent):
    """The job ended: ``result`` is the last attempt's
    :class:`~corral.job.result.JobResult` (with every attempt in ``result.attempts``)."""

    kind: Literal["finished"] = "finished"
    state: JobState
    exit_code: int
    result: Any


@dataclass(frozen=True, kw_only=True)
class LaunchFailed(JobEvent):
    """The supervisor process of a server's job could not run it (bad input, a failed
    pre-flight, a host not ready): the error's type, message and details, and the
    exit code it ends with. Written by :mod:`corral.service.launch`."""

    kind: Literal["error"] = "error"
    type: str | None = None
    message: str = ""
    details: list[Any] = field(default_factory=list)
    exit_code: int = 3


@dataclass(frozen=True, kw_only=True)
class Lost(JobEvent):
    """The server found the job's supervisor process gone without a result."""

    kind: Literal["lost"] = "lost"
    reason: str = ""
    exit_code: int = EXIT_LOST


Subscriber = Callable[[JobEvent], None]
"""Receives every event of a job, in order (``Job.subscribe``)."""

FINAL_KINDS = ("finished", "error", "lost")
"""The ``kind`` of the last event of a job's event stream."""

_DECODED: dict[str, type[JobEvent]] = {
    "state": StateChanged,
    "node": NodeChanged,
    "rank_exit": RankExited,
    "progress": Progress,
    "message": Message,
    "checked": Checked,
    "attempt_started": AttemptStarted,
    "attempt_ended": AttemptEnded,
    "finished": Finished,
    "group": GroupChanged,
    "straggler": StragglerFound,
    "hang_report": HangReported,
    "error": LaunchFailed,
    "lost": Lost,
}


def decode_event(data: Mapping[str, Any], job_id: str) -> JobEvent | None:
    """One event as JSON (a line of a job's ``events.jsonl``, an SSE message) as its
    typed model: :class:`LogLines` from its ``text``, :class:`Checked` and
    :class:`Finished` with the report and result as JSON. None for a kind this
    version does not know or a malformed event (a newer writer's)."""
    kind = data.get("kind")
    try:
        if kind == "log":
            return LogLines(
                job_id=job_id,
                time=data.get("time") or time.time(),
                host=data["host"],
                rank=data["rank"],
                data=str(data.get("text", "")).encode(),
            )
        model = _DECODED.get(str(kind))
        if model is None:
            return None
        fields = {k: v for k, v in data.items() if not (k == "time" and v is None)}
        return validated(model, {**fields, "job_id": job_id})
    except (KeyError, TypeError, ValueError):  # pydantic's ValidationError is a ValueError
        return None


_Record = TypeVar("_Record")


_ADAPTERS: dict[type[Any], TypeAdapter[Any]] = {}


def validated(record: type[_Record], data: Any) -> _Record:
    """``data`` (JSON values) as an event or a record of one, validated and coerced
    by pydantic (imported on first use: the engine makes events, it never parses them).
    Raises pydantic's ``ValidationError``."""
    adapter = _ADAPTERS.get(record)
    if adapter is None:
        from pydantic import TypeAdapter

        adapter = _ADAPTERS[record] = TypeAdapter(record)
    value: _Record = adapter.validate_python(data)
    return value


def json_of(event: JobEvent) -> dict[str, Any]:
    """``event`` as JSON values without its ``job_id``: a line of a job's
    ``events.jsonl``, which :func:`decode_event` reads back."""
    from pydantic_core import to_jsonable_python

    data: dict[str, Any] = to_jsonable_python(event, exclude={"job_id"})
    return data


def fields_of(event: JobEvent) -> dict[str, Any]:
    """``event``'s fields without its ``job_id`` (records in it as dicts)."""
    data = dataclasses.asdict(event)
    del data["job_id"]
    return data
