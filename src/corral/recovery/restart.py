"""Restart policy and the record of a job's attempts (pure, apart from the JSON file).

A job runs as attempts ``0, 1, 2, ...`` (``CORRAL_ATTEMPT``). After a failed
attempt (a rank failed, a host was lost, a hang was detected) the job is
restarted when the budget allows (``--max-restarts``) and enough hosts are left
(``--min-nodes``); hosts that were lost, or do not answer the connectivity
check, are dropped and the ranks re-assigned on the rest. ``--timeout``,
Ctrl-C and launch errors (bad interpreter, missing script) are never
restarted: another attempt would end the same way.

Every attempt is appended to ``<run_dir>/<job>/attempts.json`` as it starts
and updated when it ends, so a rerun with the same ``--job-id`` (after corral
itself was killed) continues the numbering and the summary shows the whole
history.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from corral.errors import ConfigError
from corral.outcomes import AttemptOutcome
from corral.private import write_private
from corral.states import JobState, NodeState

MAX_BACKOFF = 60.0
ATTEMPTS_FILE = "attempts.json"


@dataclass(frozen=True)
class RestartPolicy:
    """``--max-restarts``, ``--restart-backoff`` and ``--min-nodes`` (the restart budget)."""

    max_restarts: int = 0
    backoff: float = 1.0
    min_nodes: int | None = None  # None: every host of the first attempt

    def __post_init__(self) -> None:
        if self.max_restarts < 0:
            raise ConfigError(
                f"must be 0 or more (got {self.max_restarts})", option="--max-restarts"
            )
        if not self.backoff >= 0:
            raise ConfigError(
                f"must be 0 or more seconds (got {self.backoff:g})", option="--restart-backoff"
            )
        if self.min_nodes is not None and self.min_nodes < 1:
            raise ConfigError(f"must be at least 1 (got {self.min_nodes})", option="--min-nodes")

    def delay(self, restart: int) -> float:
        """Seconds to wait before restart number ``restart`` (1-based): the backoff,
        doubled for each further restart, at most MAX_BACKOFF."""
        if self.backoff <= 0:
            return 0.0
        return float(min(MAX_BACKOFF, self.backoff * 2 ** max(0, restart - 1)))


@dataclass
class AttemptRecord:
    """One attempt of a job, for the summary and ``attempts.json``."""

    number: int
    hosts: list[str]
    world_size: int
    started: float
    ended: float | None = None
    state: str = JobState.RUNNING.value
    exit_code: int | None = None
    cause: str = ""
    host: str | None = None  # where the root cause happened
    rank: int | None = None
    lost: list[str] = field(default_factory=list)
    checkpoint: str | None = None  # what this attempt's rank 0 resumed from, if corral placed it

    @property
    def duration(self) -> float | None:
        """Seconds the attempt ran (None while running)."""
        return None if self.ended is None else max(0.0, self.ended - self.started)

    def finish(self, result: AttemptOutcome) -> None:
        """Fill in the outcome from the attempt's result."""
        self.ended = result.ended
        self.state = result.state.value
        self.exit_code = result.exit_code
        cause = result.root_cause
        if result.state == JobState.SUCCEEDED:
            self.cause = JobState.SUCCEEDED.value
        elif cause is not None and result.state == JobState.FAILED:
            self.cause, self.host, self.rank = cause.message, cause.host, cause.rank
        else:
            self.cause = result.reason or result.state.value
        self.lost = [n.host.name for n in result.nodes if n.state == NodeState.LOST]


class AttemptLog:
    """The attempts of one job id, kept in ``<job_dir>/attempts.json``."""

    def __init__(self, path: Path, records: Sequence[AttemptRecord] = ()) -> None:
        self.path = path
        self.records = list(records)

    @classmethod
    def load(cls, job_dir: Path) -> AttemptLog:
        """Earlier attempts of this job id (none for a new job). An attempt still
        marked running belonged to a corral that was killed: it is closed as such."""
        path = job_dir / ATTEMPTS_FILE
        records: list[AttemptRecord] = []
        with contextlib.suppress(OSError, ValueError, TypeError):
            for item in json.loads(path.read_text()):
                record = AttemptRecord(**item)
                if record.state == JobState.RUNNING:
                    record.state = "interrupted"
                    record.cause = "corral stopped during this attempt (killed?)"
                records.append(record)
        return cls(path, records)

    @property
    def next_number(self) -> int:
        """The number the next attempt gets (CORRAL_ATTEMPT)."""
        return self.records[-1].number + 1 if self.records else 0

    def start(self, hosts: Sequence[str], world_size: int, checkpoint: str | None) -> AttemptRecord:
        """Record a new attempt as running (and save)."""
        record = AttemptRecord(
            self.next_number, list(hosts), world_size, time.time(), checkpoint=checkpoint
        )
        self.records.append(record)
        self.save()
        return record

    def save(self) -> None:
        """Write the file atomically (a crash never leaves it half-written)."""
        with contextlib.suppress(OSError):
            self.path.parent.mkdir(parents=True, exist_ok=True)
            write_private(self.path, json.dumps([asdict(r) for r in self.records], indent=1))

    def to_json(self) -> list[dict[str, Any]]:
        """Every attempt, as written to the file."""
        return [asdict(r) for r in self.records]


@dataclass(frozen=True)
class Decision:
    """Whether to restart, on which hosts, and why (or why not)."""

    restart: bool
    reason: str
    hosts: tuple[str, ...] = ()


def decide(
    policy: RestartPolicy,
    result: AttemptOutcome,
    *,
    restarts_done: int,
    hosts: Sequence[str],
    unreachable: Sequence[str],
    initial_hosts: int,
) -> Decision:
    """Restart after ``result``? ``hosts`` ran the attempt; ``unreachable`` failed
    the connectivity check afterwards (hosts the attempt lost are dropped too)."""
    if result.state != JobState.FAILED:
        return Decision(False, f"the job {result.state.value.replace('_', ' ')}")
    cause = result.root_cause
    if cause is not None and cause.could_not_start:
        return Decision(False, "the job could not start; a restart would fail the same way")
    if restarts_done >= policy.max_restarts:
        if policy.max_restarts == 0:
            return Decision(False, "no restarts allowed (--max-restarts 0)")
        return Decision(
            False, f"restart budget spent ({restarts_done} of --max-restarts {policy.max_restarts})"
        )
    lost = {n.host.name for n in result.nodes if n.state == NodeState.LOST} | set(unreachable)
    survivors = tuple(h for h in hosts if h not in lost)
    need = policy.min_nodes if policy.min_nodes is not None else initial_hosts
    if len(survivors) < max(1, need):
        gone = ", ".join(sorted(lost))
        why = "--min-nodes" if policy.min_nodes is not None else "--min-nodes (default: all hosts)"
        return Decision(
            False,
            f"{gone} {'was' if len(lost) == 1 else 'were'} lost and only {len(survivors)} "
            f"host(s) remain, fewer than {need} ({why})",
        )
    dropped = [h for h in hosts if h in lost]
    reason = f"restarting on {len(survivors)} host(s)" + (
        f" without {', '.join(dropped)}" if dropped else ""
    )
    return Decision(True, reason, survivors)
