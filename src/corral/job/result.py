"""What a supervised attempt produced: per-rank and per-node records, failures, the
result, and corral's exit codes (a leaf module: the supervisor, the summary, the
restart policy and the engine all read these types)."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from corral import outcomes
from corral.cluster.model import Host
from corral.job.states import JobState, NodeState, check_node_transition
from corral.plan.spec import NodeCommand
from corral.recovery.health import HostWatch, RankHealth, check_rank_transition
from corral.transport.base import NodeProcess

STDERR_TAIL = 20

# corral's exit codes and signal names live in the leaf corral.outcomes (recovery/
# reads them); the engine's modules import them from here as they always have
EXIT_SIGNAL_BASE = outcomes.EXIT_SIGNAL_BASE
EXIT_TIMEOUT = outcomes.EXIT_TIMEOUT
EXIT_INTERRUPTED = outcomes.EXIT_INTERRUPTED
EXIT_LOST = outcomes.EXIT_LOST
EXIT_LAUNCH = outcomes.EXIT_LAUNCH
EXIT_HANG = outcomes.EXIT_HANG
signal_name = outcomes.signal_name


@dataclass
class RankRecord:
    """What the coordinator knows about one rank."""

    host: str
    rank: int
    local_rank: int = 0
    pid: int | None = None
    code: int | None = None
    exited: bool = False
    time: float | None = None
    error: dict[str, Any] | None = None
    stderr_tail: deque[str] = field(default_factory=lambda: deque(maxlen=STDERR_TAIL))
    progress: dict[str, Any] | None = None
    health: RankHealth = RankHealth.STARTED

    def set_health(self, new: RankHealth) -> None:
        """Move to ``new`` along a documented transition (no-op if already there)."""
        if new != self.health:
            self.health = check_rank_transition(self.health, new)


@dataclass(frozen=True)
class NodeReport:
    """A node agent's last word: ``node_exit`` with the launcher's own exit ``code``,
    or ``start_failed`` (``started`` False: it could not start the node)."""

    code: int = 0
    started: bool = True


@dataclass
class NodeRun:
    """One node during and after the job."""

    command: NodeCommand
    state: NodeState = NodeState.STARTING
    proc: NodeProcess | None = None
    started: float = 0.0
    ended: float | None = None
    ranks: dict[int, RankRecord] = field(default_factory=dict)
    agent_tail: deque[str] = field(default_factory=lambda: deque(maxlen=STDERR_TAIL))
    detail: str = ""
    report: NodeReport | None = None  # the agent's last word; None: it has said none (yet)
    fault: Failure | None = None  # the node's first failure before the job was stopping
    clock_offset: float = 0.0  # coordinator clock minus the host's clock
    least_offset: float | None = None  # the least any of its events showed
    frame_at: float = 0.0  # when the agent's latest frame was read (before it was parsed)
    watch: HostWatch = field(default_factory=lambda: HostWatch("", time.monotonic()))
    stacks: list[dict[str, Any]] | None = None  # the latest stack dump (hang detection)
    stacks_ready: asyncio.Event = field(default_factory=asyncio.Event)

    def to_local(self, host_time: float) -> float:
        """A timestamp of this host's clock on the coordinator's clock (one offset for
        the whole attempt: the intervals between the host's reports are kept)."""
        return host_time + self.clock_offset

    def bound_offset(self, seen: float) -> None:
        """One event's arrival minus its host time: an upper bound of the offset (a
        frame read late, by a busy coordinator or from a buffered pipe, overstates it)."""
        if self.least_offset is None or seen < self.least_offset:
            self.least_offset = seen

    def failure_time(self, host_time: float) -> float:
        """A failure's host time on the coordinator's clock, with the least offset seen:
        failures of different hosts are ordered, and compared with the stop, by the best
        estimate (an overstated one dated a SIGKILLed rank's end after the stop its
        survivor's error caused, so the survivor was named the root cause)."""
        least = self.least_offset
        offset = self.clock_offset if least is None else min(least, self.clock_offset)
        return host_time + offset

    def made_at(self, host_time: object, lag_max: float = 5.0) -> float:
        """When a rank made a report the agent dated ``host_time`` (its age in the
        rank's buffer taken off: the SDK sends reports in batches, every 0.2 s), on our
        clock: never in the future, never more than ``lag_max`` s ago (a clock jump)."""
        now = time.time()
        if not isinstance(host_time, int | float) or isinstance(host_time, bool):
            return now
        return min(now, max(now - lag_max, self.to_local(float(host_time))))

    listener: Callable[[NodeRun], None] | None = None  # told of every state change

    @property
    def host(self) -> Host:
        """The node's host."""
        return self.command.host

    @property
    def exit_code(self) -> int | None:
        """The node process's own exit code (torchrun, a command): the agent's
        ``node_exit`` report; None before it, or when the node never started."""
        return self.report.code if self.report is not None and self.report.started else None

    def settled(self, *, stopping: bool) -> NodeState:
        """The state this node ends in now that its agent is gone: ``lost`` when the
        agent never said how it ended, ``failed`` after a failure of its own before
        the job was stopping, ``terminated`` when corral stopped it or a rank did not
        exit 0, else ``exited``."""
        if self.report is None:
            return NodeState.LOST
        if self.fault is not None:
            return NodeState.FAILED
        if stopping or any(r.code != 0 for r in self.ranks.values()):
            return NodeState.TERMINATED
        return NodeState.EXITED

    def set_state(self, new: NodeState) -> None:
        """Move to ``new`` along a documented transition (no-op if already there)."""
        if new != self.state:
            self.state = check_node_transition(self.state, new)
            if self.listener is not None:
                self.listener(self)


@dataclass
class Failure:
    """The root cause of a failed job (or one more failure after it)."""

    host: str
    rank: int | None
    code: int | None
    time: float
    message: str
    stderr_tail: list[str]
    traceback: str | None = None
    exit_code: int = 1
    tail: str = ""
    """What ``stderr_tail`` holds when it is not the rank's stderr (a hang: the stuck
    rank's stack); empty: its last lines of stderr."""
    by_teardown: bool = False
    """Killed by a signal the node agent's teardown had sent (never a root cause)."""
    could_not_start: bool = False
    """Corral could not start the node (or the worker): a restart would fail the same
    way. A rank's own exit code never says this, even when it is corral's launch code 3."""

    @property
    def signal(self) -> str | None:
        """Signal name when the process was killed by a signal."""
        return signal_name(self.code)

    @classmethod
    def not_started(cls, host: str, when: float, message: str) -> Failure:
        """Corral could not start ``host``'s node: a failure no restart would mend."""
        return cls(host, None, None, when, message, [], could_not_start=True)


@dataclass
class JobResult:
    """Outcome of a supervised job."""

    job_id: str
    state: JobState
    exit_code: int
    nodes: list[NodeRun]
    failures: list[Failure]
    started: float
    ended: float
    reason: str = ""
    attempts: list[dict[str, Any]] = field(default_factory=list)  # every attempt so far
    groups: list[dict[str, Any]] = field(default_factory=list)  # in-place group episodes

    @property
    def root_cause(self) -> Failure | None:
        """The earliest failure, if any."""
        return self.failures[0] if self.failures else None
