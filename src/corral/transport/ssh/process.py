"""SshProcess: a command running on a remote host over one SSH session channel.

The channel's data is fed into two :class:`asyncio.StreamReader` (stdout and
stderr stay separate: no PTY). The first stderr line carries the remote PID
(see :data:`~corral.transport.ssh.command.PID_PREAMBLE`); it is stripped from
the stream and used by :meth:`SshProcess.signal` to signal the whole process
group. A link that breaks first makes :meth:`SshProcess.wait` return
:data:`EXIT_LOST` with :attr:`SshProcess.lost` naming the host and the cause.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import signal as signal_module
from collections.abc import Coroutine
from typing import Any, Protocol

import asyncssh

from corral.cluster.model import Host
from corral.errors import ConnectionLost, TransportError
from corral.transport.ssh.errors import lost_cause

__all__ = [
    "EXIT_LOST",
    "KILL_GRACE",
    "STREAM_LIMIT",
    "ProcessOwner",
    "ProcessSession",
    "SshProcess",
]

STREAM_LIMIT = 1 << 20
_PID_LINE_RE = re.compile(rb"__corral_pid__=(\d+)")
_PID_SCAN_LIMIT = 64 * 1024
#: Seconds a kill waits for the remote process group to go.
KILL_GRACE = 5.0
#: What :meth:`SshProcess.wait` returns when the connection broke first (like ``ssh``).
EXIT_LOST = 255


class ProcessOwner(Protocol):
    """What an :class:`SshProcess` needs from its transport (a second channel, tasks)."""

    async def run(self, host: Host, command: str, *, timeout: float | None = None) -> object:
        """Run a shell command line on ``host`` to completion."""
        ...

    def _background(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]: ...


def _signal_number(name: str) -> int:
    try:
        return int(signal_module.Signals[f"SIG{name.upper()}"])
    except KeyError:
        return 99


class ProcessSession(asyncssh.SSHClientSession[bytes]):
    """Feeds a channel's data into the stream readers of an :class:`SshProcess`."""

    def __init__(self, proc: SshProcess) -> None:
        self._proc = proc

    def connection_made(self, chan: Any) -> None:
        self._proc._chan = chan

    def data_received(self, data: bytes, datatype: int | None) -> None:
        if datatype == asyncssh.EXTENDED_DATA_STDERR:
            self._proc._stderr_data(data)
        else:
            self._proc.stdout.feed_data(data)

    def eof_received(self) -> bool:
        self._proc._feed_eof()
        return False

    def exit_status_received(self, status: int) -> None:
        self._proc.exit_status = status

    def exit_signal_received(self, signal: str, core_dumped: bool, msg: str, lang: str) -> None:
        self._proc.exit_signal = signal

    def connection_lost(self, exc: Exception | None) -> None:
        self._proc._closed(exc)


class SshProcess:
    """A command running on a remote host over one SSH channel (a :class:`NodeProcess`)."""

    def __init__(self, transport: ProcessOwner, host: Host, command: str) -> None:
        self.host = host
        self.command = command
        self.stdout = asyncio.StreamReader(limit=STREAM_LIMIT)
        self.stderr = asyncio.StreamReader(limit=STREAM_LIMIT)
        #: PID (= process group and session) on the host, once reported.
        self.pid: int | None = None
        self.exit_status: int | None = None
        self.exit_signal: str | None = None
        self._transport = transport
        self._chan: Any = None
        self._pid_pending = True
        self._pid_buf = b""
        self._eof = False
        self._killed = False
        self._signalling: asyncio.Task[None] | None = None
        self._lost: BaseException | None = None
        self._done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    # -- fed by the session ---------------------------------------------------------

    def _stderr_data(self, data: bytes) -> None:
        if not self._pid_pending:
            self.stderr.feed_data(data)
            return
        buf = self._pid_buf + data
        while True:
            end = buf.find(b"\n")
            if end < 0:
                if len(buf) > _PID_SCAN_LIMIT:
                    self._pid_pending = False
                    self.stderr.feed_data(buf)
                    buf = b""
                self._pid_buf = buf
                return
            line, buf = buf[:end], buf[end + 1 :]
            match = _PID_LINE_RE.fullmatch(line.rstrip(b"\r"))
            if match is not None:
                self.pid = int(match.group(1))
                self._pid_pending = False
                self._pid_buf = b""
                if buf:
                    self.stderr.feed_data(buf)
                return
            self.stderr.feed_data(line + b"\n")

    def _feed_eof(self) -> None:
        if self._eof:
            return
        self._eof = True
        if self._pid_buf:
            self.stderr.feed_data(self._pid_buf)
            self._pid_buf = b""
        self._pid_pending = False
        self.stdout.feed_eof()
        self.stderr.feed_eof()

    def _closed(self, exc: BaseException | None) -> None:
        if exc is not None and self.exit_status is None and self.exit_signal is None:
            self._lost = exc
        self._feed_eof()
        if not self._done.done():
            self._done.set_result(None)

    # -- NodeProcess ----------------------------------------------------------------

    @property
    def returncode(self) -> int | None:
        """Exit code (``-signum`` if killed) once known, else None."""
        if self.exit_status is not None:
            return self.exit_status
        if self.exit_signal is not None:
            return -_signal_number(self.exit_signal)
        return None

    def write(self, data: bytes) -> None:
        """Send bytes to the remote stdin; ignored once the channel is closed."""
        if self._chan is None or self._done.done():
            return
        with contextlib.suppress(OSError, asyncssh.Error):
            self._chan.write(data)

    def close_stdin(self) -> None:
        """Send EOF to the remote stdin."""
        if self._chan is None or self._done.done():
            return
        with contextlib.suppress(OSError, asyncssh.Error):
            self._chan.write_eof()

    def signal(self, signum: int) -> None:
        """Best effort: signal the remote process group (the process alone if its PID is unknown).

        With the PID known the group is signalled with ``kill -SIG -- -PGID`` on a
        second channel of the same connection; otherwise (and for SIGKILL, also)
        the signal goes in-band as an SSH ``signal`` request. SIGKILL also closes
        the channel, so :meth:`wait` returns even if the process ignores its fate.
        """
        if self._done.done():
            return
        kill = signum == signal_module.SIGKILL
        if kill:
            self._killed = True
        if (self.pid is None or kill) and self._chan is not None:
            with contextlib.suppress(OSError, ValueError, asyncssh.Error):
                self._chan.send_signal(signum)
        if self.pid is not None:
            self._signalling = self._transport._background(self._signal_group(signum))
        elif kill:
            self._close_channel()

    async def kill(self) -> int | None:
        """SIGKILL the remote process group and wait until that is done.

        Returns the exit code (``-9`` when killed), or None if it did not end in time.
        """
        self.signal(signal_module.SIGKILL)
        if self._signalling is not None:
            await asyncio.shield(self._signalling)
        self._close_channel()
        try:
            return await asyncio.wait_for(self.wait(), KILL_GRACE)
        except asyncio.TimeoutError:
            return None

    async def _signal_group(self, signum: int) -> None:
        assert self.pid is not None
        command = (
            f"kill -{int(signum)} -- -{self.pid} 2>/dev/null || kill -{int(signum)} {self.pid}"
        )
        with contextlib.suppress(TransportError, OSError, asyncssh.Error, asyncio.TimeoutError):
            await self._transport.run(self.host, command, timeout=KILL_GRACE)
        if signum == signal_module.SIGKILL:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._done), 1.0)
            self._close_channel()

    def _close_channel(self) -> None:
        if self._chan is not None and not self._done.done():
            self._chan.close()

    @property
    def lost(self) -> ConnectionLost | None:
        """The ConnectionLost error when the connection broke before the exit status came."""
        if self._lost is None or self.returncode is not None or self._killed:
            return None
        error = ConnectionLost(
            f"connection lost while running the command: {self._lost}",
            host=self.host.name,
            command=self.command,
            cause=lost_cause(self._lost),
        )
        error.__cause__ = self._lost
        return error

    async def wait(self, *, check: bool = False) -> int:
        """Exit code, or ``-signum`` if killed by a signal.

        When the connection broke first (host down, link cut) this returns
        :data:`EXIT_LOST` (255, as ``ssh`` does) and :attr:`lost` holds the
        :class:`~corral.errors.ConnectionLost` naming the host and the cause;
        ``wait(check=True)`` raises it instead.
        """
        await asyncio.shield(self._done)
        code = self.returncode
        if code is not None:
            return code
        if self._killed:
            return -int(signal_module.SIGKILL)
        lost = self.lost
        if lost is not None and check:
            raise lost
        return EXIT_LOST  # lost, or closed without an exit status (as ssh reports it)
