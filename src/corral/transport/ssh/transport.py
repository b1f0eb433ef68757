"""SshTransport: run a node's command on a remote host over SSH (asyncssh).

One connection per host per transport, reused for every channel (concurrent
starts to the same host share one connect). Each ``start`` opens a session
channel (no PTY, so stdout and stderr stay separate) running one shell-quoted
command line::

    printf '__corral_pid__=%d\\n' "$$" >&2; cd '<cwd>' && exec env 'K=V' ... '<argv0>' ...

Every argument goes through :func:`shlex.quote`; variables are set with
``env`` on the command line (no ``SendEnv``/``AcceptEnv`` needed) and only the
ones the caller gives. The first stderr line reports the remote PID (= the
session and process group sshd created for the channel); it is stripped from
the stream and used by :meth:`SshProcess.signal` to signal the whole group.
This needs a POSIX-style login shell on the host (bash, zsh, dash, ksh).

Settings come from the CLUSTER options plus the user's OpenSSH config
(``~/.ssh/config``, or only ``--ssh-config FILE`` when given, like ``ssh -F``):
Host aliases, HostName, User, Port, IdentityFile, ProxyJump, UserKnownHostsFile,
ConnectTimeout. ssh-agent is used when ``SSH_AUTH_SOCK`` is set. Host keys are
checked against known_hosts (see :mod:`corral.transport.ssh.known_hosts`).

Every asyncssh/OS error is translated here, with ``raise ... from exc``, into
:class:`~corral.errors.ConnectError`, :class:`~corral.errors.CommandTimeout` or
:class:`~corral.errors.ConnectionLost`, naming the host and the cause.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import logging
import random
import re
import shlex
import signal as signal_module
import socket
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import asyncssh

from corral.cluster.model import Host
from corral.errors import CommandTimeout, ConfigError, ConnectError, ConnectionLost, TransportError
from corral.transport.ssh.known_hosts import (
    HostKeyDecision,
    HostKeyVerdict,
    KnownHostsPolicy,
    keygen_remove_command,
    keyscan_command,
    known_hosts_files,
)

__all__ = [
    "EXIT_LOST",
    "CompletedCommand",
    "SshProcess",
    "SshSettings",
    "SshTransport",
    "build_command",
    "build_shell_command",
    "is_transient",
    "translate_error",
]

log = logging.getLogger(__name__)

STREAM_LIMIT = 1 << 20
PID_PREAMBLE = "printf '__corral_pid__=%d\\n' \"$$\" >&2"
_PID_LINE_RE = re.compile(rb"__corral_pid__=(\d+)")
_PID_SCAN_LIMIT = 64 * 1024
_ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_KILL_GRACE = 5.0
DEFAULT_CONNECT_TIMEOUT = 10.0
#: What :meth:`SshProcess.wait` returns when the connection broke first (like ``ssh``).
EXIT_LOST = 255

_TRANSIENT_ERRNOS = frozenset(
    {errno.ECONNRESET, errno.ECONNABORTED, errno.EPIPE, errno.ECONNREFUSED}
)
_UNREACHABLE_ERRNOS = frozenset(
    {errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EHOSTDOWN, errno.ENETDOWN, errno.EADDRNOTAVAIL}
)


class SshSettings(Protocol):
    """What :class:`SshTransport` reads from the CLUSTER options (``SshOptions``)."""

    @property
    def user(self) -> str | None: ...
    @property
    def key(self) -> str | None: ...
    @property
    def port(self) -> int | None: ...
    @property
    def config(self) -> str | None: ...
    @property
    def accept_new_host_keys(self) -> bool: ...
    def password(self) -> str | None:
        """The password (read from the environment variable the user named), or None."""
        ...


@dataclass(frozen=True)
class _DefaultSettings:
    user: str | None = None
    key: str | None = None
    port: int | None = None
    config: str | None = None
    accept_new_host_keys: bool = False

    def password(self) -> str | None:
        return None


# --------------------------------------------------------------------------- command lines


def _check_env(env: Mapping[str, str] | None) -> dict[str, str]:
    checked = dict(env or {})
    for name in checked:
        if not _ENV_NAME_RE.match(name):
            raise ConfigError(
                f"invalid environment variable name {name!r}: expected letters, digits and _"
            )
    return checked


def _quote_dir(path: str) -> str:
    return shlex.quote("./" + path if path.startswith("-") else path)


def build_command(
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
    report_pid: bool = True,
) -> str:
    """The remote command line that runs ``argv`` verbatim in ``cwd`` with ``env`` added.

    >>> build_command(["echo", "a b"], env={"X": "1"}, cwd="/tmp", report_pid=False)
    "cd /tmp && exec env X=1 echo 'a b'"
    """
    if not argv:
        raise ValueError("empty argv: nothing to run")
    variables = _check_env(env)
    words = ["exec"]
    if variables:
        words.append("env")
        words.extend(shlex.quote(f"{k}={v}") for k, v in variables.items())
    words.extend(shlex.quote(arg) for arg in argv)
    body = " ".join(words)
    if cwd:
        body = f"cd {_quote_dir(cwd)} && {body}"
    return f"{PID_PREAMBLE}; {body}" if report_pid else body


def build_shell_command(
    command: str,
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
    report_pid: bool = True,
) -> str:
    """A command line for the host's login shell, run as written (``$VARS`` expand remotely).

    Variables are exported and ``cwd`` entered first; ``command`` is the last line.
    """
    variables = _check_env(env)
    lines = [PID_PREAMBLE] if report_pid else []
    if variables:
        lines.append("export " + " ".join(shlex.quote(f"{k}={v}") for k, v in variables.items()))
    if cwd:
        lines.append(f"cd {_quote_dir(cwd)} || exit 1")
    lines.append(command)
    return "\n".join(lines)


# --------------------------------------------------------------------------- error translation


@dataclass(frozen=True)
class _Target:
    """Where a host alias resolved to (for messages)."""

    host: str
    port: int
    user: str

    def __str__(self) -> str:
        return f"{self.user}@{self.host}:{self.port}"


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


# --------------------------------------------------------------------------- process


class _Client(asyncssh.SSHClient):
    """Consults the known-hosts policy for keys asyncssh did not already trust."""

    def __init__(self, policy: KnownHostsPolicy, decision: HostKeyDecision) -> None:
        self._policy = policy
        self._decision = decision

    def validate_host_public_key(self, host: str, addr: str, port: int, key: Any) -> bool:
        return self._policy.decide(self._decision, host, addr, port, key)


def _signal_number(name: str) -> int:
    try:
        return int(signal_module.Signals[f"SIG{name.upper()}"])
    except KeyError:
        return 99


class _Session(asyncssh.SSHClientSession[bytes]):
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

    def __init__(self, transport: SshTransport, host: Host, command: str) -> None:
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
            return await asyncio.wait_for(self.wait(), _KILL_GRACE)
        except asyncio.TimeoutError:
            return None

    async def _signal_group(self, signum: int) -> None:
        assert self.pid is not None
        command = (
            f"kill -{int(signum)} -- -{self.pid} 2>/dev/null || kill -{int(signum)} {self.pid}"
        )
        with contextlib.suppress(TransportError, OSError, asyncssh.Error, asyncio.TimeoutError):
            await self._transport.run(self.host, command, timeout=_KILL_GRACE)
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
            cause=_lost_cause(self._lost),
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


def _lost_cause(exc: BaseException) -> str:
    text = str(exc).lower()
    if "keepalive" in text:
        return "no keepalive reply"
    if isinstance(exc, asyncssh.DisconnectError):
        return "disconnected"
    return "connection lost"


# --------------------------------------------------------------------------- transport


@dataclass
class _Prepared:
    name: str
    options: Any
    policy: KnownHostsPolicy
    target: _Target
    timeout: float


@dataclass(frozen=True)
class CompletedCommand:
    """Result of :meth:`SshTransport.run`."""

    host: str
    exit_code: int
    stdout: bytes
    stderr: bytes


class SshTransport:
    """Starts processes on remote hosts over SSH; one cached connection per host.

    ``options`` are the CLUSTER options (user, key, port, password env var,
    config file, accept-new-host-keys). ``connect_timeout`` (TCP + handshake +
    auth) defaults to the ssh config's ConnectTimeout, else 10 s.
    ``keepalive_count_max`` follows OpenSSH's ``ServerAliveCountMax``: a silent
    host is declared lost after
    ``keepalive_interval * keepalive_count_max`` seconds (15 s by default).
    ``retries`` retries transient connect failures (reset, refused, closed during
    the handshake) with exponential backoff starting at ``backoff`` seconds.
    """

    def __init__(
        self,
        options: SshSettings | None = None,
        *,
        connect_timeout: float | None = None,
        retries: int = 2,
        backoff: float = 0.25,
        max_concurrency: int = 64,
        keepalive_interval: float = 5.0,
        keepalive_count_max: int = 3,
    ) -> None:
        opts: SshSettings = options if options is not None else _DefaultSettings()
        self.user = opts.user
        self.port = opts.port
        self.accept_new_host_keys = opts.accept_new_host_keys
        self.connect_timeout = connect_timeout
        self.retries = max(0, retries)
        self.backoff = backoff
        self.max_concurrency = max(1, max_concurrency)
        self.keepalive_interval = keepalive_interval
        self.keepalive_count_max = max(1, keepalive_count_max)
        self._password = opts.password()  # read from the named env var; never logged
        self._config: list[str] | tuple[()] = ()
        if opts.config is not None:
            path = Path(opts.config).expanduser()
            if not path.is_file():
                raise ConfigError(
                    f"ssh config {opts.config!r} not found: expected an OpenSSH client config file",
                    option="--ssh-config",
                )
            self._config = [str(path)]
        self._client_keys: Any = ()
        if opts.key is not None:
            self._client_keys = _load_key(opts.key)
        self._semaphore = asyncio.Semaphore(self.max_concurrency)
        self._conns: dict[tuple[str, str | None, int | None], asyncio.Future[Any]] = {}
        self._policies: dict[tuple[str, ...] | None, KnownHostsPolicy] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._closing = False

    @classmethod
    def from_options(cls, options: SshSettings | None, **kwargs: Any) -> SshTransport:
        """A transport for the CLUSTER options (``transport.options.SshOptions``)."""
        return cls(options, **kwargs)

    def __repr__(self) -> str:
        return (
            f"SshTransport(user={self.user!r}, port={self.port!r}, config={self._config!r}, "
            f"connections={len(self._conns)})"
        )

    async def __aenter__(self) -> SshTransport:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # -- connections ----------------------------------------------------------------

    def _key(self, host: Host) -> tuple[str, str | None, int | None]:
        return (host.name, host.user or self.user, host.port or self.port)

    def _policy(self, files: list[Path] | None) -> KnownHostsPolicy:
        key = None if files is None else tuple(str(f) for f in files)
        policy = self._policies.get(key)
        if policy is None:
            policy = KnownHostsPolicy(files, accept_new=self.accept_new_host_keys)
            self._policies[key] = policy
        return policy

    def _base_kwargs(self, host: Host, target: str) -> dict[str, Any]:
        kwargs: dict[str, Any] = {
            "config": self._config,
            "host": target,
            "keepalive_interval": self.keepalive_interval,
            # asyncssh gives up after count_max + 1 silent intervals, OpenSSH after count_max
            "keepalive_count_max": max(0, self.keepalive_count_max - 1),
            "request_pty": False,
            "send_env": None,
        }
        if self.connect_timeout is not None:
            kwargs["connect_timeout"] = self.connect_timeout
        user = host.user or self.user
        if user:
            kwargs["username"] = user
        port = host.port or self.port
        if port:
            kwargs["port"] = port
        if self._client_keys != ():
            kwargs["client_keys"] = self._client_keys
        if self._password is not None:
            kwargs["password"] = self._password
        return kwargs

    async def _options(self, host: Host, target: str) -> Any:
        try:
            return await asyncssh.SSHClientConnectionOptions.construct(
                **self._base_kwargs(host, target)
            )
        except (ValueError, OSError) as exc:
            raise ConnectError(
                f"invalid SSH settings for {host.name}: {exc}",
                host=host.name,
                cause="bad ssh config",
            ) from exc

    async def _prepare(self, host: Host) -> _Prepared:
        """Resolve ``host`` through the ssh config.

        The SSH target is the host's name (an ssh config alias or a DNS name);
        when the config gives it no HostName but the hostfile gives an explicit
        ``address``, that address is used instead.
        """
        target = host.name
        options = await self._options(host, target)
        if options.config.get("Hostname") is None and host.address not in ("", host.name):
            target = host.address
            options = await self._options(host, target)
        policy = self._policy(known_hosts_files(options.known_hosts))
        where = _Target(host=str(options.host), port=int(options.port), user=options.username)
        timeout = options.connect_timeout
        return _Prepared(
            name=target,
            options=options,
            policy=policy,
            target=where,
            timeout=float(timeout) if timeout else DEFAULT_CONNECT_TIMEOUT,
        )

    async def _open(self, host: Host) -> Any:
        """Connect to ``host`` (bounded retries with backoff for transient errors)."""
        prepared = await self._prepare(host)
        attempt = 0
        while True:
            decision = HostKeyDecision()
            policy = prepared.policy
            client = _Client(policy, decision)
            try:
                async with self._semaphore:
                    conn = await asyncssh.connect(
                        prepared.name,
                        options=prepared.options,
                        known_hosts=policy.known_hosts() if policy.enabled else None,
                        client_factory=functools.partial(_identity, client),
                        connect_timeout=prepared.timeout,
                        config=self._config,  # also for ProxyJump hops
                    )
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if attempt < self.retries and is_transient(exc) and not self._closing:
                    delay = self.backoff * (2**attempt) * (1 + random.random() / 2)
                    log.debug(
                        "%s: transient connect error %r, retry in %.2fs", host.name, exc, delay
                    )
                    attempt += 1
                    await asyncio.sleep(delay)
                    continue
                raise translate_error(
                    exc,
                    host=host.name,
                    target=str(prepared.target),
                    decision=decision,
                    policy=policy,
                    timeout=prepared.timeout,
                ) from exc
            if decision.verdict is HostKeyVerdict.RECORDED:
                log.warning(
                    "%s: recorded new host key %s in %s",
                    host.name,
                    decision.fingerprint,
                    policy.primary,
                )
            return conn

    async def _connection(self, host: Host) -> Any:
        if self._closing:
            raise ConnectError("transport is closed", host=host.name, cause="closed")
        key = self._key(host)
        fut = self._conns.get(key)
        if fut is not None and fut.done() and not self._usable(fut):
            fut = None
        if fut is None:
            fut = asyncio.ensure_future(self._open(host))
            self._conns[key] = fut
        try:
            return await asyncio.shield(fut)
        except TransportError:
            if self._conns.get(key) is fut:
                del self._conns[key]
            raise

    async def connect(self, host: Host) -> None:
        """Open (or reuse) the connection to ``host``; ConnectError names the cause."""
        await self._connection(host)

    @staticmethod
    def _usable(fut: asyncio.Future[Any]) -> bool:
        return not fut.cancelled() and fut.exception() is None and not fut.result().is_closed()

    def connected(self, host: Host) -> bool:
        """Whether a live cached connection to ``host`` exists."""
        fut = self._conns.get(self._key(host))
        return fut is not None and fut.done() and self._usable(fut)

    # -- processes ------------------------------------------------------------------

    async def start(
        self,
        host: Host,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> SshProcess:
        """Start ``argv`` on ``host`` (quoted verbatim) with only ``env`` added, in ``cwd``."""
        return await self._start(host, build_command(argv, env=env, cwd=cwd))

    async def start_shell(
        self,
        host: Host,
        command: str,
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> SshProcess:
        """Start a shell command line on ``host``, interpreted by the host's login shell."""
        return await self._start(host, build_shell_command(command, env=env, cwd=cwd))

    async def _start(self, host: Host, command: str) -> SshProcess:
        conn = await self._connection(host)
        proc = SshProcess(self, host, command)
        factory: Callable[[], _Session] = lambda: _Session(proc)  # noqa: E731
        try:
            chan, _ = await conn.create_session(
                factory, command, encoding=None, request_pty=False, env=None, send_env=None
            )
        except asyncssh.ChannelOpenError as exc:
            raise ConnectError(
                f"the host refused a new session channel: {exc.reason} (sshd MaxSessions?)",
                host=host.name,
                command=command,
                cause="channel refused",
            ) from exc
        except (asyncssh.Error, OSError) as exc:
            raise ConnectionLost(
                f"connection lost while starting the command: {exc}",
                host=host.name,
                command=command,
                cause=_lost_cause(exc),
            ) from exc
        proc._chan = chan
        return proc

    async def run(
        self, host: Host, command: str, *, timeout: float | None = None
    ) -> CompletedCommand:
        """Run a shell command line to completion and collect its output.

        Raises :class:`~corral.errors.CommandTimeout` (after killing it) when it
        takes longer than ``timeout`` seconds.
        """
        proc = await self.start_shell(host, command)
        proc.close_stdin()
        reads = asyncio.gather(proc.stdout.read(), proc.stderr.read())
        try:
            code = await asyncio.wait_for(proc.wait(), timeout)
        except asyncio.TimeoutError as exc:
            await proc.kill()
            reads.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reads
            raise CommandTimeout(
                f"command did not finish within {timeout:g} s (killed)",
                host=host.name,
                command=command,
                cause="timeout",
            ) from exc
        out, err = await reads
        return CompletedCommand(host=host.name, exit_code=code, stdout=out, stderr=err)

    def _background(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task: asyncio.Task[None] = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def close(self) -> None:
        """Close every connection (running channels see EOF / ConnectionLost)."""
        self._closing = True
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=_KILL_GRACE + 1)
            for task in list(self._tasks):
                task.cancel()
        conns = []
        for fut in self._conns.values():
            if not fut.done():
                fut.cancel()
            elif not fut.cancelled() and fut.exception() is None:
                conns.append(fut.result())
        self._conns.clear()
        for conn in conns:
            conn.close()
        for conn in conns:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(conn.wait_closed(), 5.0)


def _identity(client: _Client) -> _Client:
    return client


def _load_key(path: str) -> Any:
    """Load ``--ssh-key`` once (ConfigError naming the option if it is unusable)."""
    file = Path(path).expanduser()
    if not file.is_file():
        raise ConfigError(f"key file {path!r} not found", option="--ssh-key")
    try:
        return asyncssh.load_keypairs([str(file)])
    except (asyncssh.KeyEncryptionError, asyncssh.KeyImportError) as exc:
        if "passphrase" not in str(exc).lower() and not isinstance(
            exc, asyncssh.KeyEncryptionError
        ):
            raise ConfigError(f"cannot load key file {path!r}: {exc}", option="--ssh-key") from exc
        raise ConfigError(
            f"key file {path!r} is passphrase-protected: load it into ssh-agent (ssh-add "
            f"{shlex.quote(path)}) and omit --ssh-key ({exc})",
            option="--ssh-key",
        ) from exc
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot load key file {path!r}: {exc}", option="--ssh-key") from exc
