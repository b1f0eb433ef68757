"""What a tracker backend is given: a run's parameters, its metric points, its end.

A :class:`Tracker` is called from the forwarding thread only (never from the
job's event loop), one call at a time, with batches of points; it may block
(network) and may raise: the forwarder turns an error into one warning line.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from corral.track.targets import TrackTarget

ParamValue = str | int | float


@dataclass(frozen=True)
class RunInfo:
    """The job a tracker run stands for."""

    job_id: str
    params: Mapping[str, ParamValue]
    job_dir: Path  # <run_dir>/<job id> on the coordinator (W&B's offline files go there)
    name: str | None = None  # the job's --name
    owner: str | None = None  # who submitted it (corral run: the local user)

    @property
    def title(self) -> str:
        """The run's name in a tracker: the job's name, else its id."""
        return self.name or self.job_id


@dataclass(frozen=True)
class Point:
    """One metric value at a step (``time``: seconds since the epoch)."""

    name: str
    value: float
    step: int
    time: float


@dataclass(frozen=True)
class FinalState:
    """How the job ended."""

    state: str  # a JobState value: succeeded, failed, timed_out, cancelled, ...
    exit_code: int
    attempts: int = 1
    reason: str = ""
    summary: Mapping[str, ParamValue] = field(default_factory=dict)

    @property
    def succeeded(self) -> bool:
        """Whether the job succeeded."""
        return self.state == "succeeded"


class Tracker(Protocol):
    """One backend's run of one job."""

    target: TrackTarget

    def start(self, run: RunInfo) -> None:
        """Open the run and record its parameters."""

    def log(self, points: Sequence[Point]) -> None:
        """Record a batch of metric points (steps may repeat or go back: a restart)."""

    def finish(self, final: FinalState) -> None:
        """Record the final state and close the run (every point written)."""
