"""The ranks' control socket on a node: private to the job's user, and authenticated.

The node agent serves one filesystem unix socket per attempt, with a random
name inside a fresh ``0700`` directory (under ``$XDG_RUNTIME_DIR`` when usable,
else the system temp dir); the socket file itself is ``0600``. The agent also
makes a random per-attempt token. Both reach the ranks only through their
environment (:data:`CONTROL_ENV` = ``unix:/path``, :data:`TOKEN_ENV`), never
argv, a log or a file.

Every connection must come from the agent's own user (or root), checked with
the peer credentials the kernel records at ``connect()`` (``SO_PEERCRED``), and
its first line must be ``auth <token>`` (the client side is
:func:`corral.sdk.runtime.connect_control`). Anything else is closed before a single
byte past that line is read, so nothing a stranger sends is ever acted upon.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import os
import secrets
import shutil
import socket
import stat
import struct
import tempfile
from collections.abc import Awaitable, Callable
from typing import Any

from corral.contract import CONTROL_ENV, auth_line
from corral.contract import CONTROL_TOKEN_ENV as TOKEN_ENV

AUTH_TIMEOUT = 10.0  # seconds a new connection has to present the token
# sun_path is 108 bytes on Linux (104 on macOS) including the NUL
_MAX_PATH = 100
_NAME_BYTES = 8  # random socket name: 16 hex digits

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


def _usable_base(path: str) -> bool:
    try:
        info = os.stat(path)
    except OSError:
        return False
    return (
        stat.S_ISDIR(info.st_mode)
        and info.st_uid == os.geteuid()
        and not info.st_mode & 0o022
        and os.access(path, os.W_OK | os.X_OK)
        and len(path) + 30 <= _MAX_PATH
    )


def socket_base_dir(preferred: str | None = None) -> str:
    """Where the agent makes its private socket directory: ``preferred`` (the node's
    own dir: an agent killed with SIGKILL then leaves nothing in a shared temp dir),
    else ``$XDG_RUNTIME_DIR``, each when it is ours, writable by no one else and short
    enough for a socket path; else the system temp dir."""
    if preferred and _usable_base(preferred):
        return preferred
    runtime = os.environ.get("XDG_RUNTIME_DIR", "")
    if runtime and _usable_base(runtime):
        return runtime
    base = tempfile.gettempdir()
    return base if len(base) + 30 <= _MAX_PATH else "/tmp"


def peer_uid(sock: Any) -> int | None:
    """The uid of the process at the other end of a connected unix socket, from the
    kernel (Linux ``SO_PEERCRED``, BSD/macOS ``LOCAL_PEERCRED``); None when unknown."""
    try:
        if hasattr(socket, "SO_PEERCRED"):
            size = struct.calcsize("3i")
            _pid, uid, _gid = struct.unpack(
                "3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, size)
            )
            return int(uid)
        local_peercred = getattr(socket, "LOCAL_PEERCRED", None)
        if local_peercred is not None:  # struct xucred {u_int version; uid_t uid; ...}
            data = sock.getsockopt(0, local_peercred, 76)  # SOL_LOCAL = 0
            _version, uid = struct.unpack_from("Ii", data)
            return int(uid)
    except (OSError, struct.error):
        return None
    return None


def peer_allowed(uid: int | None) -> bool:
    """Only the agent's own user, or root, may talk to the agent."""
    return uid is not None and uid in (os.geteuid(), 0)


class ControlServer:
    """One attempt's control socket: makes the directory, the socket and the token,
    authenticates each connection and hands the authenticated ones to ``handler``.

    ``handler`` gets the stream positioned just after the ``auth`` line and owns the
    writer from then on. :meth:`close` (idempotent) stops serving and removes the
    socket and its directory.
    """

    def __init__(
        self, handler: Handler, *, limit: int = 1 << 16, base_dir: str | None = None
    ) -> None:
        self.handler = handler
        self.limit = limit
        self.base_dir = base_dir
        self.token = secrets.token_hex(16)
        self.directory: str | None = None
        self.path: str | None = None
        self.refused = 0
        self._expected = auth_line(self.token)
        self._server: asyncio.AbstractServer | None = None
        self._connections: set[asyncio.Task[Any]] = set()  # accepted, not yet finished

    @property
    def address(self) -> str:
        """``unix:/path`` of the socket (:data:`CONTROL_ENV`'s value)."""
        if self.path is None:
            raise RuntimeError("the control socket is not started")
        return f"unix:{self.path}"

    def env(self) -> dict[str, str]:
        """What every rank's environment gets: the address and the token."""
        return {CONTROL_ENV: self.address, TOKEN_ENV: self.token}

    async def start(self) -> None:
        """Make the private directory and start serving the socket in it."""
        self.directory = tempfile.mkdtemp(prefix="corral-", dir=socket_base_dir(self.base_dir))
        os.chmod(self.directory, 0o700)
        self.path = os.path.join(self.directory, secrets.token_hex(_NAME_BYTES))
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(self.path)
            os.chmod(self.path, 0o600)
            self._server = await asyncio.start_unix_server(
                self._accept, sock=sock, limit=self.limit
            )
        except BaseException:
            sock.close()
            self.close()
            raise

    async def drain(self, timeout: float) -> None:
        """Read what the ranks already sent before they exited: let connections still
        waiting in the listen queue be accepted, then wait (``timeout`` in all) until
        every accepted connection, authenticating or not, has been read to its end."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            await asyncio.sleep(0.01)  # the loop accepts what is queued meanwhile
            pending = {t for t in self._connections if not t.done()}
            left = deadline - loop.time()
            if not pending or left <= 0:
                return
            await asyncio.wait(pending, timeout=left)

    def close(self) -> None:
        """Stop accepting and remove the socket and its directory."""
        if self._server is not None:
            self._server.close()
            self._server = None
        if self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)
            self.directory = None

    async def _authenticate(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bool:
        if not peer_allowed(peer_uid(writer.get_extra_info("socket"))):
            return False
        try:
            line = await asyncio.wait_for(reader.readline(), AUTH_TIMEOUT)
        except (ValueError, ConnectionError, asyncio.IncompleteReadError, asyncio.TimeoutError):
            return False
        return hmac.compare_digest(line, self._expected)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._connections.add(task)
            task.add_done_callback(self._connections.discard)
        if not await self._authenticate(reader, writer):
            self.refused += 1
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
            return
        await self.handler(reader, writer)


__all__ = [
    "CONTROL_ENV",
    "TOKEN_ENV",
    "ControlServer",
    "auth_line",
    "peer_allowed",
    "peer_uid",
    "socket_base_dir",
]
