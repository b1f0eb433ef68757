"""SshProcess fed by a scripted channel: streams, the PID line, exit status, signals, loss."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import asyncssh
import pytest

from corral.cluster import Host
from corral.errors import ConnectionLost
from corral.fleet.fanout import run_on_hosts
from corral.transport.ssh import EXIT_LOST, SshProcess, SshTransport
from corral.transport.ssh.process import ProcessSession

HOST = Host(name="node1")


class FakeChannel:
    """Records what the process sends down the channel."""

    def __init__(self) -> None:
        self.written: list[bytes] = []
        self.eof = False
        self.signals: list[int | str] = []
        self.closed = False
        self.session: ProcessSession | None = None

    def write(self, data: bytes) -> None:
        self.written.append(data)

    def write_eof(self) -> None:
        self.eof = True

    def send_signal(self, signum: int | str) -> None:
        self.signals.append(signum)

    def close(self) -> None:
        self.closed = True
        if self.session is not None:
            self.session.connection_lost(None)


def run(test: Callable[[SshProcess, ProcessSession, FakeChannel], Awaitable[None]]) -> None:
    async def main() -> None:
        proc = SshProcess(SshTransport(), HOST, "cmd")
        session = ProcessSession(proc)
        chan = FakeChannel()
        chan.session = session
        session.connection_made(chan)
        await test(proc, session, chan)

    asyncio.run(main())


# That SshTransport is a Transport is checked statically (transport.choose returns it as
# one, for mypy) and by behaviour on the netns testbed (test_ssh_transport.py, and
# test_ping.py's ping_hosts, written against Transport, over a real SshTransport).


def test_code_written_for_node_processes_drives_an_ssh_process() -> None:
    """fleet.fanout (written against NodeProcess) reads, waits for and kills SshProcesses."""
    chans: dict[str, FakeChannel] = {}

    class FakeSshTransport:
        async def start(
            self,
            host: Host,
            argv: Sequence[str],
            *,
            env: Mapping[str, str] | None = None,
            cwd: str | None = None,
        ) -> SshProcess:
            proc = SshProcess(SshTransport(), host, " ".join(argv))
            session = ProcessSession(proc)
            chan = chans[host.name] = FakeChannel()
            chan.session = session
            session.connection_made(chan)
            if host.name == "done":
                session.data_received(b"__corral_pid__=9\nwarn\n", asyncssh.EXTENDED_DATA_STDERR)
                session.data_received(b"hello\n", None)
                session.exit_status_received(5)
                session.eof_received()
                session.connection_lost(None)
            return proc  # "hung" never ends on its own

        async def close(self) -> None:
            pass

    hosts = [Host(name="done"), Host(name="hung")]
    fanout = run_on_hosts(FakeSshTransport(), hosts, ["cmd"], timeout=0.5, capture_limit=100)
    results = asyncio.run(fanout)
    done, hung = results
    assert (done.host, done.exit_code, done.status) == ("done", 5, "exit 5")
    assert (done.stdout, done.stderr) == (b"hello\n", b"warn\n")
    assert (hung.host, hung.status, hung.exit_code) == ("hung", "timeout", None)
    assert chans["hung"].eof  # its stdin was closed at the start
    assert chans["hung"].signals == [signal.SIGKILL]
    assert chans["hung"].closed


def test_stdout_and_stderr_are_separate_and_pid_line_is_stripped() -> None:
    async def body(proc: SshProcess, session: ProcessSession, chan: FakeChannel) -> None:
        session.data_received(b"out1\n", None)
        session.data_received(b"__corral_pid", asyncssh.EXTENDED_DATA_STDERR)
        session.data_received(b"__=4242\nerr1\n", asyncssh.EXTENDED_DATA_STDERR)
        session.data_received(b"out2\n", None)
        session.data_received(b"err2\n", asyncssh.EXTENDED_DATA_STDERR)
        session.exit_status_received(0)
        session.eof_received()
        session.connection_lost(None)
        assert await proc.stdout.read() == b"out1\nout2\n"
        assert await proc.stderr.read() == b"err1\nerr2\n"
        assert proc.pid == 4242
        assert await proc.wait() == 0

    run(body)


def test_login_noise_before_the_pid_line_is_kept() -> None:
    async def body(proc: SshProcess, session: ProcessSession, chan: FakeChannel) -> None:
        session.data_received(b"bashrc says hi\n__corral_pid__=7\nx", asyncssh.EXTENDED_DATA_STDERR)
        session.eof_received()
        session.connection_lost(None)
        assert await proc.stderr.read() == b"bashrc says hi\nx"
        assert proc.pid == 7

    run(body)


def test_stderr_without_pid_line_is_passed_on_at_eof() -> None:
    async def body(proc: SshProcess, session: ProcessSession, chan: FakeChannel) -> None:
        session.data_received(b"partial", asyncssh.EXTENDED_DATA_STDERR)
        session.eof_received()
        assert await proc.stderr.read() == b"partial"
        assert proc.pid is None

    run(body)


@pytest.mark.parametrize(("name", "code"), [("TERM", -15), ("KILL", -9), ("SEGV", -11)])
def test_exit_signal_is_minus_signum(name: str, code: int) -> None:
    async def body(proc: SshProcess, session: ProcessSession, chan: FakeChannel) -> None:
        session.exit_signal_received(name, False, "", "")
        session.connection_lost(None)
        assert await proc.wait() == code

    run(body)


def test_exit_status_wins_over_a_later_connection_loss() -> None:
    async def body(proc: SshProcess, session: ProcessSession, chan: FakeChannel) -> None:
        session.exit_status_received(3)
        session.connection_lost(asyncssh.ConnectionLost("gone"))
        assert await proc.wait() == 3
        assert proc.lost is None

    run(body)


def test_lost_connection_ends_streams_and_wait() -> None:
    async def body(proc: SshProcess, session: ProcessSession, chan: FakeChannel) -> None:
        session.data_received(b"half a line", None)
        blocked = {"wait": asyncio.Event(), "read": asyncio.Event()}

        async def waiting() -> int:
            blocked["wait"].set()  # runs on into proc.wait() before this task yields
            return await proc.wait()

        async def reading() -> bytes:
            blocked["read"].set()
            return await proc.stdout.read()

        waiter = asyncio.ensure_future(waiting())
        reader = asyncio.ensure_future(reading())
        await asyncio.wait_for(blocked["wait"].wait(), 30)
        await asyncio.wait_for(blocked["read"].wait(), 30)
        # both are now suspended inside wait() and read(): neither ends while the link is up
        assert not waiter.done()
        assert not reader.done()
        assert proc.returncode is None and proc.lost is None
        session.connection_lost(asyncssh.ConnectionLost("Server not responding to keepalive"))
        assert await reader == b"half a line"
        assert await proc.stderr.read() == b""
        assert await waiter == EXIT_LOST
        lost = proc.lost
        assert isinstance(lost, ConnectionLost)
        assert lost.host == "node1"
        assert lost.cause == "no keepalive reply"
        with pytest.raises(ConnectionLost, match="node1"):
            await proc.wait(check=True)

    run(body)


def test_stdin_write_and_eof() -> None:
    async def body(proc: SshProcess, session: ProcessSession, chan: FakeChannel) -> None:
        proc.write(b"hello\n")
        proc.close_stdin()
        assert chan.written == [b"hello\n"]
        assert chan.eof
        session.connection_lost(None)
        proc.write(b"ignored after close")
        assert chan.written == [b"hello\n"]

    run(body)


def test_signal_without_pid_goes_in_band_and_sigkill_closes() -> None:
    async def body(proc: SshProcess, session: ProcessSession, chan: FakeChannel) -> None:
        proc.signal(signal.SIGTERM)
        assert chan.signals == [signal.SIGTERM]
        assert not chan.closed
        proc.signal(signal.SIGKILL)
        assert chan.closed
        assert await proc.wait() == -9

    run(body)


def test_signal_after_exit_is_a_no_op() -> None:
    async def body(proc: SshProcess, session: ProcessSession, chan: FakeChannel) -> None:
        session.exit_status_received(0)
        session.connection_lost(None)
        proc.signal(signal.SIGTERM)
        assert chan.signals == []

    run(body)


def test_signal_with_pid_also_signals_the_group(monkeypatch: pytest.MonkeyPatch) -> None:
    commands: list[str] = []
    ran = asyncio.Event()  # asyncio.run below makes a loop; an Event binds to it on first wait

    async def fake_run(self: SshTransport, host: Host, command: str, **kwargs: Any) -> None:
        commands.append(command)
        ran.set()

    monkeypatch.setattr(SshTransport, "run", fake_run)

    async def body(proc: SshProcess, session: ProcessSession, chan: FakeChannel) -> None:
        session.data_received(b"__corral_pid__=321\n", asyncssh.EXTENDED_DATA_STDERR)
        proc.signal(signal.SIGTERM)
        await asyncio.wait_for(ran.wait(), 30)  # the group kill ran on a second channel
        assert chan.signals == []  # the group kill covers the leader: no double TERM
        assert commands == ["kill -15 -- -321 2>/dev/null || kill -15 321"]
        commands.clear()
        code = await proc.kill()
        assert code == -9
        assert chan.signals == [signal.SIGKILL]
        assert commands == ["kill -9 -- -321 2>/dev/null || kill -9 321"]
        assert chan.closed

    run(body)
