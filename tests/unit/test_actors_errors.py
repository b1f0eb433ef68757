"""The text of actor errors: real elapsed times, the root cause first."""

from __future__ import annotations

from corral.actors.errors import (
    ActorGroupError,
    ActorTimeout,
    RemoteError,
    WorkerDied,
)


def test_a_timeout_says_how_long_it_waited() -> None:
    assert ActorTimeout(host="h", rank=0, timeout=1).message == "no message within 1.0 s"
    early = ActorTimeout(host="h", rank=2, timeout=60, waited=5.04, note="gave up")
    assert str(early) == "[h:2] no message within 5.0 s (gave up)"
    assert (early.timeout, early.waited) == (60, 5.04)


def test_a_group_error_names_the_failed_worker_before_the_timed_out_ones() -> None:
    errors = {
        0: ActorTimeout(host="a", rank=0, timeout=60, waited=5),
        1: ActorTimeout(host="a", rank=1, timeout=60, waited=5),
        3: WorkerDied("killed by SIGKILL", host="b", rank=3, signal_name="SIGKILL"),
    }
    error = ActorGroupError("call", errors, {2: "ok"})
    assert (error.host, error.rank) == ("b", 3)
    lines = str(error).splitlines()
    assert lines[0] == "[b:3] call failed on 3 worker(s): [b:3], [a:0], [a:1]"
    assert lines[1] == "  [b:3] killed by SIGKILL"
    assert list(error.errors) == [0, 1, 3]  # the mapping stays in rank order
    assert error.order == [3, 0, 1]
    assert error.details()[0].startswith("[b:3]")


def test_the_earliest_failure_leads_when_several_failed() -> None:
    raised = RemoteError(host="a", rank=0, type_name="KeyError", remote_message="x", traceback="")
    died = WorkerDied("exited with code 1", host="b", rank=2, exit_code=1)
    error = ActorGroupError("gather", {0: raised, 2: died}, {}, failed_first=[2, 0])
    assert (error.host, error.rank) == ("b", 2)
    assert error.order == [2, 0]
    by_rank = ActorGroupError("gather", {0: raised, 2: died}, {})
    assert by_rank.order == [0, 2]
