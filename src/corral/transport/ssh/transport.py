"""SshTransport: run a node's command on a remote host over SSH (asyncssh).

One connection per host per transport, reused for every channel (concurrent
starts to the same host share one connect); at most ``max_concurrency``
connects at once; transient connect failures are retried with exponential
backoff; keepalives declare a silent host lost. Each ``start`` opens a session
channel (no PTY, so stdout and stderr stay separate) running one shell-quoted
command line (:mod:`corral.transport.ssh.command`) and hands back an
:class:`~corral.transport.ssh.process.SshProcess`.

Settings come from the CLUSTER options plus the user's OpenSSH config
(``~/.ssh/config``, or only ``--ssh-config FILE`` when given, like ``ssh -F``):
see :mod:`corral.transport.ssh.config`. ssh-agent is used when
``SSH_AUTH_SOCK`` is set. Host keys are always checked against known_hosts
(:mod:`corral.transport.ssh.known_hosts`), unless the insecure option says
otherwise.

Every asyncssh/OS error is translated (:mod:`corral.transport.ssh.errors`),
with ``raise ... from exc``, into :class:`~corral.errors.ConnectError`,
:class:`~corral.errors.CommandTimeout` or :class:`~corral.errors.ConnectionLost`,
naming the host and the cause.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import random
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncssh

from corral.cluster.model import Host
from corral.defaults import DEFAULT_CONNECT_TIMEOUT
from corral.errors import CommandTimeout, ConnectError, ConnectionLost, TransportError
from corral.transport.ssh.auth import load_key
from corral.transport.ssh.command import build_command, build_shell_command
from corral.transport.ssh.config import (
    Target,
    config_file_name,
    config_paths,
    disabling_settings,
    host_key_files,
    strict_host_key_checking,
)
from corral.transport.ssh.errors import is_transient, lost_cause, translate_error
from corral.transport.ssh.known_hosts import HostKeyDecision, HostKeyVerdict, KnownHostsPolicy
from corral.transport.ssh.process import KILL_GRACE, ProcessSession, SshProcess
from corral.transport.ssh.settings import DefaultSettings, SshSettings

__all__ = ["CompletedCommand", "SshTransport"]

log = logging.getLogger(__name__)


class _Client(asyncssh.SSHClient):
    """Consults the known-hosts policy for keys asyncssh did not already trust."""

    def __init__(self, policy: KnownHostsPolicy, decision: HostKeyDecision) -> None:
        self._policy = policy
        self._decision = decision

    def validate_host_public_key(self, host: str, addr: str, port: int, key: Any) -> bool:
        return self._policy.decide(self._decision, host, addr, port, key)


@dataclass
class _Prepared:
    name: str
    options: Any
    policy: KnownHostsPolicy
    target: Target
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
        opts: SshSettings = options if options is not None else DefaultSettings()
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
        self.insecure_no_host_key_check = opts.insecure_no_host_key_check
        self._config = config_paths(opts.config)
        self._client_keys: Any = ()
        if opts.key is not None:
            self._client_keys = load_key(opts.key)
        self._semaphore = asyncio.Semaphore(self.max_concurrency)
        self._conns: dict[tuple[str, str | None, int | None], asyncio.Future[Any]] = {}
        self._policies: dict[tuple[str, ...] | None, KnownHostsPolicy] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._closing = False
        self._warned: set[str] = set()

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

    async def _host_key_files(self, host: Host, target: str, options: Any) -> list[Path] | None:
        """The known_hosts files for ``host`` (None: unchecked, only when insecure was asked).

        A config that would turn checking off is refused (ConnectError) unless
        accept-new or the insecure option was given.
        """
        if self.insecure_no_host_key_check:
            self._warn_once(host, "host key checking is OFF (--insecure-no-host-key-check)")
            return None
        user = host.user or self.user
        port = host.port or self.port
        read = functools.partial(
            strict_host_key_checking, self._config, target, user=user, port=port
        )
        try:
            strict = await asyncio.get_running_loop().run_in_executor(None, read)
        except (ValueError, OSError) as exc:
            raise ConnectError(
                f"invalid SSH settings for {host.name}: {exc}",
                host=host.name,
                cause="bad ssh config",
            ) from exc
        disabled_by = disabling_settings(options.config.get("UserKnownHostsFile"), strict)
        config_file = config_file_name(self._config)
        files = host_key_files(
            options.known_hosts,
            disabled_by,
            host=host.name,
            config_file=config_file,
            accept_new=self.accept_new_host_keys,
        )
        if disabled_by and files is not None:
            self._warn_once(
                host,
                f"ignoring {' and '.join(disabled_by)} in {config_file}: verifying host keys "
                f"against {files[0]} (--accept-new-host-keys records unknown ones there)",
            )
        return files

    def _warn_once(self, host: Host, message: str) -> None:
        if host.name not in self._warned:
            self._warned.add(host.name)
            log.warning("%s: %s", host.name, message)

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
        policy = self._policy(await self._host_key_files(host, target, options))
        where = Target(host=str(options.host), port=int(options.port), user=options.username)
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
        factory: Callable[[], ProcessSession] = lambda: ProcessSession(proc)  # noqa: E731
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
                cause=lost_cause(exc),
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
            await asyncio.wait(list(self._tasks), timeout=KILL_GRACE + 1)
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
        if conns:  # together: a Ctrl-C waits 5 s at most here, not 5 s a host
            closing = [asyncio.ensure_future(conn.wait_closed()) for conn in conns]
            done, pending = await asyncio.wait(closing, timeout=5.0)
            for task in pending:
                task.cancel()
            for task in done:
                task.exception()  # retrieved: a connection that broke while closing is closed


def _identity(client: _Client) -> _Client:
    return client
