"""LocalTransport: every simulated node of ``local:N`` is a local process tree.

Each started process is a session leader (its own session and process group),
so signalling a node never touches another node or corral itself. Only a small
login-like environment is passed on (PATH, HOME, locale, ...) plus what the
caller asks for: never the coordinator's whole environment.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import signal
from collections.abc import Mapping, Sequence
from typing import Protocol

from corral.cluster.model import Host
from corral.errors import ConnectError
from corral.transport.loginenv import LOGIN_ENV_KEYS, login_env

__all__ = ["LOGIN_ENV_KEYS", "STREAM_LIMIT", "LocalProcess", "LocalTransport", "login_env"]

STREAM_LIMIT = 1 << 20


class _Writable(Protocol):
    """A process's stdin: asyncio's stream writer, or a pipe's write transport."""

    def write(self, data: bytes) -> None: ...

    def is_closing(self) -> bool: ...

    def close(self) -> None: ...


class _Process(Protocol):
    """What :class:`LocalProcess` uses of :class:`asyncio.subprocess.Process`."""

    @property
    def pid(self) -> int: ...

    @property
    def stdin(self) -> _Writable | None: ...

    @property
    def stdout(self) -> asyncio.StreamReader | None: ...

    @property
    def stderr(self) -> asyncio.StreamReader | None: ...

    @property
    def returncode(self) -> int | None: ...

    async def wait(self) -> int: ...


class _Adopted:
    """A process started before the event loop ran (the entry point's agents,
    :mod:`corral.cli.entry`) as a :class:`_Process`: its pipes attached to the loop,
    its exit seen through a pidfd (a thread's ``waitpid`` without one)."""

    def __init__(
        self,
        pid: int,
        stdin: asyncio.WriteTransport,
        stdout: asyncio.StreamReader,
        stderr: asyncio.StreamReader,
    ) -> None:
        self.pid = pid
        self.stdin: _Writable | None = stdin
        self.stdout: asyncio.StreamReader | None = stdout
        self.stderr: asyncio.StreamReader | None = stderr
        self._code: int | None = None
        self._reaping: asyncio.Future[int] | None = None

    @classmethod
    async def attach(cls, pid: int, stdin: int, stdout: int, stderr: int) -> _Adopted:
        """Attach the pipes (the parent's ends: stdin's write end, the read ends of
        stdout and stderr) of the child ``pid`` to the running loop."""
        loop = asyncio.get_running_loop()
        readers = []
        for fd in (stdout, stderr):
            reader = asyncio.StreamReader(limit=STREAM_LIMIT, loop=loop)
            protocol = asyncio.StreamReaderProtocol(reader, loop=loop)
            pipe = os.fdopen(fd, "rb", buffering=0)
            await loop.connect_read_pipe(functools.partial(_same, protocol), pipe)
            readers.append(reader)
        writer, _ = await loop.connect_write_pipe(
            asyncio.Protocol, os.fdopen(stdin, "wb", buffering=0)
        )
        return cls(pid, writer, *readers)

    @property
    def returncode(self) -> int | None:
        """The exit code once reaped (``-signum`` when killed), else None."""
        return self._code

    async def wait(self) -> int:
        """Wait for the exit; the code, as :meth:`asyncio.subprocess.Process.wait`."""
        if self._reaping is None:
            self._reaping = asyncio.ensure_future(self._reap())
        return await asyncio.shield(self._reaping)

    async def _reap(self) -> int:
        loop = asyncio.get_running_loop()
        try:
            pidfd = os.pidfd_open(self.pid)
        except (AttributeError, OSError):
            _, status = await loop.run_in_executor(None, _waitpid, self.pid, 0)
        else:
            try:
                while not (done_status := _waitpid(self.pid, os.WNOHANG))[0]:
                    exited = loop.create_future()
                    loop.add_reader(pidfd, _settle, exited)
                    try:
                        await exited
                    finally:
                        loop.remove_reader(pidfd)
                status = done_status[1]
            finally:
                os.close(pidfd)
        # reaped elsewhere: no code to know, 255 as asyncio's child watchers say then
        self._code = 255 if status is None else os.waitstatus_to_exitcode(status)
        return self._code


def _same(protocol: asyncio.StreamReaderProtocol) -> asyncio.StreamReaderProtocol:
    return protocol


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _waitpid(pid: int, options: int) -> tuple[bool, int | None]:
    """Whether ``pid`` has ended, and its wait status (None: reaped elsewhere)."""
    try:
        found, status = os.waitpid(pid, options)
    except ChildProcessError:
        return True, None
    return bool(found), (status if found else None)


class LocalProcess:
    """A process started by :class:`LocalTransport`."""

    def __init__(self, host: Host, proc: _Process) -> None:
        self.host = host
        self._proc = proc
        assert proc.stdout is not None and proc.stderr is not None
        self.stdout: asyncio.StreamReader = proc.stdout
        self.stderr: asyncio.StreamReader = proc.stderr
        self.pid = proc.pid

    def write(self, data: bytes) -> None:
        """Send bytes to stdin; silently ignored once the process is gone."""
        stdin = self._proc.stdin
        if stdin is None or stdin.is_closing():
            return
        with contextlib.suppress(ConnectionError, RuntimeError):
            stdin.write(data)

    def close_stdin(self) -> None:
        """Close stdin (EOF for the process)."""
        if self._proc.stdin is not None:
            with contextlib.suppress(ConnectionError, RuntimeError):
                self._proc.stdin.close()

    def signal(self, signum: int) -> None:
        """Signal the process group (a no-op once it is gone)."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signum)

    async def wait(self) -> int:
        """Exit code, or ``-signum`` when killed by a signal."""
        return await self._proc.wait()


class LocalTransport:
    """Runs commands as local process trees (the ``local:N`` cluster)."""

    def __init__(self) -> None:
        self._procs: list[LocalProcess] = []

    async def start(
        self,
        host: Host,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> LocalProcess:
        """Start ``argv`` in a new session with the login env plus ``env``."""
        full_env = login_env()
        full_env.update(env or {})
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=full_env,
                cwd=cwd,
                start_new_session=True,
                limit=STREAM_LIMIT,
            )
        except OSError as exc:
            raise ConnectError(
                f"cannot start {argv[0]}", host=host.name, command=" ".join(argv), cause=str(exc)
            ) from exc
        local = LocalProcess(host, proc)
        self._procs.append(local)
        return local

    async def adopt(
        self, host: Host, pid: int, stdin: int, stdout: int, stderr: int
    ) -> LocalProcess:
        """``host``'s process ``pid``, started before the event loop as :meth:`start`
        starts one (a session leader; the parent's ends of its pipes given), as if this
        transport had started it."""
        local = LocalProcess(host, await _Adopted.attach(pid, stdin, stdout, stderr))
        self._procs.append(local)
        return local

    async def close(self) -> None:
        """Kill any process group still running (last-resort cleanup)."""
        for proc in self._procs:
            if proc._proc.returncode is None:
                proc.signal(signal.SIGKILL)
                with contextlib.suppress(ProcessLookupError, asyncio.TimeoutError):
                    await asyncio.wait_for(proc.wait(), 5.0)
        self._procs.clear()
