"""Job and node state machines: only the documented transitions are allowed."""

from __future__ import annotations

import pytest

from corral.job.states import (
    ACTIVE_STATES,
    JOB_TRANSITIONS,
    NODE_TRANSITIONS,
    TERMINAL_STATES,
    WAITING_STATES,
    IllegalTransition,
    JobState,
    NodeState,
    check_job_transition,
    check_node_transition,
    job_sources,
)


def test_every_state_has_a_row() -> None:
    assert set(JOB_TRANSITIONS) == set(JobState)
    assert set(NODE_TRANSITIONS) == set(NodeState)


def test_terminal_states_are_final() -> None:
    for state in JobState:
        assert state.terminal == (not JOB_TRANSITIONS[state])
    for node_state in NodeState:
        assert node_state.terminal == (not NODE_TRANSITIONS[node_state])


@pytest.mark.parametrize(
    "path",
    [
        ["pending", "starting", "running", "succeeded"],
        ["pending", "starting", "running", "stopping", "failed"],
        ["pending", "starting", "running", "stopping", "timed_out"],
        ["pending", "starting", "running", "stopping", "cancelled"],
        ["pending", "starting", "stopping", "failed"],
        ["pending", "starting", "failed"],
    ],
)
def test_job_paths(path: list[str]) -> None:
    state = JobState(path[0])
    for nxt in path[1:]:
        state = check_job_transition(state, JobState(nxt))
    assert state.terminal


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("succeeded", "running"),
        ("pending", "running"),
        ("running", "failed"),
        ("stopping", "succeeded"),
        ("failed", "stopping"),
    ],
)
def test_illegal_job_transitions(old: str, new: str) -> None:
    with pytest.raises(IllegalTransition):
        check_job_transition(JobState(old), JobState(new))


def test_node_paths() -> None:
    assert check_node_transition(NodeState.RUNNING, NodeState.LOST) == NodeState.LOST
    assert check_node_transition(NodeState.STOPPING, NodeState.TERMINATED) == NodeState.TERMINATED
    with pytest.raises(IllegalTransition):
        check_node_transition(NodeState.EXITED, NodeState.RUNNING)
    with pytest.raises(IllegalTransition):
        check_node_transition(NodeState.STOPPING, NodeState.RUNNING)


@pytest.mark.parametrize(
    "path",
    [
        ["planned", "pending", "preparing", "starting", "running", "succeeded"],
        ["queued", "planned", "queued", "planned", "pending", "starting", "running", "lost"],
        ["queued", "cancelled"],
        ["planned", "failed"],
        ["pending", "lost"],
        ["restarting", "lost"],
    ],
)
def test_server_paths(path: list[str]) -> None:
    state = JobState(path[0])
    for nxt in path[1:]:
        state = check_job_transition(state, JobState(nxt))
    assert state.terminal


@pytest.mark.parametrize(
    ("old", "new"),
    [("planned", "running"), ("queued", "starting"), ("lost", "running"), ("planned", "lost")],
)
def test_illegal_server_transitions(old: str, new: str) -> None:
    with pytest.raises(IllegalTransition):
        check_job_transition(JobState(old), JobState(new))


def test_the_state_groups_cover_every_state_once() -> None:
    groups = [TERMINAL_STATES, ACTIVE_STATES, WAITING_STATES]
    assert set().union(*groups) == set(JobState)
    assert sum(len(g) for g in groups) == len(JobState)
    assert {s.value for s in TERMINAL_STATES} == {
        "succeeded",
        "failed",
        "timed_out",
        "cancelled",
        "lost",
    }
    assert "lost" in TERMINAL_STATES  # plain strings (the store's, the API's) compare equal


def test_job_sources_are_the_table_read_backwards() -> None:
    assert job_sources(JobState.PENDING) == {JobState.PENDING, JobState.PLANNED, JobState.QUEUED}
    assert job_sources(JobState.LOST) == ACTIVE_STATES | {JobState.LOST}
