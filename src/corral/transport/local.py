"""LocalTransport: every simulated node of ``local:N`` is a local process tree.

Each started process is a session leader (its own session and process group),
so signalling a node never touches another node or corral itself. Only a small
login-like environment is passed on (PATH, HOME, locale, ...) plus what the
caller asks for: never the coordinator's whole environment.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Mapping, Sequence

from corral.cluster.model import Host
from corral.errors import ConnectError

#: What an SSH login would give a process too; everything else must be asked for.
LOGIN_ENV_KEYS = (
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "SHELL",
    "LANG",
    "LC_ALL",
    "LC_CTYPE",
    "TMPDIR",
    "TZ",
)

STREAM_LIMIT = 1 << 20


def login_env() -> dict[str, str]:
    """The subset of the coordinator's environment a login shell would also have."""
    return {k: os.environ[k] for k in LOGIN_ENV_KEYS if k in os.environ}


class LocalProcess:
    """A process started by :class:`LocalTransport`."""

    def __init__(self, host: Host, proc: asyncio.subprocess.Process) -> None:
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

    async def close(self) -> None:
        """Kill any process group still running (last-resort cleanup)."""
        for proc in self._procs:
            if proc._proc.returncode is None:
                proc.signal(signal.SIGKILL)
                with contextlib.suppress(ProcessLookupError, asyncio.TimeoutError):
                    await asyncio.wait_for(proc.wait(), 5.0)
        self._procs.clear()
