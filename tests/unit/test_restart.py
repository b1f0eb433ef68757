"""Restart policy, attempt records and the host health model (pure)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from corral.cluster.model import Host
from corral.job.result import EXIT_LAUNCH, EXIT_LOST, Failure, JobResult, NodeRun
from corral.job.states import IllegalTransition, JobState, NodeState
from corral.plan.spec import NodeCommand
from corral.recovery.health import HostHealth, HostWatch, RankHealth, check_rank_transition
from corral.recovery.restart import MAX_BACKOFF, AttemptLog, RestartPolicy, decide


def node(name: str, state: NodeState) -> NodeRun:
    run = NodeRun(command=NodeCommand(Host(name), 0, ("x",), {}, "/", 1))
    run.state = state
    return run


def result(
    state: JobState = JobState.FAILED,
    exit_code: int = 1,
    lost: tuple[str, ...] = (),
    hosts: tuple[str, ...] = ("a", "b", "c"),
    cause: Failure | None = None,
) -> JobResult:
    nodes = [node(h, NodeState.LOST if h in lost else NodeState.TERMINATED) for h in hosts]
    failures = [cause or Failure("b", 1, -9, 10.0, "rank 1 on b killed by SIGKILL", [])]
    now = time.time()
    return JobResult("job", state, exit_code, nodes, failures, now, now + 12.5, "failure")


def test_rank_failure_restarts_on_every_host_while_the_budget_lasts() -> None:
    policy = RestartPolicy(max_restarts=2)
    hosts = ["a", "b", "c"]
    first = decide(policy, result(), restarts_done=0, hosts=hosts, unreachable=[], initial_hosts=3)
    assert first.restart and first.hosts == ("a", "b", "c")
    assert first.reason == "restarting on 3 host(s)"
    spent = decide(policy, result(), restarts_done=2, hosts=hosts, unreachable=[], initial_hosts=3)
    assert not spent.restart and "restart budget spent (2 of --max-restarts 2)" in spent.reason


def test_no_restart_without_a_budget_or_for_non_failures() -> None:
    hosts = ["a", "b", "c"]
    none = decide(
        RestartPolicy(), result(), restarts_done=0, hosts=hosts, unreachable=[], initial_hosts=3
    )
    assert not none.restart and "--max-restarts 0" in none.reason
    policy = RestartPolicy(max_restarts=3)
    for state in (JobState.SUCCEEDED, JobState.CANCELLED, JobState.TIMED_OUT):
        decision = decide(
            policy, result(state), restarts_done=0, hosts=hosts, unreachable=[], initial_hosts=3
        )
        assert not decision.restart
    never = Failure("b", None, None, 10.0, "could not start the node", [], could_not_start=True)
    launch = decide(
        policy,
        result(exit_code=EXIT_LAUNCH, cause=never),
        restarts_done=0,
        hosts=hosts,
        unreachable=[],
        initial_hosts=3,
    )
    assert not launch.restart and "could not start" in launch.reason


def test_a_ranks_own_exit_code_3_is_a_failure_to_restart_not_a_launch_failure() -> None:
    """3 is corral's launch exit code too; a rank that exits with it did start."""
    rank = Failure("b", 1, 3, 10.0, "rank 1 on b exited with code 3", [], exit_code=EXIT_LAUNCH)
    decision = decide(
        RestartPolicy(max_restarts=1),
        result(exit_code=EXIT_LAUNCH, cause=rank),
        restarts_done=0,
        hosts=["a", "b", "c"],
        unreachable=[],
        initial_hosts=3,
    )
    assert decision.restart, decision.reason


def test_lost_and_unreachable_hosts_are_dropped_down_to_min_nodes() -> None:
    policy = RestartPolicy(max_restarts=1, min_nodes=2)
    hosts = ["a", "b", "c"]
    lost = decide(
        policy,
        result(exit_code=EXIT_LOST, lost=("c",)),
        restarts_done=0,
        hosts=hosts,
        unreachable=[],
        initial_hosts=3,
    )
    assert lost.restart and lost.hosts == ("a", "b")
    assert lost.reason == "restarting on 2 host(s) without c"
    both = decide(
        policy,
        result(lost=("c",)),
        restarts_done=0,
        hosts=hosts,
        unreachable=["a"],
        initial_hosts=3,
    )
    assert not both.restart
    assert both.reason == "a, c were lost and only 1 host(s) remain, fewer than 2 (--min-nodes)"


def test_default_min_nodes_is_every_host() -> None:
    decision = decide(
        RestartPolicy(max_restarts=1),
        result(lost=("b",)),
        restarts_done=0,
        hosts=["a", "b", "c"],
        unreachable=[],
        initial_hosts=3,
    )
    assert not decision.restart
    assert "fewer than 3 (--min-nodes (default: all hosts))" in decision.reason


def test_backoff_doubles_up_to_the_cap() -> None:
    policy = RestartPolicy(max_restarts=10, backoff=2.0)
    assert [policy.delay(n) for n in (1, 2, 3)] == [2.0, 4.0, 8.0]
    assert policy.delay(30) == MAX_BACKOFF
    assert RestartPolicy(backoff=0).delay(3) == 0.0


def test_attempt_log_survives_a_killed_coordinator(tmp_path: Path) -> None:
    log = AttemptLog.load(tmp_path)
    assert log.next_number == 0 and log.records == []
    first = log.start(["a", "b"], 2, None)
    first.finish(result(hosts=("a", "b")))
    log.save()
    log.start(["a", "b"], 2, "ckpt-00000020.pt (step 20) already on a")  # corral killed here
    again = AttemptLog.load(tmp_path)
    assert [r.number for r in again.records] == [0, 1] and again.next_number == 2
    assert again.records[0].state == "failed"
    assert again.records[0].cause == "rank 1 on b killed by SIGKILL"
    assert again.records[0].host == "b" and again.records[0].rank == 1
    assert again.records[0].duration == pytest.approx(12.5, abs=1.0)
    assert again.records[1].state == "interrupted"
    assert "killed" in again.records[1].cause
    assert json.loads((tmp_path / "attempts.json").read_text())[1]["state"] == "running"


def test_attempt_log_ignores_a_damaged_file(tmp_path: Path) -> None:
    (tmp_path / "attempts.json").write_text("{not json")
    assert AttemptLog.load(tmp_path).next_number == 0


def test_host_watch_goes_silent_then_lost() -> None:
    watch = HostWatch("h", last_heard=100.0)
    assert watch.check(103.0, interval=2.0, timeout=20.0) is None
    assert watch.check(107.0, interval=2.0, timeout=20.0) == HostHealth.SILENT
    assert watch.check(108.0, interval=2.0, timeout=20.0) is None  # said once
    watch.heard(109.0)
    assert watch.health == HostHealth.HEALTHY
    assert watch.check(129.5, interval=2.0, timeout=20.0) == HostHealth.LOST
    assert watch.check(200.0, interval=2.0, timeout=20.0) is None
    assert not watch.lose()


def test_rank_health_transitions_are_checked() -> None:
    assert check_rank_transition(RankHealth.STARTED, RankHealth.PROGRESSING)
    assert check_rank_transition(RankHealth.PROGRESSING, RankHealth.HUNG)
    with pytest.raises(IllegalTransition):
        check_rank_transition(RankHealth.EXITED, RankHealth.PROGRESSING)
    with pytest.raises(IllegalTransition):
        check_rank_transition(RankHealth.HUNG, RankHealth.PROGRESSING)
