"""The supervisor against the scripted fake transport: no process is started."""

from __future__ import annotations

import asyncio
import io
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from rich.console import Console

from corral.agent.protocol import NODE, encode_event
from corral.cluster import Cluster, Host
from corral.job.logfiles import LogFiles
from corral.job.output import TerminalOutput
from corral.job.result import Failure, JobResult, NodeReport, NodeRun, RankRecord
from corral.job.states import JobState, NodeState
from corral.job.summary import print_report
from corral.job.supervisor import (
    EXIT_INTERRUPTED,
    EXIT_LAUNCH,
    EXIT_LOST,
    EXIT_TIMEOUT,
    AttemptSupervisor,
)
from corral.plan.render import plan_job
from corral.plan.spec import JobSpec
from corral.transport.fake import FakeNode, FakeTransport

HOSTS = ("a", "b", "c")


def _commands() -> list:  # type: ignore[type-arg]
    cluster = Cluster(
        tuple(Host(h, address=f"10.77.0.{i + 1}", slots=2) for i, h in enumerate(HOSTS))
    )
    spec = JobSpec(
        script="t.py", launcher="python", job_id="j", python="python3", workdir="/w", run_dir="/r"
    )
    return plan_job(spec, cluster)


async def _until(condition: Callable[[], bool], deadline: float = 20.0) -> None:
    """Wait until ``condition()`` holds (fails after a generous deadline)."""
    end = time.monotonic() + deadline
    while not condition():
        assert time.monotonic() < end, "condition not reached in time"
        await asyncio.sleep(0.01)


def _ranks(node: FakeNode) -> list[int]:
    return {"a": [0, 1], "b": [2, 3], "c": [4, 5]}[node.host.name]


async def _stop_on_request(node: FakeNode, code: int = -15) -> int:
    """Wait for stop, then report the node's remaining ranks as terminated."""
    await node.next_op("stop")
    for rank in _ranks(node):
        node.event("rank_exit", rank=rank, code=code, eof_time=time.time())
    node.event("node_exit", ranks={})
    return 0


async def succeed(node: FakeNode) -> int:
    node.event("started", pid=1, pgids=[1])
    for rank in _ranks(node):
        node.out(rank, f"hello from {rank}\nsecond line\n")
        node.event("rank_exit", rank=rank, code=0, eof_time=time.time())
    node.event("node_exit", ranks={})
    return 0


async def run_sup(
    transport: FakeTransport, tmp_path: Path, **kw: object
) -> tuple[JobResult, bytes, str]:
    out = io.BytesIO()
    console = Console(file=io.StringIO(), width=200)
    sink = TerminalOutput(list(HOSTS), stream=out, live=False, console=console)
    sup = AttemptSupervisor(
        _commands(),
        transport,
        sink.on_event,
        logs=LogFiles(tmp_path / "logs"),
        job_id="j",
        agent_argv=lambda h: ["python3", "-m", "corral.agent"],
        heartbeat_interval=0.05,
        **kw,
    )  # type: ignore[arg-type]
    result = await asyncio.wait_for(sup.run(handle_signals=False), 20)
    sink.close()
    print_report(result, console)
    assert isinstance(console.file, io.StringIO)
    return result, out.getvalue(), console.file.getvalue()


def test_success_prefixes_every_line_and_tees_logs(tmp_path: Path) -> None:
    transport = FakeTransport({h: succeed for h in HOSTS})
    result, out, report = asyncio.run(run_sup(transport, tmp_path))
    assert result.state == JobState.SUCCEEDED and result.exit_code == 0
    lines = out.decode().splitlines()
    for rank, host in [(0, "a"), (3, "b"), (5, "c")]:
        assert f"[{host}:{rank}] hello from {rank}" in lines
        assert f"[{host}:{rank}] second line" in lines
    assert len(lines) == 12
    assert (tmp_path / "logs" / "b.3.log").read_text() == "hello from 3\nsecond line\n"
    assert all(n.state == NodeState.EXITED for n in result.nodes)
    # the agent got a start message with its node's command
    start = transport.nodes["b"].received[0]
    assert start["op"] == "start" and start["node"]["host"] == "b"
    assert "succeeded" in report


def test_first_failure_stops_every_node_and_names_the_rank(tmp_path: Path) -> None:
    async def failing(node: FakeNode) -> int:
        node.event("started", pid=1, pgids=[1])
        node.err(3, "Traceback...\nValueError: bad batch\n")
        node.event("rank_exit", rank=3, code=7, eof_time=time.time())
        return await _stop_on_request(node)

    transport = FakeTransport(
        {"a": _stop_on_request_started, "b": failing, "c": _stop_on_request_started}
    )
    result, _, report = asyncio.run(run_sup(transport, tmp_path))
    assert result.state == JobState.FAILED
    assert result.exit_code == 7
    cause = result.root_cause
    assert cause is not None and (cause.host, cause.rank, cause.code) == ("b", 3, 7)
    assert cause.stderr_tail == ["Traceback...", "ValueError: bad batch"]
    for name in HOSTS:  # every node was asked to stop
        assert any(op["op"] == "stop" for op in transport.nodes[name].received)
    states = {n.host.name: n.state for n in result.nodes}
    assert states == {"a": NodeState.TERMINATED, "b": NodeState.FAILED, "c": NodeState.TERMINATED}
    assert "root cause: rank 3 on b exited with code 7" in report
    assert "ValueError: bad batch" in report


async def _stop_on_request_started(node: FakeNode) -> int:
    node.event("started", pid=1, pgids=[1])
    return await _stop_on_request(node)


def test_earliest_failure_is_the_root_cause_even_if_reported_later(tmp_path: Path) -> None:
    early = time.time()

    async def late_reporter(node: FakeNode) -> int:
        node.event("started", pid=1, pgids=[1])
        await node.next_op("stop")
        # torchrun reports a SIGKILLed rank only when it exits, after the stop
        node.event("rank_exit", rank=0, code=-9, eof_time=early)
        node.event("rank_exit", rank=1, code=-15, eof_time=time.time())
        node.event("node_exit", ranks={})
        return 0

    async def quick_failure(node: FakeNode) -> int:
        node.event("started", pid=1, pgids=[1])
        await asyncio.sleep(0.05)
        node.event(
            "rank_exit",
            rank=2,
            code=1,
            eof_time=time.time(),
            error={"traceback": "RuntimeError: gloo connection reset"},
        )
        return await _stop_on_request(node)

    transport = FakeTransport(
        {"a": late_reporter, "b": quick_failure, "c": _stop_on_request_started}
    )
    result, _, report = asyncio.run(run_sup(transport, tmp_path))
    cause = result.root_cause
    assert cause is not None and (cause.host, cause.rank, cause.signal) == ("a", 0, "SIGKILL")
    assert result.exit_code == 128 + 9
    assert "OOM" in report
    assert [f.rank for f in result.failures] == [0, 2]
    # the live output names the same root cause as the summary, once it is known
    stopping = report.index("[corral] rank 2 on b exited with code 1: stopping the job")
    live = report.index(
        "[corral] root cause: rank 0 on a killed by SIGKILL (before rank 2 on b exited with code 1)"
    )
    assert stopping < live < report.index("root cause: rank 0 on a killed by SIGKILL\n")
    assert report.count("[corral] root cause:") == 1  # rank 1's SIGTERM came after the stop


def test_a_later_failure_reported_after_the_stop_is_not_called_the_root_cause(
    tmp_path: Path,
) -> None:
    async def failing(node: FakeNode) -> int:
        node.event("started", pid=1, pgids=[1])
        node.event("rank_exit", rank=3, code=7, eof_time=time.time())
        return await _stop_on_request(node)

    transport = FakeTransport(
        {"a": _stop_on_request_started, "b": failing, "c": _stop_on_request_started}
    )
    result, _, report = asyncio.run(run_sup(transport, tmp_path))
    assert result.root_cause is not None and result.root_cause.rank == 3
    assert "[corral] rank 3 on b exited with code 7: stopping the job" in report
    assert "[corral] root cause:" not in report


def test_lost_host_is_reported_and_the_rest_torn_down(tmp_path: Path) -> None:
    async def vanish(node: FakeNode) -> int:
        node.event("started", pid=1, pgids=[1])
        await asyncio.sleep(0.05)
        return 255  # connection dropped: no node_exit event

    transport = FakeTransport(
        {"a": _stop_on_request_started, "b": vanish, "c": _stop_on_request_started}
    )
    result, _, report = asyncio.run(run_sup(transport, tmp_path))
    assert result.exit_code == EXIT_LOST
    assert {n.host.name: n.state for n in result.nodes}["b"] == NodeState.LOST
    assert "lost host b" in report


def test_unreachable_host_fails_the_launch(tmp_path: Path) -> None:
    transport = FakeTransport({h: _stop_on_request_started for h in HOSTS}, unreachable=["c"])
    result, _, report = asyncio.run(run_sup(transport, tmp_path))
    assert result.state == JobState.FAILED and result.exit_code == EXIT_LAUNCH
    assert "could not start the node" in report and "unreachable" in report


def test_timeout_stops_the_job(tmp_path: Path) -> None:
    transport = FakeTransport({h: _stop_on_request_started for h in HOSTS})
    result, _, _ = asyncio.run(run_sup(transport, tmp_path, timeout=0.3))
    assert result.state == JobState.TIMED_OUT and result.exit_code == EXIT_TIMEOUT
    assert all(n.state == NodeState.TERMINATED for n in result.nodes)


def test_interrupt_stops_once_then_kills(tmp_path: Path) -> None:
    async def stubborn(node: FakeNode) -> int:
        node.event("started", pid=1, pgids=[1])
        await node.next_op("kill")
        return -9

    async def main() -> tuple[object, dict[str, FakeNode]]:
        transport = FakeTransport({h: stubborn for h in HOSTS})
        sink = TerminalOutput(
            list(HOSTS),
            stream=io.BytesIO(),
            live=False,
            console=Console(file=io.StringIO()),
        )
        sup = AttemptSupervisor(
            _commands(),
            transport,
            sink.on_event,
            logs=LogFiles(tmp_path / "logs"),
            job_id="j",
            agent_argv=lambda h: ["x"],
            heartbeat_interval=0.05,
            grace=30,
        )
        task = asyncio.ensure_future(sup.run(handle_signals=False))
        await _until(lambda: sup.state == JobState.RUNNING)
        sup.interrupt()

        def stops() -> list[object]:
            return [op for n in transport.nodes.values() for op in n.received if op["op"] == "stop"]

        await _until(lambda: len(stops()) >= 3)
        assert len(stops()) == 3
        sup.interrupt()  # second Ctrl-C: kill now instead of waiting 30 s of grace
        result = await asyncio.wait_for(task, 10)
        return result, transport.nodes

    result, nodes = asyncio.run(main())
    assert result.state == JobState.CANCELLED  # type: ignore[attr-defined]
    assert result.exit_code == EXIT_INTERRUPTED  # type: ignore[attr-defined]
    assert all(any(op["op"] == "kill" for op in n.received) for n in nodes.values())


def test_heartbeats_are_sent(tmp_path: Path) -> None:
    async def slow(node: FakeNode) -> int:
        node.event("started", pid=1, pgids=[1])
        await asyncio.sleep(0.4)
        return await succeed(node)

    transport = FakeTransport({h: slow for h in HOSTS})
    asyncio.run(run_sup(transport, tmp_path))
    assert sum(op["op"] == "hb" for op in transport.nodes["a"].received) >= 3


def test_master_timeout_fails_torchrun_jobs(tmp_path: Path) -> None:
    async def no_master(node: FakeNode) -> int:
        node.event("started", pid=1, pgids=[1])
        if node.host.name == "a":
            node.event("master_timeout", addr="10.77.0.1", port=29500, timeout=5)
        return await _stop_on_request(node)

    transport = FakeTransport({h: no_master for h in HOSTS})
    result, _, report = asyncio.run(run_sup(transport, tmp_path))
    assert result.exit_code == EXIT_LAUNCH
    assert "did not accept connections within 5 s" in report


def test_node_level_output_has_host_only_prefix(tmp_path: Path) -> None:
    async def chatty(node: FakeNode) -> int:
        node.out(NODE, "torchrun banner\n")
        return await succeed(node)

    transport = FakeTransport({h: chatty for h in HOSTS})
    _, out, _ = asyncio.run(run_sup(transport, tmp_path))
    assert "[a] torchrun banner" in out.decode().splitlines()
    assert (tmp_path / "logs" / "a.node.log").read_text() == "torchrun banner\n"


@pytest.mark.parametrize("code", [0, 1])
def test_progress_reports_reach_the_summary(tmp_path: Path, code: int) -> None:
    async def reporting(node: FakeNode) -> int:
        node.event("started", pid=1, pgids=[1])
        rank = _ranks(node)[0]
        node.event("report", type="progress", rank=rank, step=40, total=60, metrics={"loss": 0.25})
        return await succeed(node)

    transport = FakeTransport({h: reporting for h in HOSTS})
    result, _, report = asyncio.run(run_sup(transport, tmp_path))
    assert "step 40/60 loss=0.25 (rank 2)" in report  # b's lowest rank: 2
    assert result.nodes[0].ranks[0].progress is not None


def test_a_report_is_dated_when_the_rank_made_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """The SDK sends reports in batches; the agent dates each by its age in the rank's
    buffer, and Progress carries that date on our clock (rates stay true)."""
    node = NodeRun(_commands()[0], clock_offset=100.0)  # the host's clock is 100 s behind
    monkeypatch.setattr(time, "time", lambda: 1000.0)
    assert node.made_at(899.85) == pytest.approx(999.85)  # 150 ms in the rank's buffer
    assert node.made_at(950.0) == 1000.0  # never in the future
    assert node.made_at(10.0) == 995.0  # a clock that jumped: at most 5 s back
    assert node.made_at(None) == 1000.0


def test_launcher_failing_before_any_rank_fails_the_job(tmp_path: Path) -> None:
    async def torchrun_dies(node: FakeNode) -> int:
        node.event("started", pid=1, pgids=[1])
        if node.host.name == "b":
            node.err(NODE, "RendezvousTimeoutError: join timed out\n")
            node.event("node_exit", ranks={}, code=1)
            return 0
        return await _stop_on_request(node)

    transport = FakeTransport({h: torchrun_dies for h in HOSTS})
    result, _, report = asyncio.run(run_sup(transport, tmp_path))
    assert result.state == JobState.FAILED and result.exit_code == 1
    assert "the launcher on b exited with code 1" in report
    assert "RendezvousTimeoutError: join timed out" in report  # node-level stderr tail
    assert {n.host.name: n.state for n in result.nodes}["b"] == NodeState.FAILED


def test_node_that_cannot_start_is_failed_not_lost(tmp_path: Path) -> None:
    async def bad_workdir(node: FakeNode) -> int:
        if node.host.name == "c":
            node.event("start_failed", error="working directory /nope does not exist")
            return 3
        return await _stop_on_request_started(node)

    transport = FakeTransport({h: bad_workdir for h in HOSTS})
    result, _, report = asyncio.run(run_sup(transport, tmp_path))
    assert result.exit_code == EXIT_LAUNCH
    assert {n.host.name: n.state for n in result.nodes}["c"] == NodeState.FAILED
    assert "working directory /nope does not exist" in report


def test_garbled_agent_output_kills_that_agent_instead_of_hanging(tmp_path: Path) -> None:
    async def garbage(node: FakeNode) -> int:
        node.event("started", pid=1, pgids=[1])
        if node.host.name == "a":
            node.stdout.feed_data(b"this is not a frame\n")
            await asyncio.sleep(30)  # would hang if corral stopped reading without killing
        return await _stop_on_request(node)

    transport = FakeTransport({h: garbage for h in HOSTS})
    result, _, report = asyncio.run(run_sup(transport, tmp_path))
    assert 9 in transport.nodes["a"].signals
    assert result.exit_code == EXIT_LOST and "lost host a" in report


def test_failures_are_ordered_on_the_coordinators_clock(tmp_path: Path) -> None:
    """Host b's clock runs 100 s fast. Its rank died 1 s before a's but is reported
    only after the stop (as torchrun does for a SIGKILLed rank): it is still the
    root cause once b's times are put on the coordinator's clock."""
    skew = 100.0

    def skewed_event(node: FakeNode, **fields: object) -> None:
        node.stdout.feed_data(encode_event({"time": time.time() + skew, **fields}))

    async def host_a(node: FakeNode) -> int:
        node.event("started", pid=1, pgids=[1])
        await asyncio.sleep(0.1)
        node.event("rank_exit", rank=0, code=3, eof_time=time.time())
        return await _stop_on_request(node)

    async def host_b(node: FakeNode) -> int:
        skewed_event(node, event="started", pid=1, pgids=[1])
        await node.next_op("stop")
        skewed_event(node, event="rank_exit", rank=2, code=-9, eof_time=time.time() - 1.0 + skew)
        skewed_event(node, event="rank_exit", rank=3, code=-15, eof_time=time.time() + skew)
        skewed_event(node, event="node_exit", ranks={})
        return 0

    transport = FakeTransport({"a": host_a, "b": host_b, "c": _stop_on_request_started})
    result, _, _ = asyncio.run(run_sup(transport, tmp_path))
    cause = result.root_cause
    assert cause is not None and (cause.host, cause.rank, cause.code) == ("b", 2, -9)
    assert result.exit_code == 128 + 9


async def _heartbeating(node: FakeNode) -> int:
    """Started, then only the agent's own heartbeats until asked to stop."""
    node.event("started", pid=1, pgids=[1])

    async def beat() -> None:
        while True:
            node.event("hb")
            await asyncio.sleep(0.05)

    task = asyncio.ensure_future(beat())
    try:
        return await _stop_on_request(node)
    finally:
        task.cancel()


async def _goes_silent(node: FakeNode) -> int:
    """Started, then nothing at all (a cut link): not even a reply to stop."""
    node.event("started", pid=1, pgids=[1])
    await asyncio.sleep(3600)
    return 0


def test_a_silent_host_is_lost_after_the_host_timeout(tmp_path: Path) -> None:
    transport = FakeTransport({"a": _heartbeating, "b": _heartbeating, "c": _goes_silent})
    started = time.monotonic()
    result, _, report = asyncio.run(run_sup(transport, tmp_path, host_timeout=0.6))
    assert time.monotonic() - started < 15  # a bound, not a timing: it must not hang
    assert result.state == JobState.FAILED and result.exit_code == EXIT_LOST
    cause = result.root_cause
    assert cause is not None and cause.host == "c" and cause.rank is None
    assert "lost host c: no heartbeat from its agent for 0.6 s (--host-timeout)" in cause.message
    states = {n.host.name: n.state for n in result.nodes}
    assert states["c"] == NodeState.LOST
    assert states["a"] == states["b"] == NodeState.TERMINATED
    assert 9 in transport.nodes["c"].signals  # its channel was killed
    assert "lost host c" in report


def test_heartbeats_keep_a_quiet_host_alive(tmp_path: Path) -> None:
    async def quiet_then_done(node: FakeNode) -> int:
        node.event("started", pid=1, pgids=[1])
        for _ in range(20):  # 1 s without output, longer than the host timeout
            node.event("hb")
            await asyncio.sleep(0.05)
        for rank in _ranks(node):
            node.event("rank_exit", rank=rank, code=0, eof_time=time.time())
        node.event("node_exit", ranks={})
        return 0

    transport = FakeTransport({h: quiet_then_done for h in HOSTS})
    result, _, _ = asyncio.run(run_sup(transport, tmp_path, host_timeout=0.4))
    assert result.state == JobState.SUCCEEDED


_SLEEPING = (
    'Thread 1 (idle): "MainThread"\n    hang_forever (train.py:12)\n    main (train.py:30)\n'
)
_WAITING = (
    'Thread 1 (active): "MainThread"\n'
    "    all_reduce (torch/distributed/distributed_c10d.py:2500)\n"
    "    main (train.py:28)\n"
)


def test_a_hang_dumps_stacks_and_names_the_stuck_rank(tmp_path: Path) -> None:
    sleeping, waiting = _SLEEPING, _WAITING

    def hanging(stuck_rank: int | None):  # type: ignore[no-untyped-def]
        async def behave(node: FakeNode) -> int:
            node.event("started", pid=1, pgids=[1])
            for rank in _ranks(node):
                node.event("rank_start", rank=rank, local_rank=rank % 2, pid=100 + rank)
                node.event("report", type="progress", rank=rank, step=5, total=10)
            await node.next_op("dump")
            stacks = [
                {"rank": r, "pid": 100 + r, "method": "py-spy", "error": None,
                 "text": sleeping if r == stuck_rank else waiting}
                for r in _ranks(node)
            ]  # fmt: skip
            node.event("stacks", stacks=stacks)
            return await _stop_on_request(node)

        return behave

    transport = FakeTransport({"a": hanging(None), "b": hanging(3), "c": hanging(None)})
    result, _, report = asyncio.run(
        run_sup(transport, tmp_path, hang_timeout=1.0, hang_dir=tmp_path / "hang")
    )
    assert "root cause: hang:" in report
    assert result.state == JobState.FAILED and result.exit_code == 125
    cause = result.root_cause
    assert cause is not None and (cause.host, cause.rank) == ("b", 3)
    assert "hang: no rank made progress" in cause.message
    assert "is stuck in hang_forever (train.py:12)" in cause.message
    assert "the stack of rank 3 on b, innermost frame first:" in report
    assert "lines of stderr" not in report  # the tail is the rank's stack
    assert "hang_forever" in (tmp_path / "hang" / "b.3.txt").read_text()
    assert "all_reduce" in (tmp_path / "hang" / "a.0.txt").read_text()
    assert len(list((tmp_path / "hang").glob("*.txt"))) == 6


def test_a_hang_with_every_rank_on_one_line_blames_none_of_them(tmp_path: Path) -> None:
    async def all_asleep(node: FakeNode) -> int:
        node.event("started", pid=1, pgids=[1])
        for rank in _ranks(node):
            node.event("rank_start", rank=rank, local_rank=rank % 2, pid=100 + rank)
            node.event("report", type="progress", rank=rank, step=5, total=10)
        await node.next_op("dump")
        stacks = [
            {"rank": r, "pid": 100 + r, "method": "py-spy", "error": None, "text": _SLEEPING}
            for r in _ranks(node)
        ]
        node.event("stacks", stacks=stacks)
        return await _stop_on_request(node)

    transport = FakeTransport({h: all_asleep for h in HOSTS})
    result, _, report = asyncio.run(
        run_sup(transport, tmp_path, hang_timeout=1.0, hang_dir=tmp_path / "hang")
    )
    cause = result.root_cause
    assert cause is not None and result.exit_code == 125
    assert cause.rank is None  # not "rank 0 on a"
    assert "; all 6 ranks at hang_forever (train.py:12)" in cause.message
    assert "is stuck in" not in cause.message
    assert "the stack every rank shares, innermost frame first:" in report
    assert cause.stderr_tail[0] == "hang_forever (train.py:12)"


def test_node_output_after_its_ranks_ended_is_folded_and_logged(tmp_path: Path) -> None:
    async def noisy_exit(node: FakeNode) -> int:
        node.event("started", pid=1, pgids=[1])
        node.out(NODE, "torchrun banner\n")
        first, second = _ranks(node)
        node.event("rank_exit", rank=first, code=0, eof_time=time.time())
        node.out(NODE, "one rank still running\n")
        node.event("rank_exit", rank=second, code=0, eof_time=time.time())
        node.err(NODE, "[W TCPStore.cpp] recvVector failed\nDid the remote server shutdown?\n")
        node.event("node_exit", ranks={})
        return 0

    transport = FakeTransport({h: noisy_exit for h in HOSTS})
    result, out, report = asyncio.run(run_sup(transport, tmp_path))
    assert result.state == JobState.SUCCEEDED
    shown = out.decode().splitlines()
    assert "[a] torchrun banner" in shown and "[a] one rank still running" in shown
    assert "recvVector" not in out.decode()
    assert "[corral] a: the launcher's teardown output (2 lines) is in a.node.log" in report
    assert "recvVector failed" in (tmp_path / "logs" / "a.node.log").read_text()


@pytest.mark.parametrize("torchrun", [True, False])
def test_the_master_message_says_what_the_endpoint_is(tmp_path: Path, torchrun: bool) -> None:
    async def hosting(node: FakeNode) -> int:
        node.event("started", pid=1, pgids=[1])
        if node.host.name == "a":
            node.event("master_ready", addr="10.77.0.1", port=29500)
        return await succeed(node)

    transport = FakeTransport({h: hosting for h in HOSTS})
    _, _, report = asyncio.run(run_sup(transport, tmp_path, require_master=torchrun))
    ready = "[corral] Master node 10.77.0.1:29500 is ready for connections ("
    assert (
        ready
        + (
            "torchrun's c10d rendezvous endpoint; the ranks' MASTER_PORT is one torchrun picks)"
            if torchrun
            else "the ranks' MASTER_ADDR:MASTER_PORT)"
        )
        in report
    )
    waiting = "torchrun's rendezvous endpoint" if torchrun else "master"
    assert f"[corral] Waiting for {waiting} 10.77.0.1:" in report


def _supervisor(transport: FakeTransport, tmp_path: Path, **kw: object) -> AttemptSupervisor:
    return AttemptSupervisor(
        _commands(),
        transport,
        lambda _event: None,
        logs=LogFiles(tmp_path / "logs"),
        job_id="j",
        agent_argv=lambda h: ["python3", "-m", "corral.agent"],
        heartbeat_interval=0.05,
        **kw,
    )  # type: ignore[arg-type]


def test_the_outcome_is_decided_once_and_names_the_earliest_failure(tmp_path: Path) -> None:
    from corral.job.supervisor import SUCCESS, Outcome

    async def late_but_first(node: FakeNode) -> int:  # failed first, reported after the stop
        node.event("started", pid=1, pgids=[1])
        await node.next_op("stop")
        node.event("rank_exit", rank=0, code=-9, eof_time=time.time() - 60)
        node.event("rank_exit", rank=1, code=-15, eof_time=time.time())
        node.event("node_exit", ranks={})
        return 0

    async def failing(node: FakeNode) -> int:
        node.event("started", pid=1, pgids=[1])
        node.event("rank_exit", rank=3, code=7, eof_time=time.time())
        return await _stop_on_request(node)

    transport = FakeTransport({"a": late_but_first, "b": failing, "c": _stop_on_request_started})
    sup = _supervisor(transport, tmp_path)
    assert sup.outcome() == SUCCESS and sup.decision is None
    result = asyncio.run(asyncio.wait_for(sup.run(), 20))
    assert sup.decision is not None and sup.decision.cause is not None
    assert (sup.decision.state, sup.decision.exit_code, sup.decision.reason) == (
        JobState.FAILED,
        7,
        "failure",
    )
    assert sup.decision.cause.rank == 3  # what stopped the job ...
    outcome = sup.outcome()
    assert isinstance(outcome, Outcome) and outcome.cause is not None
    assert (outcome.cause.host, outcome.cause.rank) == ("a", 0)  # ... the earliest failure
    assert (outcome.state, outcome.exit_code) == (JobState.FAILED, 128 + 9)
    assert (result.state, result.exit_code, result.reason) == (
        outcome.state,
        outcome.exit_code,
        outcome.reason,
    )
    assert result.root_cause is outcome.cause


def test_a_timeout_outcome_is_not_replaced_by_a_later_interrupt(tmp_path: Path) -> None:
    transport = FakeTransport({h: _stop_on_request_started for h in HOSTS})
    sup = _supervisor(transport, tmp_path, timeout=0.2)

    async def go() -> JobResult:
        task = asyncio.ensure_future(sup.run())
        await _until(lambda: sup.decision is not None)
        sup.interrupt()  # a stop request after the deadline's teardown began
        return await asyncio.wait_for(task, 20)

    result = asyncio.run(go())
    assert sup.outcome().state == result.state == JobState.TIMED_OUT
    assert result.exit_code == EXIT_TIMEOUT and result.reason == "timeout"


@pytest.mark.parametrize(
    ("report", "fault", "stopping", "rank_codes", "expected"),
    [
        (None, False, False, [], NodeState.LOST),  # the agent went without a last word
        (None, True, True, [1], NodeState.LOST),
        (NodeReport(started=False), True, False, [], NodeState.FAILED),
        (NodeReport(code=1), True, True, [1], NodeState.FAILED),  # failed before the stop
        (NodeReport(code=0), False, True, [0], NodeState.TERMINATED),  # corral stopped it
        (NodeReport(code=0), False, False, [0, -15], NodeState.TERMINATED),
        (NodeReport(code=0), False, False, [0, 0], NodeState.EXITED),
    ],
)
def test_a_node_settles_by_its_agents_last_word_and_its_own_failure(
    report: NodeReport | None,
    fault: bool,
    stopping: bool,
    rank_codes: list[int],
    expected: NodeState,
) -> None:
    node = NodeRun(command=_commands()[0])
    node.report = report
    node.fault = Failure("a", None, 1, 0.0, "rank 0 on a exited with code 1", []) if fault else None
    for rank, code in enumerate(rank_codes):
        node.ranks[rank] = RankRecord(host="a", rank=rank, code=code, exited=True)
    assert node.settled(stopping=stopping) is expected
