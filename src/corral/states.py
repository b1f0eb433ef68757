"""Job and node states, with their allowed transitions: the one vocabulary of the
engine, the server (``corral serve``), its clients and the web page.

A leaf module (standard library only): the engine (:mod:`corral.job.states`
re-exports it) and what sits below it (:mod:`corral.recovery`) share it.

Job (one machine for the whole job, across its attempts; :class:`JobMachine`)::

    QUEUED <-> PLANNED -> PENDING           (the server's; CANCELLED or FAILED before it)
                              |
    PENDING -> PREPARING -> STARTING -> RUNNING -> SUCCEEDED
       |           |           |           |
       |           |           |           +-> STOPPING -> FAILED | TIMED_OUT | CANCELLED
       |           |           +-> FAILED       |    ^         (STOPPING -> SUCCEEDED never)
       |           +-> FAILED | CANCELLED       |    |
       +-> STARTING | FAILED | CANCELLED         v    |
                                           RESTARTING -> STARTING | FAILED | CANCELLED

- PREPARING: code sync, the pre-flight checklist and the hosts' agents being
  started and probed; nothing of the job runs yet. A failure here is FAILED
  (nothing to tear down), a stop is CANCELLED.
- STARTING -> RUNNING once every node's agent reported its ranks started.
- A job enters STOPPING on the first failure of any rank, a lost host, a hang,
  the ``--timeout`` deadline or a stop request; the teardown runs in STOPPING.
- Once every node is down, the *engine* decides (:mod:`corral.recovery.restart`):
  a failure with restarts left and enough hosts -> RESTARTING (backoff, drop lost
  hosts, re-plan, place the checkpoint) -> STARTING with the next attempt;
  otherwise the reason fixes the terminal state.
- The server's states around the engine's: PLANNED (a plan is stored, nothing
  started), QUEUED (waiting for machines; the scheduler plans it -> PLANNED, and
  puts it back while the machines are busy), PENDING once dispatched (the
  supervisor process is starting: from there it follows the engine), and LOST:
  the supervisor process ended without a result (from any active state). A
  waiting job is CANCELLED by a stop, FAILED when it can never run.
- :data:`TERMINAL_STATES` (never left), :data:`ACTIVE_STATES` (a supervisor
  runs: its machines are busy) and :data:`WAITING_STATES` (nothing started) are
  the groups every view uses.

Node::

    STARTING -> RUNNING -> EXITED | FAILED | LOST
       |           |
       +-----------+-> STOPPING -> TERMINATED | FAILED | LOST
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable


class IllegalTransition(RuntimeError):
    """A state change not in the documented transition table (a corral bug)."""


class JobState(str, enum.Enum):
    """Lifecycle of a whole job."""

    PLANNED = "planned"  # the server's: a stored plan, nothing started
    QUEUED = "queued"  # the server's: waiting for machines
    PENDING = "pending"
    PREPARING = "preparing"
    STARTING = "starting"
    RUNNING = "running"
    STOPPING = "stopping"
    RESTARTING = "restarting"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    TIMED_OUT = "timed_out"
    CANCELLED = "cancelled"
    LOST = "lost"  # the server's: the supervisor process ended without a result

    @property
    def terminal(self) -> bool:
        """True for states a job never leaves."""
        return self in TERMINAL_STATES


class NodeState(str, enum.Enum):
    """Lifecycle of one node (its agent and its ranks)."""

    STARTING = "starting"
    RUNNING = "running"
    STOPPING = "stopping"
    EXITED = "exited"  # every rank exited 0
    FAILED = "failed"  # a rank failed (or the agent could not start it)
    TERMINATED = "terminated"  # stopped by corral's teardown
    LOST = "lost"  # the connection to the host broke

    @property
    def terminal(self) -> bool:
        """True for states a node never leaves."""
        return self in _NODE_TERMINAL


TERMINAL_STATES: frozenset[JobState] = frozenset(
    {JobState.SUCCEEDED, JobState.FAILED, JobState.TIMED_OUT, JobState.CANCELLED, JobState.LOST}
)
"""States a job never leaves (its result is in, or it was lost)."""
WAITING_STATES: frozenset[JobState] = frozenset({JobState.PLANNED, JobState.QUEUED})
"""The server's states before dispatch: nothing of the job runs."""
ACTIVE_STATES: frozenset[JobState] = frozenset(
    {
        JobState.PENDING,
        JobState.PREPARING,
        JobState.STARTING,
        JobState.RUNNING,
        JobState.STOPPING,
        JobState.RESTARTING,
    }
)
"""States in which the job's supervisor runs (its machines are busy)."""
_NODE_TERMINAL = {NodeState.EXITED, NodeState.FAILED, NodeState.TERMINATED, NodeState.LOST}

JOB_TRANSITIONS: dict[JobState, frozenset[JobState]] = {
    JobState.PLANNED: frozenset(
        {JobState.PENDING, JobState.QUEUED, JobState.FAILED, JobState.CANCELLED}
    ),
    JobState.QUEUED: frozenset(
        {JobState.PLANNED, JobState.PENDING, JobState.FAILED, JobState.CANCELLED}
    ),
    JobState.PENDING: frozenset(
        {
            JobState.PREPARING,
            JobState.STARTING,
            JobState.FAILED,
            JobState.CANCELLED,
            JobState.LOST,
        }
    ),
    JobState.PREPARING: frozenset(
        {JobState.STARTING, JobState.FAILED, JobState.CANCELLED, JobState.LOST}
    ),
    JobState.STARTING: frozenset(
        {JobState.RUNNING, JobState.STOPPING, JobState.FAILED, JobState.LOST}
    ),
    JobState.RUNNING: frozenset({JobState.SUCCEEDED, JobState.STOPPING, JobState.LOST}),
    JobState.STOPPING: frozenset(
        {
            JobState.FAILED,
            JobState.TIMED_OUT,
            JobState.CANCELLED,
            JobState.RESTARTING,
            JobState.LOST,
        }
    ),
    JobState.RESTARTING: frozenset(
        {JobState.STARTING, JobState.FAILED, JobState.CANCELLED, JobState.LOST}
    ),
    JobState.SUCCEEDED: frozenset(),
    JobState.FAILED: frozenset(),
    JobState.TIMED_OUT: frozenset(),
    JobState.CANCELLED: frozenset(),
    JobState.LOST: frozenset(),
}

NODE_TRANSITIONS: dict[NodeState, frozenset[NodeState]] = {
    NodeState.STARTING: frozenset(
        {NodeState.RUNNING, NodeState.STOPPING, NodeState.FAILED, NodeState.LOST}
    ),
    NodeState.RUNNING: frozenset(
        {NodeState.EXITED, NodeState.FAILED, NodeState.STOPPING, NodeState.LOST}
    ),
    NodeState.STOPPING: frozenset(
        {NodeState.TERMINATED, NodeState.FAILED, NodeState.LOST, NodeState.EXITED}
    ),
    NodeState.EXITED: frozenset(),
    NodeState.FAILED: frozenset(),
    NodeState.TERMINATED: frozenset(),
    NodeState.LOST: frozenset(),
}


def check_job_transition(old: JobState, new: JobState) -> JobState:
    """Return ``new`` if ``old -> new`` is allowed, else raise IllegalTransition."""
    if new not in JOB_TRANSITIONS[old]:
        raise IllegalTransition(f"job cannot go from {old.value} to {new.value}")
    return new


def job_sources(new: JobState) -> frozenset[JobState]:
    """The states a job may reach ``new`` from (``new`` itself included: staying is
    no change); a store update of the state is made conditional on them."""
    return frozenset({new} | {old for old, nxt in JOB_TRANSITIONS.items() if new in nxt})


def state_values(states: Iterable[JobState]) -> list[str]:
    """The states' string values, sorted (for a SQL ``IN``)."""
    return sorted(state.value for state in states)


def check_node_transition(old: NodeState, new: NodeState) -> NodeState:
    """Return ``new`` if ``old -> new`` is allowed, else raise IllegalTransition."""
    if new not in NODE_TRANSITIONS[old]:
        raise IllegalTransition(f"node cannot go from {old.value} to {new.value}")
    return new


class JobMachine:
    """The job's state, changed only along :data:`JOB_TRANSITIONS`.

    The engine and the supervisor of the current attempt share one machine; every
    decision that depends on where the job is (may a failure still stop it? is a
    teardown under way? restart or finish?) reads :attr:`state`, and every change
    is passed to ``on_change(old, new, reason)`` (the engine turns it into an event).
    """

    def __init__(self, on_change: Callable[[JobState, JobState, str], None] | None = None) -> None:
        self.state = JobState.PENDING
        self.reason = ""
        self._on_change = on_change

    def to(self, new: JobState, reason: str = "") -> None:
        """Move to ``new`` (no-op if already there); IllegalTransition if not allowed."""
        if new == self.state:
            return
        old = self.state
        self.state = check_job_transition(old, new)
        self.reason = reason
        if self._on_change is not None:
            self._on_change(old, new, reason)

    @property
    def stopping(self) -> bool:
        """A teardown was decided (STOPPING) or the job already ended."""
        return self.state == JobState.STOPPING or self.state.terminal

    @property
    def launching(self) -> bool:
        """Before the first rank runs (PENDING, PREPARING, RESTARTING): a stop
        request cancels without a teardown."""
        return self.state in (JobState.PENDING, JobState.PREPARING, JobState.RESTARTING)
