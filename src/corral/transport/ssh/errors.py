"""Translating asyncssh/OS errors into corral's error tree, naming the host and the cause.

Every connect failure becomes a :class:`~corral.errors.ConnectError` (``raise
... from exc`` at the call site); a link that breaks under a running command
becomes a :class:`~corral.errors.ConnectionLost` whose cause
:func:`lost_cause` names.
"""

from __future__ import annotations

import asyncio
import errno
import re
import socket
from pathlib import Path

import asyncssh

from corral.errors import ConnectError, TransportError
from corral.transport.ssh.known_hosts import (
    HostKeyDecision,
    HostKeyVerdict,
    KnownHostsPolicy,
    keygen_remove_command,
    keyscan_command,
)

__all__ = ["is_transient", "lost_cause", "translate_error"]

_TRANSIENT_ERRNOS = frozenset(
    {errno.ECONNRESET, errno.ECONNABORTED, errno.EPIPE, errno.ECONNREFUSED}
)
_UNREACHABLE_ERRNOS = frozenset(
    {errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EHOSTDOWN, errno.ENETDOWN, errno.EADDRNOTAVAIL}
)


def _errno(exc: BaseException) -> int | None:
    """errno of an OSError, also from asyncio's "Multiple exceptions: [Errno N] ..." text."""
    if not isinstance(exc, OSError):
        return None
    if exc.errno is not None:
        return int(exc.errno)
    match = re.search(r"\[Errno (\d+)\]", str(exc))
    return int(match.group(1)) if match else None


def is_transient(exc: BaseException) -> bool:
    """Whether a failed connect is worth retrying (reset, refused, lost during handshake)."""
    if isinstance(exc, asyncssh.ConnectionLost):
        return True
    if isinstance(exc, socket.gaierror):
        return exc.errno == socket.EAI_AGAIN
    if isinstance(exc, OSError) and not isinstance(exc, TimeoutError):
        return _errno(exc) in _TRANSIENT_ERRNOS or isinstance(
            exc, ConnectionResetError | ConnectionAbortedError | BrokenPipeError
        )
    return False


def translate_error(
    exc: BaseException,
    *,
    host: str,
    target: str | None = None,
    command: str | None = None,
    decision: HostKeyDecision | None = None,
    policy: KnownHostsPolicy | None = None,
    timeout: float | None = None,
) -> TransportError:
    """Turn an asyncssh/OS error of a connect into a :class:`ConnectError` naming the cause.

    ``decision``/``policy`` tell an unknown host key from a changed one and give
    the command that fixes it; ``target`` is ``user@hostname:port`` for messages.
    """
    where = target or host
    if isinstance(exc, TransportError):
        return exc
    if isinstance(exc, asyncssh.HostKeyNotVerifiable):
        return _host_key_error(exc, host=host, command=command, decision=decision, policy=policy)
    if isinstance(exc, asyncssh.PermissionDenied):
        return ConnectError(
            f"permission denied for {where}: no accepted key or password (check --ssh-key / "
            "IdentityFile, ssh-agent, --ssh-user and the host's authorized_keys)",
            host=host,
            command=command,
            cause="auth failed",
        )
    if isinstance(exc, asyncio.TimeoutError | TimeoutError):
        limit = f" within {timeout:g} s" if timeout else ""
        return ConnectError(
            f"no SSH connection to {where}{limit} (host down, firewalled or link cut?)",
            host=host,
            command=command,
            cause="timeout",
        )
    if isinstance(exc, socket.gaierror):
        return ConnectError(
            f"cannot resolve {where} ({exc.strerror or exc}): check the host name or the "
            "HostName in your ssh config",
            host=host,
            command=command,
            cause="DNS lookup failed",
        )
    code = _errno(exc)
    if isinstance(exc, ConnectionRefusedError) or code == errno.ECONNREFUSED:
        return ConnectError(
            f"connection to {where} refused: is sshd running and listening on that port?",
            host=host,
            command=command,
            cause="connection refused",
        )
    if isinstance(exc, OSError) and code in _UNREACHABLE_ERRNOS:
        return ConnectError(
            f"{where} is unreachable ({exc.strerror or exc})",
            host=host,
            command=command,
            cause="unreachable",
        )
    if isinstance(exc, asyncssh.KeyImportError | asyncssh.KeyEncryptionError):
        return ConnectError(
            f"cannot use the SSH key for {where}: {exc}",
            host=host,
            command=command,
            cause="bad key",
        )
    if isinstance(exc, asyncssh.ConnectionLost | ConnectionResetError | BrokenPipeError):
        return ConnectError(
            f"connection to {where} closed during the SSH handshake ({exc}): sshd overloaded "
            "(MaxStartups) or refusing this client",
            host=host,
            command=command,
            cause="connection lost",
        )
    if isinstance(exc, asyncssh.DisconnectError):
        return ConnectError(
            f"{where} disconnected: {exc.reason}",
            host=host,
            command=command,
            cause="disconnected",
        )
    if isinstance(exc, OSError):
        return ConnectError(
            f"cannot connect to {where}: {exc.strerror or exc}",
            host=host,
            command=command,
            cause="unreachable",
        )
    return ConnectError(
        f"cannot connect to {where}: {type(exc).__name__}: {exc}",
        host=host,
        command=command,
        cause="error",
    )


def _host_key_error(
    exc: asyncssh.HostKeyNotVerifiable,
    *,
    host: str,
    command: str | None,
    decision: HostKeyDecision | None,
    policy: KnownHostsPolicy | None,
) -> ConnectError:
    verdict = decision.verdict if decision is not None else None
    lookup = decision.lookup_host if decision and decision.lookup_host else host
    port = decision.port if decision is not None else None
    file = policy.primary if policy is not None else Path("~/.ssh/known_hosts")
    fingerprint = f" (offered {decision.fingerprint})" if decision and decision.fingerprint else ""
    if verdict is HostKeyVerdict.MISMATCH:
        return ConnectError(
            f"HOST KEY CHANGED for {lookup}{fingerprint}: refusing to connect, this may be a "
            f"man-in-the-middle attack. If the host was reinstalled, remove the old key with "
            f"`{keygen_remove_command(lookup, port, file)}` and verify the new one",
            host=host,
            command=command,
            cause="host key mismatch",
        )
    if verdict is None:  # refused before our policy was asked (e.g. a ProxyJump hop)
        return ConnectError(
            f"{exc.reason}: refusing to connect; record the key of that host in its "
            f"known_hosts file (ssh-keyscan) or check it if it changed",
            host=host,
            command=command,
            cause="unknown host key",
        )
    if verdict is HostKeyVerdict.UNKNOWN:
        return ConnectError(
            f"host key of {lookup} is not in {file}{fingerprint}: refusing to connect. If you "
            f"trust this host, record its key with `{keyscan_command(lookup, port, file)}` "
            "or rerun with --accept-new-host-keys",
            host=host,
            command=command,
            cause="unknown host key",
        )
    return ConnectError(  # pragma: no cover - a recorded key is accepted, never refused
        f"host key of {lookup} not trusted: {exc.reason}",
        host=host,
        command=command,
        cause="host key mismatch",
    )


def lost_cause(exc: BaseException) -> str:
    """Why a link broke, for ConnectionLost's ``cause``."""
    text = str(exc).lower()
    if "keepalive" in text:
        return "no keepalive reply"
    if isinstance(exc, asyncssh.DisconnectError):
        return "disconnected"
    return "connection lost"
