"""The job engine against the scripted fake transport: states, events, restarts, stop,
the files it writes. No process is started."""

from __future__ import annotations

import asyncio
import io
import json
import re
import stat
import time
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from corral.cluster import load_cluster
from corral.job.engine import Job
from corral.job.events import (
    AttemptEnded,
    AttemptStarted,
    Finished,
    JobEvent,
    LogLines,
    NodeChanged,
    StateChanged,
)
from corral.job.options import CheckPolicy, RestartPolicy, SupervisionPolicy
from corral.job.output import TerminalOutput
from corral.job.result import EXIT_INTERRUPTED
from corral.job.states import JobState, NodeState
from corral.job.summary import print_finished
from corral.plan.spec import JobSpec
from corral.redact import REDACTED
from corral.transport.fake import FakeNode, FakeTransport

HOSTS = ("local-0", "local-1")


def _rank(node: FakeNode) -> int:
    return HOSTS.index(node.host.name)


async def succeed(node: FakeNode) -> int:
    node.event("started", pid=1, pgids=[1])
    rank = _rank(node)
    node.event("rank_start", rank=rank, pid=100 + rank)
    node.out(rank, f"hello from {rank}\n")
    node.event("rank_exit", rank=rank, code=0, eof_time=time.time())
    node.event("node_exit", code=0, ranks={})
    return 0


async def fail(node: FakeNode) -> int:
    node.event("started", pid=1, pgids=[1])
    rank = _rank(node)
    node.event("rank_start", rank=rank, pid=100 + rank)
    node.err(rank, "Traceback: boom\n")
    node.event("rank_exit", rank=rank, code=1, eof_time=time.time())
    node.event("node_exit", code=1, ranks={})
    return 0


async def run_until_stopped(node: FakeNode) -> int:
    """Runs until corral stops it; then the launcher exits 1, as torchrun does on SIGTERM."""
    node.event("started", pid=1, pgids=[1])
    rank = _rank(node)
    node.event("rank_start", rank=rank, pid=100 + rank)
    await node.next_op("stop")
    node.err(-1, "torch.distributed.elastic.multiprocessing.api.SignalException: got signal 15\n")
    node.event("rank_exit", rank=rank, code=-15, eof_time=time.time())
    node.event("node_exit", code=1, ranks={})
    return 0


def _job(tmp_path: Path, transport: FakeTransport, **kw: Any) -> tuple[Job, list[JobEvent]]:
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    spec = JobSpec(
        script=str(script),
        launcher="python",
        job_id="j1",
        master_port=0,
        run_dir=str(tmp_path / "runs"),
        env=kw.pop("env", {}),
        secret_env=kw.pop("secret_env", ()),
    )
    job = Job(
        spec,
        load_cluster("local:2"),
        checks=CheckPolicy(enabled=False),
        supervision=SupervisionPolicy(grace=5.0),
        transport=transport,
        **kw,
    )
    events: list[JobEvent] = []
    job.subscribe(events.append)
    return job, events


def _states(events: list[JobEvent]) -> list[str]:
    return [e.state.value for e in events if isinstance(e, StateChanged)]


def test_a_job_moves_through_its_states_and_tells_subscribers(tmp_path: Path) -> None:
    transport = FakeTransport({h: succeed for h in HOSTS})
    job, events = _job(tmp_path, transport)
    result = asyncio.run(asyncio.wait_for(job.run(), 20))
    assert result.state == JobState.SUCCEEDED and result.exit_code == 0
    assert job.state == JobState.SUCCEEDED
    assert _states(events) == ["preparing", "starting", "running", "succeeded"]
    started = [e for e in events if isinstance(e, AttemptStarted)]
    assert [(e.number, e.world_size, e.hosts) for e in started] == [(0, 2, list(HOSTS))]
    logs = {(e.host, e.rank, e.data) for e in events if isinstance(e, LogLines)}
    assert ("local-0", 0, b"hello from 0\n") in logs and ("local-1", 1, b"hello from 1\n") in logs
    assert {e.host: e.state for e in events if isinstance(e, NodeChanged)} == {
        "local-0": NodeState.EXITED,
        "local-1": NodeState.EXITED,
    }
    finished = events[-1]
    assert isinstance(finished, Finished) and finished.exit_code == 0
    assert finished.state == JobState.SUCCEEDED
    # the engine writes every rank's output, whoever subscribes
    log = tmp_path / "runs" / "j1" / "logs" / "local-1.1.log"
    assert log.read_bytes() == b"hello from 1\n"


def test_job_files_are_private_and_secret_values_redacted(tmp_path: Path) -> None:
    transport = FakeTransport({h: succeed for h in HOSTS})
    env = {"HF_TOKEN": "tok-123", "DB_URL": "postgres://u:pw@h/db", "PLAIN": "visible"}
    job, _ = _job(tmp_path, transport, env=env, secret_env=("DB_URL",))
    asyncio.run(asyncio.wait_for(job.run(), 20))
    job_dir = tmp_path / "runs" / "j1"
    assert stat.S_IMODE(job_dir.stat().st_mode) == 0o700
    assert stat.S_IMODE((job_dir / "logs").stat().st_mode) == 0o700
    for name in ("plan.json", "job.json", "result.json", "attempts.json"):
        path = job_dir / name
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, name
        assert "tok-123" not in path.read_text() and "pw@h" not in path.read_text(), name
    ssh = json.loads((job_dir / "job.json").read_text())["ssh"]
    assert ssh["insecure_no_host_key_check"] is False and ssh["accept_new_host_keys"] is False
    nodes = json.loads((job_dir / "plan.json").read_text())["nodes"]
    assert nodes[0]["env"]["HF_TOKEN"] == REDACTED and nodes[0]["env"]["DB_URL"] == REDACTED
    assert nodes[0]["env"]["PLAIN"] == "visible"
    # ... while the node itself gets the real values
    start = next(op for op in transport.nodes["local-0"].received if op["op"] == "start")
    assert start["node"]["env"]["HF_TOKEN"] == "tok-123"
    assert start["node"]["env"]["DB_URL"] == "postgres://u:pw@h/db"


def test_a_failed_attempt_is_restarted_through_the_restarting_state(tmp_path: Path) -> None:
    calls: dict[str, int] = {}

    async def fail_first(node: FakeNode) -> int:
        calls[node.host.name] = calls.get(node.host.name, 0) + 1
        if node.host.name == "local-1" and calls[node.host.name] == 1:
            return await fail(node)
        if calls[node.host.name] == 1:
            return await run_until_stopped(node)
        return await succeed(node)

    transport = FakeTransport({h: fail_first for h in HOSTS})
    job, events = _job(tmp_path, transport, restarts=RestartPolicy(max_restarts=1, backoff=0))
    result = asyncio.run(asyncio.wait_for(job.run(), 30))
    assert result.state == JobState.SUCCEEDED and result.exit_code == 0
    assert _states(events) == [
        "preparing",
        "starting",
        "running",
        "stopping",
        "restarting",
        "starting",
        "running",
        "succeeded",
    ]
    ended = [e for e in events if isinstance(e, AttemptEnded)]
    assert [(e.number, e.restart) for e in ended] == [(0, True), (1, False)]
    assert ended[0].record["cause"] == "rank 1 on local-1 exited with code 1"
    assert [a["state"] for a in result.attempts] == ["failed", "succeeded"]
    restarting = next(
        e for e in events if isinstance(e, StateChanged) and e.state.value == "restarting"
    )
    assert "restarting on 2 host(s)" in restarting.reason


def test_a_restart_prints_no_summary_until_the_job_has_finished(tmp_path: Path) -> None:
    calls: dict[str, int] = {}

    async def fail_first(node: FakeNode) -> int:
        calls[node.host.name] = calls.get(node.host.name, 0) + 1
        if calls[node.host.name] == 1:
            return await (fail if node.host.name == "local-1" else run_until_stopped)(node)
        return await succeed(node)

    transport = FakeTransport({h: fail_first for h in HOSTS})
    job, _ = _job(tmp_path, transport, restarts=RestartPolicy(max_restarts=1, backoff=0))
    console = Console(file=io.StringIO(), width=200)
    terminal = TerminalOutput(
        list(HOSTS), stream=io.BytesIO(), live=False, console=console, on_finish=print_finished
    )
    job.subscribe(terminal.on_event)
    result = asyncio.run(asyncio.wait_for(job.run(), 30))
    assert result.state == JobState.SUCCEEDED
    said = console.file.getvalue()  # type: ignore[attr-defined]
    restarted = said.index("[corral] attempt 0 failed: rank 1 on local-1 exited with code 1")
    last_attempt = said.index("[corral] job j1 (attempt 1):")
    # corral did not look as if it had exited: no summary before the last attempt ...
    assert not re.search(r"^(exit code|job j1: )", said[:last_attempt], re.M), said
    assert restarted < last_attempt
    # ... then one summary, its exit code, and the attempts table once, at the end
    assert said.count("exit code 0,") == 1 and said.count("job j1: succeeded") == 1
    tables = [m.start() for m in re.finditer(r"^attempts *$", said, re.M)]
    assert len(tables) == 1
    assert last_attempt < said.index("job j1: succeeded") < tables[0]


def test_no_restart_left_ends_the_job_failed_with_the_reason(tmp_path: Path) -> None:
    transport = FakeTransport({"local-0": run_until_stopped, "local-1": fail})
    job, events = _job(tmp_path, transport)
    result = asyncio.run(asyncio.wait_for(job.run(), 20))
    assert result.state == JobState.FAILED and result.exit_code == 1
    assert _states(events)[-2:] == ["stopping", "failed"]
    assert job.machine.reason == "no restarts allowed (--max-restarts 0)"
    root = result.root_cause
    assert root is not None and (root.host, root.rank) == ("local-1", 1)


def test_stop_before_launch_cancels_without_starting_anything(tmp_path: Path) -> None:
    transport = FakeTransport({h: succeed for h in HOSTS})
    job, events = _job(tmp_path, transport)

    async def main() -> Any:
        job.stop()
        return await asyncio.wait_for(job.run(), 20)

    result = asyncio.run(main())
    assert result.state == JobState.CANCELLED and result.exit_code == EXIT_INTERRUPTED
    assert transport.nodes == {}
    assert _states(events) == ["preparing", "cancelled"]


def test_stop_tears_down_and_nodes_read_as_stopped_not_failed(tmp_path: Path) -> None:
    transport = FakeTransport({h: run_until_stopped for h in HOSTS})
    job, events = _job(tmp_path, transport)
    out = io.BytesIO()
    console = Console(file=io.StringIO(), width=200)
    terminal = TerminalOutput(list(HOSTS), stream=out, live=False, console=console)
    job.subscribe(terminal.on_event)

    async def main() -> Any:
        running = asyncio.Event()
        job.subscribe(
            lambda e: (
                running.set()
                if isinstance(e, StateChanged) and e.state == JobState.RUNNING
                else None
            )
        )
        task = job.start()
        await asyncio.wait_for(running.wait(), 20)
        job.stop()
        return await asyncio.wait_for(task, 20)

    result = asyncio.run(main())
    assert result.state == JobState.CANCELLED and result.exit_code == EXIT_INTERRUPTED
    # the launchers exited 1 because corral stopped them: stopped, not failed
    assert {n.host.name: n.state for n in result.nodes} == {
        "local-0": NodeState.TERMINATED,
        "local-1": NodeState.TERMINATED,
    }
    assert result.failures == []
    assert _states(events)[-2:] == ["stopping", "cancelled"]
    # the launcher's teardown traceback is folded into one line, and kept in the log
    shown = out.getvalue().decode()
    assert "SignalException" not in shown
    said = console.file.getvalue()  # type: ignore[attr-defined]
    assert "local-0: the launcher's teardown output (1 line) is in local-0.node.log" in said
    node_log = tmp_path / "runs" / "j1" / "logs" / "local-0.node.log"
    assert "SignalException" in node_log.read_text()


def test_min_nodes_above_the_cluster_is_refused(tmp_path: Path) -> None:
    from corral.errors import ConfigError

    with pytest.raises(ConfigError, match="more than the 2 hosts") as info:
        _job(tmp_path, FakeTransport({}), restarts=RestartPolicy(min_nodes=3))
    assert info.value.option == "--min-nodes"


@pytest.mark.parametrize(
    ("policy", "option"),
    [
        (lambda: RestartPolicy(max_restarts=-1), "--max-restarts"),
        (lambda: RestartPolicy(backoff=-1), "--restart-backoff"),
        (lambda: SupervisionPolicy(host_timeout=0), "--host-timeout"),
        (lambda: SupervisionPolicy(hang_timeout=-5), "--hang-timeout"),
        (lambda: CheckPolicy(consistency_threshold=1.5), "--consistency-threshold"),
    ],
)
def test_policies_name_the_option_at_fault(policy: Any, option: str) -> None:
    from corral.errors import ConfigError

    with pytest.raises(ConfigError) as info:
        policy()
    assert info.value.option == option


def test_terminal_shows_the_latest_carriage_return_update_once_the_line_ends() -> None:
    out = io.BytesIO()
    terminal = TerminalOutput(["h"], stream=out, live=False, console=Console(file=io.StringIO()))
    terminal.lines("h", 0, b"epoch 1\n 10%|#  |\r 50%|###  |\r")
    assert terminal.bars[("h", 0)] == "50%|###  |"
    terminal.lines("h", 0, b"100%|#####|\n")
    terminal.close()
    assert out.getvalue() == b"[h:0] epoch 1\n[h:0] 100%|#####|\n"
    assert ("h", 0) not in terminal.bars


def test_terminal_live_footer_shows_a_progress_bar(tmp_path: Path) -> None:
    out = io.BytesIO()
    terminal = TerminalOutput(
        ["h"], stream=out, live=True, console=Console(file=io.StringIO(), force_terminal=True)
    )
    terminal.lines("h", 0, b" 42%|####      | 42/100\r")
    terminal.close()
    assert b"42%|####      | 42/100" in out.getvalue()
