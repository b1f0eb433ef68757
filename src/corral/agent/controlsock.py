"""The ranks' control socket as a file and a token, made with the standard library.

The node agent binds it before its asyncio machinery is loaded, so that it can
start the node's processes at once (:mod:`corral.agent.spawn`);
:class:`corral.agent.control.ControlServer` then serves it. One socket per
attempt, with a random name inside a fresh ``0700`` directory (the node's own
dir, else ``$XDG_RUNTIME_DIR`` when usable, else the system temp dir); the
socket file itself is ``0600``; the token is random per attempt. Both reach the
ranks only through their environment (:data:`CONTROL_ENV`, :data:`TOKEN_ENV`).
"""

from __future__ import annotations

import os
import shutil
import socket
import stat
import tempfile

from corral.contract import CONTROL_ENV
from corral.contract import CONTROL_TOKEN_ENV as TOKEN_ENV

__all__ = ["CONTROL_ENV", "TOKEN_ENV", "ControlSocket", "socket_base_dir"]

# sun_path is 108 bytes on Linux (104 on macOS) including the NUL
_MAX_PATH = 100
_NAME_BYTES = 8  # random socket name: 16 hex digits


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


class ControlSocket:
    """A bound, listening control socket in a private directory, and its token.

    :meth:`close` (idempotent) closes the socket and removes it with its directory.
    """

    def __init__(self, base_dir: str | None = None) -> None:
        self.token = os.urandom(16).hex()  # as secrets.token_hex, without its imports
        self.directory: str | None = tempfile.mkdtemp(
            prefix="corral-", dir=socket_base_dir(base_dir)
        )
        os.chmod(self.directory, 0o700)
        self.path = os.path.join(self.directory, os.urandom(_NAME_BYTES).hex())
        self.sock: socket.socket | None = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.sock.bind(self.path)
            os.chmod(self.path, 0o600)
            self.sock.listen(socket.SOMAXCONN)
        except BaseException:
            self.close()
            raise

    @property
    def address(self) -> str:
        """``unix:/path`` of the socket (:data:`CONTROL_ENV`'s value)."""
        return f"unix:{self.path}"

    def env(self) -> dict[str, str]:
        """What every rank's environment gets: the address and the token."""
        return {CONTROL_ENV: self.address, TOKEN_ENV: self.token}

    def close(self) -> None:
        """Close the socket and remove it and its directory."""
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        if self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)
            self.directory = None
