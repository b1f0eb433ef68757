"""The ranks' control socket on a node: private to the job's user, and authenticated.

The node agent serves one filesystem unix socket per attempt, with a random
name inside a fresh ``0700`` directory (the node's own dir, else
``$XDG_RUNTIME_DIR`` when usable, else the system temp dir); the socket file
itself is ``0600``. The agent also makes a random per-attempt token. Both reach
the ranks only through their environment (:data:`CONTROL_ENV` = ``unix:/path``,
:data:`TOKEN_ENV`), never argv, a log or a file. The socket and the token are
made by :class:`corral.agent.controlsock.ControlSocket` (the standard library
alone: the agent binds it before it loads asyncio); :class:`ControlServer`
serves it.

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
import socket
import struct
from collections.abc import Awaitable, Callable
from typing import Any

from corral.agent.controlsock import CONTROL_ENV, TOKEN_ENV, ControlSocket
from corral.contract import auth_line

AUTH_TIMEOUT = 10.0  # seconds a new connection has to present the token

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


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
    """Serves one attempt's control socket (a :class:`ControlSocket`, made here by
    :meth:`start` unless one is given), authenticates each connection and hands the
    authenticated ones to ``handler``.

    ``handler`` gets the stream positioned just after the ``auth`` line and owns the
    writer from then on. :meth:`close` (idempotent) stops serving and removes the
    socket and its directory.
    """

    def __init__(
        self,
        handler: Handler,
        *,
        limit: int = 1 << 16,
        base_dir: str | None = None,
        bound: ControlSocket | None = None,
    ) -> None:
        self.handler = handler
        self.limit = limit
        self.base_dir = base_dir
        self.bound = bound
        self.refused = 0
        self._server: asyncio.AbstractServer | None = None
        self._connections: set[asyncio.Task[Any]] = set()  # accepted, not yet finished

    @property
    def token(self) -> str:
        """The connections' token (:data:`TOKEN_ENV`'s value)."""
        return self._socket().token

    @property
    def directory(self) -> str | None:
        """The socket's private directory (None once closed)."""
        return self.bound.directory if self.bound is not None else None

    @property
    def path(self) -> str | None:
        """The socket's file."""
        return self.bound.path if self.bound is not None else None

    @property
    def address(self) -> str:
        """``unix:/path`` of the socket (:data:`CONTROL_ENV`'s value)."""
        return self._socket().address

    def env(self) -> dict[str, str]:
        """What every rank's environment gets: the address and the token."""
        return self._socket().env()

    def _socket(self) -> ControlSocket:
        if self.bound is None:
            raise RuntimeError("the control socket is not started")
        return self.bound

    async def start(self) -> None:
        """Serve the socket (made now, in a new private directory, unless given)."""
        if self.bound is None:
            self.bound = ControlSocket(self.base_dir)
        try:
            self._server = await asyncio.start_unix_server(
                self._accept, sock=self.bound.sock, limit=self.limit
            )
        except BaseException:
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
        if self.bound is not None:
            self.bound.close()

    async def _authenticate(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bool:
        if not peer_allowed(peer_uid(writer.get_extra_info("socket"))):
            return False
        try:
            line = await asyncio.wait_for(reader.readline(), AUTH_TIMEOUT)
        except (ValueError, ConnectionError, asyncio.IncompleteReadError, asyncio.TimeoutError):
            return False
        return hmac.compare_digest(line, auth_line(self._socket().token))

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
]
