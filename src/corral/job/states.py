"""Job and node states, with their allowed transitions.

Job::

    PENDING -> STARTING -> RUNNING -> SUCCEEDED
                  |           |
                  |           +-> STOPPING -> FAILED | TIMED_OUT | CANCELLED
                  +-> FAILED (launch failed)      (and STOPPING -> SUCCEEDED never)

A job enters STOPPING on the first failure of any rank, a lost host, the
``--timeout`` deadline or Ctrl-C; the reason fixes the terminal state.

Node::

    STARTING -> RUNNING -> EXITED | FAILED | LOST
       |           |
       +-----------+-> STOPPING -> TERMINATED | FAILED | LOST
"""

from __future__ import annotations

import enum


class IllegalTransition(RuntimeError):
    """A state change not in the documented transition table (a corral bug)."""


class JobState(str, enum.Enum):
    """Lifecycle of a whole job."""

    PENDING = "pending"
    STARTING = "starting"
    RUNNING = "running"
    STOPPING = "stopping"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    TIMED_OUT = "timed_out"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        """True for states a job never leaves."""
        return self in _JOB_TERMINAL


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


_JOB_TERMINAL = {JobState.SUCCEEDED, JobState.FAILED, JobState.TIMED_OUT, JobState.CANCELLED}
_NODE_TERMINAL = {NodeState.EXITED, NodeState.FAILED, NodeState.TERMINATED, NodeState.LOST}

JOB_TRANSITIONS: dict[JobState, frozenset[JobState]] = {
    JobState.PENDING: frozenset({JobState.STARTING, JobState.CANCELLED}),
    JobState.STARTING: frozenset({JobState.RUNNING, JobState.STOPPING, JobState.FAILED}),
    JobState.RUNNING: frozenset({JobState.SUCCEEDED, JobState.STOPPING}),
    JobState.STOPPING: frozenset({JobState.FAILED, JobState.TIMED_OUT, JobState.CANCELLED}),
    JobState.SUCCEEDED: frozenset(),
    JobState.FAILED: frozenset(),
    JobState.TIMED_OUT: frozenset(),
    JobState.CANCELLED: frozenset(),
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


def check_node_transition(old: NodeState, new: NodeState) -> NodeState:
    """Return ``new`` if ``old -> new`` is allowed, else raise IllegalTransition."""
    if new not in NODE_TRANSITIONS[old]:
        raise IllegalTransition(f"node cannot go from {old.value} to {new.value}")
    return new
