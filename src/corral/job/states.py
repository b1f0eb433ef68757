"""The job and node states of :mod:`corral.states` (the one vocabulary), as the
engine's modules have always imported them."""

from __future__ import annotations

from corral.states import (
    ACTIVE_STATES,
    JOB_TRANSITIONS,
    NODE_TRANSITIONS,
    TERMINAL_STATES,
    WAITING_STATES,
    IllegalTransition,
    JobMachine,
    JobState,
    NodeState,
    check_job_transition,
    check_node_transition,
    job_sources,
    state_values,
)

__all__ = [
    "ACTIVE_STATES",
    "JOB_TRANSITIONS",
    "NODE_TRANSITIONS",
    "TERMINAL_STATES",
    "WAITING_STATES",
    "IllegalTransition",
    "JobMachine",
    "JobState",
    "NodeState",
    "check_job_transition",
    "check_node_transition",
    "job_sources",
    "state_values",
]
