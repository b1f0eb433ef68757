"""The parts of a job's status (:class:`corral.service.models.DistributedJobStatus`):
its nodes, the replica groups' changes, the stragglers named and the last hang report."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from corral.job.events import OddRank, StuckCollective


class NodeStatus(BaseModel):
    """One node of a distributed job (seed's per-node status)."""

    host: str
    machine_id: str | None
    node_rank: int
    ranks: list[int]
    status: str
    detail: str
    start_time: float | None
    end_time: float | None
    progress: dict[str, Any]


class GroupChange(BaseModel):
    """A change of a node's replica group (``recovery: in-place``): ``lost`` (torn down,
    the others train on), ``restarting`` (started again on ``host``), ``rejoined`` (at
    ``step``, ``healed_from`` a live peer), ``continuing`` (the others go on without it),
    ``fallback`` (the whole job restarts from the disk checkpoint)."""

    time: float
    host: str
    group: int
    change: str
    participants: int = Field(description="Live replica groups after the change.")
    step: int | None = None
    healed_from: str | None = None
    detail: str = ""


class StragglerOut(BaseModel):
    """A rank named a straggler (the supervisor's :class:`~corral.job.events.StragglerFound`,
    the latest per rank and section): its ``section`` took ``ratio`` times the ``basis``
    (``median`` of the other ranks, or its own ``best``) for ``span`` steps up to ``step``."""

    host: str
    rank: int
    section: str
    ratio: float
    basis: Literal["median", "best"]
    span: int
    step: int | None = None
    text: str = Field("", description="The live line corral run prints.")
    time: float


class HangOut(BaseModel):
    """The job's last hang report (:class:`~corral.job.events.HangReported`)."""

    time: float
    summary: str = Field(description="The one line that names the cause.")
    message: str = Field("", description="What the hang detection saw.")
    odd: list[OddRank] = Field(
        default_factory=list, description="The odd ones out: ranks not where the others are."
    )
    collective: StuckCollective | None = Field(
        None, description="The collective the NCCL flight recorder names (GPU jobs)."
    )
    report: str | None = Field(None, description="Path of report.md (report.json beside it).")
