"""The root cause is decided by what happened, not by the order the reports arrive
(issue 33 item 7): the supervisor against the scripted fake transport, with the
cause's report delayed past the stop, and the ordering rules themselves."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from corral.job.result import Failure, JobResult, RankRecord
from corral.job.rootcause import CauseClass, classify, collective_peer, ordered, rank_failure
from corral.transport.fake import FakeNode, FakeTransport

from .test_supervisor import _stop_on_request, _stop_on_request_started, run_sup

GLOO = (
    "Traceback (most recent call last):\n  ...\nRuntimeError: [../third_party/gloo/gloo/"
    "transport/tcp/pair.cc:534] Connection closed by peer [10.77.0.2]:41234\n"
)


def _survivor_and_a_late_sigkill(
    tmp_path: Path, error: dict[str, object] | None
) -> tuple[JobResult, bytes, str]:
    """Host a's rank 0 fails first (``error``: its error file); host b's rank 2 was
    SIGKILLed before that, but b's agent reads it only after corral stopped the job
    (a loaded host): b's report arrives last and is dated after the stop."""
    killed = asyncio.Event()

    async def survivor(node: FakeNode) -> int:
        node.event("started", pid=1, pgids=[1])
        await killed.wait()  # rank 2 is dead: rank 0's collective breaks
        node.event("rank_exit", rank=0, code=1, eof_time=time.time(), error=error)
        return await _stop_on_request(node)

    async def loaded(node: FakeNode) -> int:
        node.event("started", pid=1, pgids=[1])
        killed.set()  # rank 2 dies now (SIGKILL from outside the job) ...
        await node.next_op("stop")
        await asyncio.sleep(0.05)
        # ... and is reported after the stop, dated when the busy agent read its end
        node.event("rank_exit", rank=2, code=-9, eof_time=time.time(), teardown=False)
        node.event("rank_exit", rank=3, code=-15, eof_time=time.time(), teardown=True)
        node.event("node_exit", ranks={})
        return 0

    transport = FakeTransport({"a": survivor, "b": loaded, "c": _stop_on_request_started})
    return asyncio.run(run_sup(transport, tmp_path))


def test_a_sigkilled_peer_reported_late_is_the_root_cause_not_the_survivor(
    tmp_path: Path,
) -> None:
    result, _, report = _survivor_and_a_late_sigkill(tmp_path, {"traceback": GLOO})
    cause = result.root_cause
    assert cause is not None and (cause.host, cause.rank, cause.signal) == ("b", 2, "SIGKILL")
    assert result.exit_code == 128 + 9
    assert [(f.host, f.rank) for f in result.failures] == [("b", 2), ("a", 0)]
    assert "[corral] rank 0 on a exited with code 1: stopping the job" in report
    assert (
        "[corral] root cause: rank 2 on b killed by SIGKILL (before rank 0 on a exited with "
        "code 1)" in report
    )
    assert "root cause: rank 2 on b killed by SIGKILL\n" in report


def test_a_survivor_that_exits_plainly_after_its_peer_was_killed_is_a_symptom(
    tmp_path: Path,
) -> None:
    # no collective words at all (a stdlib rank that noticed its peer vanish): the
    # death by a signal nobody of the job sent is still the cause
    result, _, _ = _survivor_and_a_late_sigkill(tmp_path, None)
    cause = result.root_cause
    assert cause is not None and (cause.host, cause.rank, cause.code) == ("b", 2, -9)


def _failure(rank: int | None, code: int | None, when: float, **kw: object) -> Failure:
    return Failure("h", rank, code, when, f"r{rank}", [], **kw)  # type: ignore[arg-type]


def test_causes_errors_and_symptoms() -> None:
    killed = _failure(1, -9, 10.0)
    segv = _failure(1, -11, 10.0)
    teardown_kill = _failure(1, -9, 1.0, by_teardown=True)
    terminated = _failure(2, -15, 1.0)  # torchrun's SIGTERM to its other ranks
    own = _failure(0, 1, 5.0, traceback="ValueError: bad batch")
    broken = _failure(0, 1, 1.0, traceback=GLOO)
    lost = Failure("h", None, None, 9.0, "lost host h: no heartbeat", [])
    launcher = Failure("h", None, 1, 9.0, "the launcher on h exited with code 1", [])
    hang = Failure("h", 0, None, 9.0, "hang: ...", ["train.py:3"], tail="stack")
    assert {classify(f) for f in (killed, segv, lost, hang)} == {CauseClass.CAUSE}
    assert {classify(f) for f in (own, launcher)} == {CauseClass.ERROR}
    assert {classify(f) for f in (teardown_kill, terminated, broken)} == {CauseClass.SYMPTOM}
    # a rank's own error explains a later... and an earlier broken collective
    assert ordered([broken, own, terminated]) == [own, broken, terminated]
    assert ordered([own, teardown_kill, killed]) == [killed, own, teardown_kill]
    # in one class, the earliest
    assert ordered([lost, killed]) == [lost, killed]
    assert collective_peer(broken) == "10.77.0.2" and collective_peer(own) is None


def test_a_rank_error_is_dated_by_its_error_file() -> None:
    # the agent saw rank 0 end at 20 s (its pipes closed late); its error file says
    # the exception was raised at 12 s, before rank 1's at 15 s
    late_pipes = RankRecord("a", 0, code=1, time=20.0, error={"timestamp": 12.0})
    other = RankRecord("b", 1, code=1, time=15.0, error={"timestamp": 15.0})

    def shifted(t: float) -> float:  # the host's clock, put on the coordinator's
        return t + 0.5

    first = rank_failure(late_pipes, shifted, by_teardown=False)
    second = rank_failure(other, shifted, by_teardown=False)
    assert first.time == 12.5 and ordered([second, first]) == [first, second]
