"""fleet.fanout and ``corral exec`` without SSH: a scripted transport and local:N."""

from __future__ import annotations

import asyncio
import io
import json
import os
import signal
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from corral.cli.exec import LinePrinter, register
from corral.cluster import Host
from corral.errors import ConnectError, ConnectionLost
from corral.fleet.fanout import (
    HostResult,
    Stream,
    check_connectivity,
    run_on_hosts,
    unreachable_summary,
)

HOSTS = [Host(name="a"), Host(name="b"), Host(name="c", env={"FROM_HOSTFILE": "1"})]

Script = Callable[["ScriptedProcess"], Awaitable[int]]


class ScriptedProcess:
    """A NodeProcess whose output and exit are played by a script."""

    def __init__(self, host: Host, script: Script) -> None:
        self.host = host
        self.stdout = asyncio.StreamReader()
        self.stderr = asyncio.StreamReader()
        self.signals: list[int] = []
        self.stdin_closed = False
        self.lost: ConnectionLost | None = None
        self._exit: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._task = asyncio.ensure_future(self._play(script))

    async def _play(self, script: Script) -> None:
        code = await script(self)
        self.finish(code)

    def finish(self, code: int) -> None:
        if not self._exit.done():
            self.stdout.feed_eof()
            self.stderr.feed_eof()
            self._exit.set_result(code)

    def write(self, data: bytes) -> None:
        pass

    def close_stdin(self) -> None:
        self.stdin_closed = True

    @property
    def cut_short(self) -> bool:
        """Whether the script was cancelled (by SIGKILL) before it returned."""
        return self._task.cancelled()

    def signal(self, signum: int) -> None:
        self.signals.append(signum)
        if signum == signal.SIGKILL:
            self._task.cancel()
            self.finish(-9)

    async def wait(self) -> int:
        return await asyncio.shield(self._exit)


class ScriptedTransport:
    """start() plays the host's script; connect() fails for hosts in ``unreachable``."""

    def __init__(
        self, scripts: Mapping[str, Script], unreachable: Mapping[str, str] | None = None
    ) -> None:
        self.scripts = scripts
        self.unreachable = dict(unreachable or {})
        self.started: list[tuple[str, list[str], dict[str, str] | None]] = []
        self.procs: dict[str, ScriptedProcess] = {}

    async def connect(self, host: Host) -> None:
        if host.name in self.unreachable:
            raise ConnectError("nope", host=host.name, cause=self.unreachable[host.name])

    async def start(
        self,
        host: Host,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> ScriptedProcess:
        self.started.append((host.name, list(argv), dict(env) if env is not None else None))
        proc = ScriptedProcess(host, self.scripts[host.name])
        self.procs[host.name] = proc
        return proc

    async def close(self) -> None:
        pass


def says(*chunks: bytes, code: int = 0, stream: str = "stdout") -> Script:
    async def script(proc: ScriptedProcess) -> int:
        for chunk in chunks:
            getattr(proc, stream).feed_data(chunk)
            await asyncio.sleep(0.001)
        return code

    return script


def collect() -> tuple[list[tuple[str, Stream, bytes]], Callable[[Host, Stream, bytes], None]]:
    seen: list[tuple[str, Stream, bytes]] = []

    def on_output(host: Host, stream: Stream, data: bytes) -> None:
        seen.append((host.name, stream, data))

    return seen, on_output


def test_results_in_host_order_with_codes() -> None:
    transport = ScriptedTransport({"a": says(code=0), "b": says(code=3), "c": says(code=0)})
    results = asyncio.run(run_on_hosts(transport, HOSTS, "true"))
    assert [r.host for r in results] == ["a", "b", "c"]
    assert [r.exit_code for r in results] == [0, 3, 0]
    assert [r.ok for r in results] == [True, False, True]
    assert results[1].status == "exit 3"
    assert all(p.stdin_closed for p in transport.procs.values())


def test_shell_command_without_start_shell_uses_sh_c(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHELL", "/bin/bash")
    transport = ScriptedTransport({h.name: says() for h in HOSTS})
    asyncio.run(run_on_hosts(transport, HOSTS, "echo $HOSTNAME", env={"X": "1"}))
    _, argv, env = transport.started[0]
    assert argv == ["/bin/bash", "-c", "echo $HOSTNAME"]
    assert env == {"X": "1"}
    assert transport.started[2][2] == {"FROM_HOSTFILE": "1", "X": "1"}


def test_argv_command_is_passed_as_is() -> None:
    transport = ScriptedTransport({h.name: says() for h in HOSTS})
    asyncio.run(run_on_hosts(transport, HOSTS[:1], ["echo", "a b"]))
    assert transport.started[0][1] == ["echo", "a b"]
    assert transport.started[0][2] is None


def test_lines_are_never_split() -> None:
    transport = ScriptedTransport(
        {"a": says(b"par", b"tial\nwhole\nnext", b" line\n", b"no newline at end")}
    )
    seen, on_output = collect()
    asyncio.run(run_on_hosts(transport, HOSTS[:1], "x", on_output=on_output))
    assert all(data.endswith(b"\n") for _, _, data in seen)
    assert b"".join(data for _, _, data in seen) == (
        b"partial\nwhole\nnext line\nno newline at end\n"
    )
    assert seen[0][2] == b"partial\nwhole\n"


def test_stderr_is_kept_apart() -> None:
    transport = ScriptedTransport({"a": says(b"oops\n", stream="stderr", code=1)})
    seen, on_output = collect()
    results = asyncio.run(
        run_on_hosts(transport, HOSTS[:1], "x", on_output=on_output, capture_limit=100)
    )
    assert seen == [("a", "stderr", b"oops\n")]
    assert results[0].stderr == b"oops\n"
    assert results[0].stdout == b""


def test_capture_is_bounded() -> None:
    transport = ScriptedTransport({"a": says(b"x" * 50, b"y" * 50)})
    results = asyncio.run(run_on_hosts(transport, HOSTS[:1], "x", capture_limit=60))
    assert results[0].stdout == b"x" * 50 + b"y" * 10


def test_timeout_kills_and_fails_only_that_host() -> None:
    async def slow(proc: ScriptedProcess) -> int:
        proc.stdout.feed_data(b"started\n")
        await asyncio.sleep(30)
        return 0

    transport = ScriptedTransport({"a": says(code=0), "b": slow})
    seen, on_output = collect()
    results = asyncio.run(run_on_hosts(transport, HOSTS[:2], "x", timeout=0.2, on_output=on_output))
    assert results[0].ok
    slow_result = results[1]
    assert not slow_result.ok
    assert slow_result.status == "timeout"
    assert slow_result.error is not None and slow_result.error.host == "b"
    assert slow_result.exit_code is None
    assert "did not finish within 0.2 s" in str(slow_result.error)
    assert transport.procs["b"].signals == [signal.SIGKILL]
    assert transport.procs["b"].cut_short  # the kill ended it, not its 30 s sleep
    assert ("b", "stdout", b"started\n") in seen
    # the duration runs to the timeout: at least 0.2 s (monotonic clock) and, the bound
    # being the behaviour, well short of the 30 s the script would have slept
    assert 0.2 <= slow_result.duration < 25


def test_cancelling_kills_every_started_process() -> None:
    async def forever(proc: ScriptedProcess) -> int:
        await asyncio.sleep(60)
        return 0

    transport = ScriptedTransport({"a": forever, "b": forever})

    async def main() -> None:
        task = asyncio.ensure_future(run_on_hosts(transport, HOSTS[:2], "x"))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 30
        while sorted(transport.procs) != ["a", "b"]:
            assert not task.done(), f"run_on_hosts ended early: {task}"
            assert loop.time() < deadline, f"only {sorted(transport.procs)} started in 30 s"
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert [p.signals for p in transport.procs.values()] == [[signal.SIGKILL]] * 2


def test_lost_connection_is_a_failed_result() -> None:
    async def lost(proc: ScriptedProcess) -> int:
        proc.lost = ConnectionLost("gone", host="a", cause="no keepalive reply")
        return 255

    results = asyncio.run(run_on_hosts(ScriptedTransport({"a": lost}), HOSTS[:1], "x"))
    assert results[0].status == "no keepalive reply"
    assert isinstance(results[0].error, ConnectionLost)
    assert results[0].exit_code is None


def test_start_failure_is_a_failed_result() -> None:
    class Failing(ScriptedTransport):
        async def start(self, host: Host, argv: Sequence[str], **kwargs: object) -> ScriptedProcess:
            raise ConnectError("refused", host=host.name, cause="connection refused")

    results = asyncio.run(run_on_hosts(Failing({}), HOSTS[:2], "x"))
    assert [r.status for r in results] == ["connection refused", "connection refused"]


def test_invalid_timeout() -> None:
    with pytest.raises(ValueError):
        asyncio.run(run_on_hosts(ScriptedTransport({}), HOSTS, "x", timeout=0))


def test_check_connectivity_lists_failures() -> None:
    transport = ScriptedTransport({}, unreachable={"b": "connection refused", "c": "timeout"})
    errors = asyncio.run(check_connectivity(transport, HOSTS))
    assert sorted(errors) == ["b", "c"]
    assert unreachable_summary(errors) == "2 hosts unreachable: b (connection refused), c (timeout)"


def test_check_connectivity_without_connect_is_empty() -> None:
    class NoConnect:
        async def start(self, *a: object, **k: object) -> None:
            raise AssertionError

        async def close(self) -> None:
            pass

    assert asyncio.run(check_connectivity(NoConnect(), HOSTS)) == {}  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("result", "status"),
    [
        (HostResult("h", 0, 1.0), "ok"),
        (HostResult("h", 2, 1.0), "exit 2"),
        (HostResult("h", -15, 1.0), "signal SIGTERM"),
        (HostResult("h", None, 1.0), "unknown"),
    ],
)
def test_status_text(result: HostResult, status: str) -> None:
    assert result.status == status
    assert result.to_dict()["status"] == status


def test_line_printer_prefixes_every_line() -> None:
    out, err = io.BytesIO(), io.BytesIO()
    printer = LinePrinter(HOSTS, stdout=out, stderr=err, color=False)
    printer(HOSTS[0], "stdout", b"one\ntwo\n")
    printer(HOSTS[1], "stderr", b"bad\n")
    assert out.getvalue() == b"[a] one\n[a] two\n"
    assert err.getvalue() == b"[b] bad\n"


# -- corral exec on local:N ---------------------------------------------------------------


@pytest.fixture
def cli() -> typer.Typer:
    app = typer.Typer()

    @app.callback()
    def _root() -> None:
        pass

    register(app)
    return app


def invoke(app: typer.Typer, *args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, list(args))
    if result.exception and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.stdout, result.stderr


def test_exec_local_prefixes_and_summary(
    cli: typer.Typer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    code, out, err = invoke(cli, "exec", "--hosts", "local:3", "--", "pwd;", "echo", "oops", ">&2")
    assert code == 0
    assert sorted(out.splitlines()) == [f"[local-{i}] {tmp_path}" for i in range(3)]
    assert "[local-1] oops" in err
    assert "3/3 hosts succeeded" in err


def test_exec_local_failure_exit_code(cli: typer.Typer) -> None:
    code, _, err = invoke(cli, "exec", "--hosts", "local:2", "--", "exit 3")
    assert code == 1
    assert "0/2 hosts succeeded" in err
    assert "exit 3" in err


def test_exec_local_timeout(cli: typer.Typer) -> None:
    code, _, err = invoke(cli, "exec", "--hosts", "local:1", "--timeout", "0.3", "--", "sleep 20")
    assert code == 1
    assert "timeout" in err


def test_exec_json(cli: typer.Typer) -> None:
    code, out, _ = invoke(cli, "exec", "--hosts", "local:2", "--json", "--", "echo", "hi")
    assert code == 0
    doc = json.loads(out)
    assert doc["succeeded"] == 2
    assert [h["stdout"] for h in doc["hosts"]] == ["hi\n", "hi\n"]


def test_exec_needs_a_command(cli: typer.Typer) -> None:
    result = CliRunner().invoke(cli, ["exec", "--hosts", "local:1"])
    assert result.exit_code == 2, result.output  # a usage error
    assert "Missing argument 'COMMAND...'" in result.output


def test_exec_env_is_not_forwarded(cli: typer.Typer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CORRAL_SECRET_TEST", "leak")
    code, out, _ = invoke(cli, "exec", "--hosts", "local:1", "--", "echo", "[$CORRAL_SECRET_TEST]")
    assert code == 0
    assert out.strip() == "[local-0] []"
    assert os.environ["CORRAL_SECRET_TEST"] == "leak"
