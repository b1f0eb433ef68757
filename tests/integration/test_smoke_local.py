"""The collective smoke test (check 9) on the embedded ``local:N`` cluster: real
runners, real torch.distributed ranks (gloo), real teardown."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Awaitable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

import psutil
import pytest

from corral.checks.result import CheckResult, Status
from corral.checks.smoke import EXIT_FAILED, KILL_GRACE, MARGIN, smoke_test
from corral.cluster import Host, load_cluster
from corral.transport.local import LocalTransport

pytestmark = pytest.mark.torch  # the ranks import torch (checked before each test)

T = TypeVar("T")
MARK = "CORRAL_SMOKE_TEST_MARK"
#: How long teardown may take past the deadline: the coordinator's margin, SIGTERM
#: then SIGKILL grace, and slack for a loaded 2-core machine.
SLACK = MARGIN + 2 * KILL_GRACE + 15


def arun(coro: Awaitable[T]) -> T:
    async def main() -> T:
        return await coro

    return asyncio.run(main())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return False
    return True


def marked(mark: str) -> list[psutil.Process]:
    """Live processes whose environment carries this test's mark."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.status() != psutil.STATUS_ZOMBIE and proc.environ().get(MARK) == mark:
                found.append(proc)
        except psutil.Error:
            continue
    return found


def leftovers(mark: str, within: float = 5.0) -> list[str]:
    end = time.monotonic() + within
    while True:
        left = marked(mark)
        if not left or time.monotonic() >= end:
            return [" ".join(p.cmdline()[:6]) for p in left if p.is_running()]
        time.sleep(0.1)


@pytest.fixture
def mark() -> Iterator[str]:
    """A mark put in every smoke process's environment; anything left is killed after."""
    value = uuid.uuid4().hex
    yield value
    for proc in marked(value):
        proc.kill()


def hosts() -> list[Host]:
    return list(load_cluster("local:2").hosts)


async def smoke(
    mark: str,
    *,
    nproc: Mapping[str, int] | None = None,
    python: Mapping[str, str | None] | None = None,
    port: int | None = None,
    deadline: float = 30.0,
) -> tuple[CheckResult, list[str]]:
    """The result, and the smoke processes left once it returned (before the
    transport's own last-resort cleanup)."""
    hs = hosts()
    transport = LocalTransport()
    try:
        result = await smoke_test(
            transport,
            hs,
            master=hs[0],
            master_addr="127.0.0.1",
            port=port or free_port(),
            nproc=nproc or {"local-0": 1, "local-1": 2},
            python=python,
            env={h.name: {MARK: mark} for h in hs},
            deadline=deadline,
            size_mb=1.0,
            iterations=3,
        )
        return result, await asyncio.to_thread(leftovers, mark)
    finally:
        await transport.close()


def hang_python(tmp_path: Path, marker: str) -> str:
    """An "interpreter" that never runs anything: its host can never join."""
    path = tmp_path / "hang-python"
    path.write_text(f"#!/bin/sh\nexec sleep {marker}\n")
    path.chmod(0o755)
    return str(path)


def test_all_reduce_passes_with_bandwidth(mark: str) -> None:
    result, left = arun(smoke(mark))
    assert result.status is Status.PASS, result.to_json()
    assert result.name == "collective"
    assert result.hosts["local-0"].detail == "joined, 1 rank"
    assert result.hosts["local-1"].detail == "joined, 2 ranks"
    data = result.data
    assert data["world_size"] == 3
    assert data["backend"] == "gloo"
    assert data["size_bytes"] == 1 << 20
    assert data["bus_bandwidth_gbps"] > 0
    assert data["algbw_gbps"] == pytest.approx(data["bus_bandwidth_gbps"] * 3 / 4)
    assert data["latency_ms"] > 0
    assert data["never_joined"] == []
    assert data["ranks"] == {"local-0": [0], "local-1": [1, 2]}
    assert "x 3 ranks (gloo)" in result.summary and "GB/s bus bandwidth" in result.summary
    assert result.error is None and result.fix_command is None
    assert left == []


def test_host_that_never_joins_is_named_within_the_deadline(mark: str, tmp_path: Path) -> None:
    marker = f"{3000 + uuid.uuid4().int % 9000}.5"
    deadline = 8.0
    started = time.monotonic()
    result, left = arun(
        smoke(mark, python={"local-1": hang_python(tmp_path, marker)}, deadline=deadline)
    )
    elapsed = time.monotonic() - started
    assert result.status is Status.FAIL
    assert result.data["never_joined"] == ["local-1"]
    assert result.hosts["local-0"].status is Status.PASS
    assert result.hosts["local-1"].status is Status.FAIL
    assert result.hosts["local-1"].detail.startswith("never joined: ranks 1, 2 did not join")
    assert result.error is not None and "local-1" in result.error
    assert "local-0" not in result.error
    assert result.fix_command
    assert elapsed < deadline + SLACK  # the hard deadline is the behaviour under test
    assert left == []
    assert not [p for p in psutil.process_iter(["cmdline"]) if marker in (p.info["cmdline"] or [])]


def test_missing_interpreter_fails_fast_naming_the_host(mark: str) -> None:
    deadline = 240.0
    started = time.monotonic()
    result, left = arun(smoke(mark, python={"local-1": "/nonexistent/python3"}, deadline=deadline))
    # The bound is the behaviour: it did not wait for the deadline (generous: half of it).
    assert time.monotonic() - started < deadline / 2
    assert result.status is Status.FAIL
    assert result.data["never_joined"] == ["local-1"]
    detail = result.hosts["local-1"].detail
    assert detail.startswith("never joined:") and "no python interpreter found" in detail
    assert result.hosts["local-0"].status is not Status.FAIL
    assert left == []


def test_master_port_in_use_fails_clearly(mark: str) -> None:
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = int(taken.getsockname()[1])
        result, left = arun(smoke(mark, port=port, deadline=20.0))
    assert result.status is Status.FAIL
    assert result.hosts["local-0"].status is Status.FAIL
    assert f"master port {port} is already in use" in result.hosts["local-0"].detail
    assert result.hosts["local-1"].status is not Status.FAIL
    assert result.fix_command is not None and str(port) in result.fix_command
    assert left == []


def test_cancelled_smoke_test_leaves_nothing(mark: str, tmp_path: Path) -> None:
    hang = hang_python(tmp_path, f"{3000 + uuid.uuid4().int % 9000}.25")

    port = free_port()

    async def cancel_midway() -> list[str]:
        hs = hosts()
        transport = LocalTransport()
        try:
            task = asyncio.ensure_future(
                smoke_test(
                    transport,
                    hs,
                    master=hs[0],
                    master_addr="127.0.0.1",
                    port=port,
                    nproc={"local-0": 2, "local-1": 1},
                    python={"local-1": hang},
                    env={h.name: {MARK: mark} for h in hs},
                    deadline=60.0,
                )
            )
            end = time.monotonic() + 60
            # Rank 0 serves the store (the ranks are joining) and every process is up:
            # 2 runners ("hang" is one), 2 ranks.
            while not (
                await asyncio.to_thread(listening, port)
                and len(await asyncio.to_thread(marked, mark)) == 4
            ):
                assert not task.done(), task
                assert time.monotonic() < end, [p.cmdline() for p in marked(mark)]
                await asyncio.sleep(0.1)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            return await asyncio.to_thread(leftovers, mark)
        finally:
            await transport.close()

    assert arun(cancel_midway()) == []


def _runner(args: dict[str, Any], mark: str) -> subprocess.Popen[bytes]:
    env = dict(os.environ, **{MARK: mark})
    proc = subprocess.Popen(
        [sys.executable, "-m", "corral.checks.smoke"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=env,
        start_new_session=True,
    )
    assert proc.stdin is not None
    proc.stdin.write((json.dumps(args) + "\n").encode())
    proc.stdin.flush()
    return proc


def _events(proc: subprocess.Popen[bytes], until: str, count: int = 1) -> list[dict[str, Any]]:
    """The runner's events up to the ``count``-th ``until`` event."""
    assert proc.stdout is not None
    seen = []
    for line in proc.stdout:
        seen.append(json.loads(line))
        if sum(e["event"] == until for e in seen) == count:
            break
    return seen


def test_runner_kills_its_workers_when_stdin_closes(mark: str) -> None:
    """The coordinator went away: the host-side runner must not leave ranks behind."""
    args = {
        "master_addr": "127.0.0.1",
        "port": free_port(),
        "host": "h",
        "ranks": [0, 1],
        "world_size": 3,  # rank 2 never comes: the ranks wait until the deadline
        "backend": "gloo",
        "size_bytes": 4096,
        "iterations": 1,
        "deadline": 120,
        "rank_hosts": ["h", "h", "other"],
    }
    proc = _runner(args, mark)
    try:
        events = _events(proc, "joined", count=2)  # both local ranks are waiting
        assert events[0]["event"] == "runner" and events[0]["ranks"] == [0, 1]
        assert proc.stdin is not None
        proc.stdin.close()
        # The runner exits with its worst worker's code: both ranks were SIGTERMed.
        sigterm = 128 + signal.SIGTERM
        assert proc.wait(timeout=30) == sigterm
        assert proc.stdout is not None
        rest = [json.loads(line) for line in proc.stdout]
        assert rest == [
            {"event": "killed", "reason": "stdin closed"},
            {"event": "worker_exit", "rank": 0, "code": sigterm},
            {"event": "worker_exit", "rank": 1, "code": sigterm},
        ]
    finally:
        proc.kill()
        proc.wait()
    assert leftovers(mark) == []


def test_runner_reports_missing_ranks_at_the_deadline(mark: str) -> None:
    args = {
        "master_addr": "127.0.0.1",
        "port": free_port(),
        "host": "h",
        "ranks": [0],
        "world_size": 3,
        "backend": "gloo",
        "size_bytes": 4096,
        "iterations": 1,
        "deadline": 4,
        "rank_hosts": ["h", "b", "c"],
    }
    proc = _runner(args, mark)
    try:
        events = _events(proc, "never_joined")
        assert events[-1]["ranks"] == [1, 2]
        assert events[-1]["hosts"] == ["b", "c"]
        assert proc.wait(timeout=30) == EXIT_FAILED  # rank 0's own verdict, not the runner's
    finally:
        proc.kill()
        proc.wait()
    assert leftovers(mark) == []
