"""Events from a node agent to the coordinator (``j`` frames), validated.

One pydantic model per event the agent emits after a probe (the probe's answer
is read by :func:`corral.agent.probe.read_answer`), discriminated on ``event``
(``report`` events further on ``type``). :func:`parse_event` is what the
coordinator calls on each ``j`` frame: it returns the event as a plain dict
with the keys the agent sent (absent optional fields as None), or raises
``ValueError`` with one short line when the payload is not JSON, names an
unknown event, or has a field of the wrong type or size. Unknown extra keys
are dropped.
"""

from __future__ import annotations

import functools
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, TypeAdapter, ValidationError

from corral.agent.messages import (
    CheckpointMessage,
    ChunkMessage,
    ProgressMessage,
    QuorumMessage,
    first_error,
)
from corral.agent.probe import MAX_TEXT
from corral.agent.protocol import EVENT_TEXT_LIMIT, TRACE_LIMIT

__all__ = [
    "AgentEvent",
    "CheckpointReport",
    "ChunkReport",
    "HeartbeatEvent",
    "MasterReadyEvent",
    "MasterTimeoutEvent",
    "NodeExitEvent",
    "ProgressReport",
    "QuorumReport",
    "RankExitEvent",
    "RankStartEvent",
    "StacksEvent",
    "StartFailedEvent",
    "StartedEvent",
    "StoppingEvent",
    "parse_event",
]

MAX_ITEMS = 1 << 16

Text = Annotated[str, StringConstraints(max_length=MAX_TEXT)]
Rank = Annotated[int, Field(ge=0, lt=1 << 24)]
Pid = Annotated[int, Field(ge=0, lt=1 << 32)]
Port = Annotated[int, Field(ge=0, le=65535)]
Code = Annotated[int, Field(ge=-255, le=255)]  # exit status, or minus the signal
Time = Annotated[float, Field(ge=0)]


class _Event(BaseModel):
    model_config = ConfigDict(
        strict=True, extra="ignore", allow_inf_nan=False, frozen=True, defer_build=True
    )

    time: Time


class StartedEvent(_Event):
    """Every workload process of the node is started."""

    event: Literal["started"]
    pid: Pid
    pgids: Annotated[list[Pid], Field(max_length=MAX_ITEMS)]
    node_dir: Text | None = None
    hostname: Text | None = None


class RankStartEvent(_Event):
    """A rank process is known to the agent."""

    event: Literal["rank_start"]
    rank: Rank
    local_rank: Rank = 0
    pid: Pid | None = None


class RankExitEvent(_Event):
    """A rank ended (``code`` None: its status could not be learnt)."""

    event: Literal["rank_exit"]
    rank: Rank
    local_rank: Rank = 0
    pid: Pid | None = None
    code: Code | None = None
    eof_time: Time | None = None
    error: dict[str, Any] | None = None  # the rank's error file, as written by the SDK
    teardown: bool = False  # killed by a signal the agent's teardown had sent


class GpuSample(BaseModel):
    """A rank's GPU at its report (``corral.agent.gpusample``): NVML index,
    utilisation %, memory used / total MiB, temperature C (None: not supported)."""

    model_config = ConfigDict(strict=True, extra="ignore", frozen=True, defer_build=True)

    index: Annotated[int, Field(ge=0, lt=1 << 16)]
    util: Annotated[int, Field(ge=0, le=100)] | None = None
    mem_used_mib: Annotated[int, Field(ge=0)] | None = None
    mem_total_mib: Annotated[int, Field(ge=0)] | None = None
    temp_c: Annotated[int, Field(ge=-100, le=300)] | None = None


class ProgressReport(ProgressMessage):
    """A rank's progress report, forwarded by the agent (``gpu``: its GPU's last
    sample, on hosts with NVIDIA GPUs and NVML)."""

    event: Literal["report"]
    rank: Rank
    time: Time
    gpu: GpuSample | None = None


class CheckpointReport(CheckpointMessage):
    """A rank's checkpoint announcement, forwarded by the agent."""

    event: Literal["report"]
    rank: Rank
    time: Time


class QuorumReport(QuorumMessage):
    """A replica group's quorum change, forwarded by the agent."""

    event: Literal["report"]
    rank: Rank
    time: Time


class ChunkReport(ChunkMessage):
    """A finished chunk of ``sdk.chunks``, forwarded by the agent."""

    event: Literal["report"]
    rank: Rank
    time: Time


class StackEntry(BaseModel):
    """One rank's stack dump in a ``stacks`` event."""

    model_config = ConfigDict(strict=True, extra="ignore", frozen=True, defer_build=True)

    rank: Rank
    pid: Pid
    method: Literal["py-spy", "faulthandler", "none"]
    text: Annotated[str, StringConstraints(max_length=EVENT_TEXT_LIMIT + 1024)]
    error: Text | None = None
    trace: Annotated[str, StringConstraints(max_length=TRACE_LIMIT // 3 * 4 + 8)] | None = None
    trace_error: Text | None = None


class StacksEvent(_Event):
    """The answer to a ``dump`` op."""

    event: Literal["stacks"]
    stacks: Annotated[list[StackEntry], Field(max_length=MAX_ITEMS)]


class MasterReadyEvent(_Event):
    """The master's rendezvous port accepts connections."""

    event: Literal["master_ready"]
    addr: Text
    port: Port


class MasterTimeoutEvent(_Event):
    """The master's port did not accept connections in time."""

    event: Literal["master_timeout"]
    addr: Text
    port: Port
    timeout: Annotated[float, Field(ge=0)]


class StartFailedEvent(_Event):
    """The node could not be started."""

    event: Literal["start_failed"]
    error: Text
    host: Text | None = None


class StoppingEvent(_Event):
    """The agent began tearing the node down."""

    event: Literal["stopping"]
    reason: Text


class HeartbeatEvent(_Event):
    """The agent is alive."""

    event: Literal["hb"]


class NodeExitEvent(_Event):
    """The agent's last event: every rank's code and the launcher's."""

    event: Literal["node_exit"]
    ranks: Annotated[dict[str, Code | None], Field(max_length=MAX_ITEMS)] = {}
    code: Code = 0


ReportEvent = Annotated[
    ProgressReport | CheckpointReport | QuorumReport | ChunkReport, Field(discriminator="type")
]
AgentEvent = Annotated[
    StartedEvent
    | RankStartEvent
    | RankExitEvent
    | ReportEvent
    | StacksEvent
    | MasterReadyEvent
    | MasterTimeoutEvent
    | StartFailedEvent
    | StoppingEvent
    | HeartbeatEvent
    | NodeExitEvent,
    Field(discriminator="event"),
]


@functools.cache
def _adapter() -> TypeAdapter[BaseModel]:
    """The validator, built on first use (building every model costs ~0.1 s of CPU,
    which a process that never validates, or not yet, should not pay at import)."""
    return TypeAdapter(AgentEvent, config=ConfigDict(defer_build=True))


def _reason(exc: ValidationError) -> str:
    error = exc.errors(include_url=False, include_input=False)[0]
    if error["type"] in ("union_tag_invalid", "union_tag_not_found") and len(error["loc"]) <= 1:
        key = "type" if error["loc"] else "event"
        tag = str((error.get("ctx") or {}).get("tag", ""))[:60]
        if error["type"] == "union_tag_not_found":
            return f"no {key!r}" if not error["loc"] else f"{error['loc'][0]}: no {key!r}"
        prefix = f"{error['loc'][0]}: " if error["loc"] else ""
        return f"{prefix}unknown {key} {tag!r}"
    return first_error(exc)


def parse_event(payload: bytes | str) -> dict[str, Any]:
    """Validate one agent event (a ``j`` frame's payload) and return it as a dict.

    Raises ValueError("invalid agent event: <why>") for anything else.
    """
    try:
        model = _adapter().validate_json(payload)
    except ValidationError as exc:
        raise ValueError(f"invalid agent event: {_reason(exc)}") from None
    return model.model_dump()
