"""A worker's life in the job engine's states, its restarts decided by the engine's
restart policy (:func:`corral.recovery.restart.decide`), not by flags of its own."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any, cast

import pytest

from corral.actors._channel import Mailbox
from corral.actors._cluster import restart_policy
from corral.actors._loop import Output
from corral.actors._runtime import WorkerSpec, WorkerSupervisor, policy_exit_code
from corral.actors.errors import WorkerDied
from corral.cluster.model import Host
from corral.job.result import EXIT_LAUNCH, EXIT_LOST
from corral.job.states import IllegalTransition, JobState
from corral.recovery.restart import RestartPolicy
from corral.transport.base import Transport

KILLED = WorkerDied("killed by SIGKILL", host="n0", rank=0, signal_name="SIGKILL")
RETURNED = WorkerDied("exited with code 0 (work_fn returned)", host="n0", rank=0, exit_code=0)
LOST = WorkerDied("connection to n0 lost", host="n0", rank=0, lost="link cut")


def with_supervisor(policy: RestartPolicy, body: Callable[[WorkerSupervisor], Any]) -> Any:
    """Run ``body`` with a supervisor (made on a running loop, as the cluster does)."""

    async def main() -> Any:
        spec = WorkerSpec(Host("n0", local=True), 0, 0, 0, ["true"], {})
        output = Output(echo=False, log_dir=None)
        mailbox = Mailbox(threading.Condition())
        sup = WorkerSupervisor(spec, cast(Transport, None), output, mailbox, policy=policy)
        return body(sup)

    return asyncio.run(main())


def running(sup: WorkerSupervisor) -> WorkerSupervisor:
    """As a worker that started and said it is ready."""
    sup.machine.to(JobState.STARTING)
    sup.machine.to(JobState.RUNNING)
    sup.ready.set_result(None)
    return sup


def test_a_death_restarts_while_the_budget_lasts() -> None:
    def body(sup: WorkerSupervisor) -> list[tuple[JobState, str]]:
        running(sup)
        seen = [(sup._settle(KILLED, True), sup.machine.reason)]
        sup.restarts = 1
        sup.machine.to(JobState.STARTING)
        sup.machine.to(JobState.RUNNING)
        seen.append((sup._settle(KILLED, True), sup.machine.reason))
        return seen

    first, second = with_supervisor(RestartPolicy(max_restarts=1, backoff=0.0), body)
    assert first == (JobState.RESTARTING, "restarting on 1 host(s)")
    assert second == (JobState.FAILED, "restart budget spent (1 of --max-restarts 1)")


def test_what_is_never_restarted() -> None:
    policy = RestartPolicy(max_restarts=5, backoff=0.0)

    def returned(sup: WorkerSupervisor) -> JobState:
        return running(sup)._settle(RETURNED, True)

    def stopped(sup: WorkerSupervisor) -> JobState:
        running(sup).machine.to(JobState.STOPPING, "stopped by the coordinator")
        return sup._settle(RETURNED, True)

    def not_launched(sup: WorkerSupervisor) -> tuple[JobState, str]:
        running(sup)
        return sup._settle(WorkerDied("could not start: refused", host="n0", rank=0), False), (
            sup.machine.reason
        )

    def never_ready(sup: WorkerSupervisor) -> JobState:
        sup.machine.to(JobState.STARTING)
        sup.ready.set_exception(KILLED)
        return sup._settle(KILLED, True)

    assert with_supervisor(policy, returned) == JobState.SUCCEEDED
    assert with_supervisor(policy, stopped) == JobState.CANCELLED
    assert with_supervisor(policy, not_launched) == (
        JobState.FAILED,
        "the job could not start; a restart would fail the same way",
    )
    assert with_supervisor(policy, never_ready) == JobState.FAILED  # start() reports it


def test_a_worker_exiting_with_code_3_is_restarted() -> None:
    """3 is corral's launch exit code too; a worker that exits with it did start."""
    three = WorkerDied("exited with code 3", host="n0", rank=0, exit_code=3)

    def body(sup: WorkerSupervisor) -> JobState:
        return running(sup)._settle(three, True)

    assert with_supervisor(RestartPolicy(max_restarts=1, backoff=0.0), body) == (
        JobState.RESTARTING
    )


def test_a_lost_host_is_reconnected_once_budget_allows() -> None:
    def body(sup: WorkerSupervisor) -> JobState:
        return running(sup)._settle(LOST, True)

    assert with_supervisor(RestartPolicy(max_restarts=1, backoff=0.0), body) == (
        JobState.RESTARTING
    )


def test_the_machine_refuses_what_the_table_forbids() -> None:
    def body(sup: WorkerSupervisor) -> None:
        running(sup)._settle(RETURNED, True)
        sup.machine.to(JobState.STARTING)  # a finished worker never starts again

    with pytest.raises(IllegalTransition):
        with_supervisor(RestartPolicy(), body)


def test_exit_codes_as_the_engine_counts_them() -> None:
    assert policy_exit_code(KILLED, True) == 128 + 9
    assert policy_exit_code(LOST, True) == EXIT_LOST
    assert policy_exit_code(KILLED, False) == EXIT_LAUNCH
    assert policy_exit_code(RETURNED, True) == 0
    assert policy_exit_code(WorkerDied("gone", host="n0", rank=0), True) == 1


def test_max_restarts_is_the_engines_policy() -> None:
    assert restart_policy(2) == RestartPolicy(max_restarts=2, backoff=0.0)
    given = RestartPolicy(max_restarts=3, backoff=2.0)
    assert restart_policy(given) is given
