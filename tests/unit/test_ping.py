"""fleet.ping and ``corral ping`` without SSH: the scripted fake transport and local:N."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence

import pytest
import typer
from typer.testing import CliRunner

from corral.cli.ping import register
from corral.cluster import Host
from corral.errors import CommandTimeout, ConnectError, TransportError
from corral.fleet.ping import KILL_GRACE, PingResult, failed_hosts, ping_hosts
from corral.transport.fake import FakeNode, FakeTransport
from corral.transport.local import LocalTransport

A, B, C, D = (Host(name=n) for n in "abcd")


async def echoes(node: FakeNode) -> int:
    """Answers like ``echo``: its last argument on stdout."""
    assert node.argv[0] == "echo"
    node.stdout.feed_data(node.argv[-1].encode() + b"\n")
    return 0


async def hangs(node: FakeNode) -> int:
    await asyncio.Event().wait()
    return 0


async def wrong_output(node: FakeNode) -> int:
    node.stdout.feed_data(b"Welcome to the machine\n")
    return 0


async def fails(node: FakeNode) -> int:
    node.stderr.feed_data(b"sh: echo: not found\n")
    return 127


async def until(condition: Callable[[], bool], within: float = 30.0) -> None:
    """Poll ``condition`` on the event loop until it holds; fail after ``within`` s."""
    deadline = asyncio.get_running_loop().time() + within
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


def ping(
    transport: FakeTransport, hosts: Sequence[Host], timeout: float = 5.0
) -> dict[str, PingResult]:
    async def main() -> dict[str, PingResult]:
        try:
            return await ping_hosts(transport, hosts, timeout=timeout)
        finally:
            await transport.close()

    return asyncio.run(main())


def test_ok_host_answers_with_its_nonce() -> None:
    transport = FakeTransport({"a": echoes})
    results = ping(transport, [A])
    assert list(results) == ["a"]
    r = results["a"]
    assert r.ok and r.error is None and r.cause is None
    assert r.rtt_ms is not None and r.rtt_ms >= 0
    assert transport.nodes["a"].argv[1].startswith("corral-ping-")
    assert transport.nodes["a"].stdin_closed
    assert r.to_dict() == {
        "ok": True,
        "rtt_ms": r.to_dict()["rtt_ms"],
        "error": None,
        "cause": None,
    }


def test_every_ping_gets_its_own_nonce() -> None:
    transport = FakeTransport({"a": echoes, "b": echoes})
    ping(transport, [A, B])
    assert transport.nodes["a"].argv[1] != transport.nodes["b"].argv[1]


def test_connect_error_is_a_failed_host_not_an_exception() -> None:
    transport = FakeTransport({"a": echoes, "b": echoes}, unreachable=["b"])
    results = ping(transport, [A, B])
    assert results["a"].ok
    b = results["b"]
    assert not b.ok and b.rtt_ms is None
    assert isinstance(b.error, ConnectError)
    assert b.error.host == "b" and b.cause == "unreachable"
    assert failed_hosts(results) == ["b"]


def test_host_that_never_answers_hits_the_deadline_and_is_killed() -> None:
    transport = FakeTransport({"a": echoes, "b": hangs})
    started = time.monotonic()
    results = ping(transport, [A, B], timeout=0.3)
    # The bound is the behaviour (a dead host costs the deadline, not forever); generous.
    assert time.monotonic() - started < 0.3 + KILL_GRACE + 30
    b = results["b"]
    assert not b.ok and b.rtt_ms is None
    assert isinstance(b.error, CommandTimeout)
    assert b.cause == "timed out after 0.3s"
    assert signal.SIGKILL in transport.nodes["b"].signals
    assert results["a"].ok


def test_wrong_output_is_named() -> None:
    transport = FakeTransport({"a": wrong_output})
    r = ping(transport, [A])["a"]
    assert not r.ok
    assert r.cause == "unexpected output"
    assert r.error is not None and "Welcome to the machine" in str(r.error)
    assert r.rtt_ms is not None  # it did reply, wrongly


def test_failed_command_names_exit_status_and_stderr() -> None:
    r = ping(FakeTransport({"a": fails}), [A])["a"]
    assert not r.ok
    assert r.cause == "exit 127"
    assert r.error is not None and "echo: not found" in str(r.error)


class StalledConnect:
    """A transport whose connection never completes (SYNs into a cut link)."""

    def __init__(self) -> None:
        self.cancelled: list[str] = []

    async def start(
        self,
        host: Host,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> FakeNode:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled.append(host.name)
            raise
        raise AssertionError("unreachable")

    async def close(self) -> None:
        pass


def test_deadline_while_connecting_cancels_the_attempt() -> None:
    transport = StalledConnect()

    async def main() -> tuple[dict[str, PingResult], set[asyncio.Task[object]]]:
        results = await ping_hosts(transport, [A, B], timeout=0.2)
        # No yield to the loop first: the cancelled attempts are over when ping_hosts returns.
        return results, {t for t in asyncio.all_tasks() if t is not asyncio.current_task()}

    results, left = asyncio.run(main())
    assert left == set()
    assert sorted(transport.cancelled) == ["a", "b"]
    for r in results.values():
        assert isinstance(r.error, ConnectError)
        assert r.cause == "timed out after 0.2s"
        assert "connecting" in str(r.error)


def test_transport_timeout_cause_says_how_long() -> None:
    class TimesOut(StalledConnect):
        async def start(self, host: Host, argv: Sequence[str], **_: object) -> FakeNode:
            await asyncio.sleep(0.05)
            raise ConnectError("no SSH connection within 2 s", host=host.name, cause="timeout")

    r = asyncio.run(ping_hosts(TimesOut(), [A], timeout=5))["a"]
    assert isinstance(r.error, ConnectError)
    assert r.cause is not None and r.cause.startswith("timed out after ")
    assert isinstance(r.error.__cause__, ConnectError)


def test_untranslated_transport_error_is_still_a_failed_host() -> None:
    class Buggy(StalledConnect):
        async def start(self, host: Host, argv: Sequence[str], **_: object) -> FakeNode:
            raise OSError(24, "Too many open files")

    r = asyncio.run(ping_hosts(Buggy(), [A], timeout=5))["a"]
    assert not r.ok and r.cause == "error"
    assert r.error is not None and "Too many open files" in str(r.error)


def test_cancelling_the_ping_kills_started_commands() -> None:
    transport = FakeTransport({"a": hangs, "b": hangs})

    async def main() -> None:
        task = asyncio.ensure_future(ping_hosts(transport, [A, B], timeout=60))
        await until(lambda: len(transport.nodes) == 2)  # both commands started
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await transport.close()

    asyncio.run(main())
    assert sorted(transport.nodes) == ["a", "b"]
    for node in transport.nodes.values():
        assert signal.SIGKILL in node.signals


def test_a_process_that_ignores_sigkill_costs_at_most_the_grace() -> None:
    class Undying(FakeNode):
        def signal(self, signum: int) -> None:
            self.signals.append(signum)  # never finishes

    class Transport(FakeTransport):
        async def start(self, host: Host, argv: Sequence[str], **_: object) -> FakeNode:
            node = Undying(host, argv)
            self.nodes[host.name] = node
            return node

    transport = Transport({})
    started = time.monotonic()
    r = ping(transport, [A], timeout=0.2)["a"]
    # The bound is the behaviour (it does not wait for the undying process); generous.
    assert time.monotonic() - started < 0.2 + KILL_GRACE + 30
    assert r.cause == "timed out after 0.2s"
    assert transport.nodes["a"].signals == [signal.SIGKILL]


def test_results_keep_host_order_and_failed_hosts() -> None:
    transport = FakeTransport({"a": fails, "b": echoes, "c": hangs, "d": echoes}, unreachable=["d"])
    results = ping(transport, [A, B, C, D], timeout=0.2)
    assert list(results) == ["a", "b", "c", "d"]
    assert failed_hosts(results) == ["a", "c", "d"]
    assert all(isinstance(r.error, TransportError) for r in results.values() if not r.ok)


def test_empty_and_bad_timeout() -> None:
    assert asyncio.run(ping_hosts(FakeTransport({}), [])) == {}
    with pytest.raises(ValueError, match="timeout must be positive, not 0"):
        asyncio.run(ping_hosts(FakeTransport({}), [A], timeout=0))


def test_local_transport_runs_echo_for_real() -> None:
    hosts = [Host(name=f"local-{i}", local=True) for i in range(3)]

    async def main() -> dict[str, PingResult]:
        transport = LocalTransport()
        try:
            return await ping_hosts(transport, hosts)
        finally:
            await transport.close()

    results = asyncio.run(main())
    assert failed_hosts(results) == []
    assert all(r.rtt_ms is not None for r in results.values())


# --------------------------------------------------------------------------- CLI


@pytest.fixture
def cli() -> typer.Typer:
    app = typer.Typer()

    @app.callback()
    def _root() -> None:
        pass

    register(app)
    return app


def test_cli_local_all_answer(cli: typer.Typer) -> None:
    result = CliRunner().invoke(cli, ["ping", "--hosts", "local:3"])
    assert result.exit_code == 0, result.output
    assert result.stdout == ""
    assert "3/3 hosts answered" in result.stderr
    rows = [line.split() for line in result.stderr.splitlines() if line.startswith("local-")]
    assert [row[:2] for row in rows] == [[f"local-{i}", "ok"] for i in range(3)]


def test_cli_local_json(cli: typer.Typer) -> None:
    result = CliRunner().invoke(cli, ["ping", "--hosts", "local:2", "--json"])
    assert result.exit_code == 0
    doc = json.loads(result.stdout)
    assert doc["failed"] == [] and doc["ok"] == ["local-0", "local-1"]
    assert set(doc["hosts"]) == {"local-0", "local-1"}
    for entry in doc["hosts"].values():
        assert entry["ok"] is True and entry["error"] is None and entry["rtt_ms"] >= 0


@pytest.mark.parametrize(
    "args",
    [
        ["--hosts", "local:1", "--timeout", "0"],
        ["--hosts", "local:1", "--timeout", "-1"],
        ["--hosts", "local:0"],
        ["--hosts", "/nonexistent/hostfile"],
        [],
    ],
)
def test_cli_bad_input_exits_2(args: list[str]) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    argv = [sys.executable, "-m", "corral", "ping", *args]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env, check=False)
    assert result.returncode == 2, result.stderr
    assert "error:" in result.stderr
    assert result.stdout == ""
