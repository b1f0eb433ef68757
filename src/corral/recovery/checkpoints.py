"""Checkpoints without a shared filesystem: find them, copy them, keep a replica.

When ``--checkpoint-dir`` is host-local, the newest complete checkpoint that
rank 0 wrote lives on one host only. After a failure the restart loop calls
:func:`ensure_latest_on` for the host that will run rank 0: it lists the
checkpoints of every surviving host and of the coordinator's :class:`Replica`,
picks the newest *complete* one (a checkpoint that was being written when the
failure hit is a hidden temp file, or fails the completeness check, and is
never chosen) and copies it to that host unless it is already there.

With ``--replicate-checkpoints`` the supervisor hands every checkpoint a rank
announces (the SDK's ``{"type": "checkpoint", "path", ...}`` report) to
:meth:`Replica.pull`, so a copy survives the loss of the host that wrote it.

Everything on the hosts runs :mod:`corral.recovery.ckpt_host` (standard library
only) through :mod:`corral.remote.python`, over any
:class:`~corral.transport.base.Transport`; on ``local:N`` the same code runs as
local processes (hosts that resolve to the same directory simply find the
checkpoint already there).

A copy streams through the coordinator: the source's ``send`` and the
target's ``receive`` are connected by credit-based flow control, so at most
:data:`WINDOW` bytes are in flight whatever the file size, the SHA-256 is
computed on the way and checked at both ends, and the target writes a hidden
temp file that becomes the checkpoint only once it is whole (``os.replace``).
A failed copy leaves no partial checkpoint anywhere.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import posixpath
import re
import secrets
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Literal, Protocol

from corral.cluster.model import Host
from corral.errors import CorralError, TransportError
from corral.remote.python import program, shell_argv
from corral.sdk._checkpoint import checkpoint_files, fsync_dir, is_complete_checkpoint
from corral.transport.base import NodeProcess, Transport, kill_and_wait

__all__ = [
    "REPLICA_SOURCE",
    "SHIPPED",
    "CheckpointFile",
    "CheckpointPlacement",
    "CheckpointTransferError",
    "CopyResult",
    "HostCheckpoints",
    "PullResult",
    "Replica",
    "copy_checkpoint",
    "ensure_latest_on",
    "survey",
]

#: Modules shipped to the hosts (dependency order).
SHIPPED = (
    "corral.sdk._env",
    "corral.sdk._report",
    "corral.sdk._checkpoint",
    "corral.recovery.ckpt_host",
)
#: Most bytes of one copy in flight between the source, the coordinator and the target.
WINDOW = 8 << 20
READ_SIZE = 1 << 20
SURVEY_TIMEOUT = 30.0
#: A copy during which nothing moves for this long is abandoned.
STALL_TIMEOUT = 60.0
KILL_GRACE = 2.0
#: How :attr:`CheckpointPlacement.source` names the coordinator's replica.
REPLICA_SOURCE = "coordinator replica"

_RANK0_NAME = re.compile(r"ckpt-(\d+)\.pt")
_TAIL = 4096


class CheckpointTransferError(TransportError):
    """A checkpoint could not be listed, read or written on ``host``.

    ``errno_name`` is the host-side error (``"ENOSPC"`` for a full disk) when known.
    """

    def __init__(
        self,
        message: str,
        *,
        host: str,
        command: str | None = None,
        cause: str | None = None,
        errno_name: str | None = None,
    ) -> None:
        super().__init__(message, host=host, command=command, cause=cause)
        self.errno_name = errno_name


# --------------------------------------------------------------------------- survey


@dataclass(frozen=True)
class CheckpointFile:
    """One rank-0 checkpoint file on a host."""

    name: str
    step: int
    size: int
    complete: bool
    mtime: float


@dataclass(frozen=True)
class HostCheckpoints:
    """What one host holds in the checkpoint directory (``error`` when it could not be asked)."""

    host: Host
    directory: str | None = None
    """The directory resolved on the host (absolute)."""
    exists: bool = False
    free: int | None = None
    """Bytes still available there (or in its nearest existing parent)."""
    files: tuple[CheckpointFile, ...] = ()
    """Oldest first; incomplete ones included (``complete`` False)."""
    error: str | None = None

    @property
    def ok(self) -> bool:
        """Whether the host answered."""
        return self.error is None

    @property
    def latest(self) -> CheckpointFile | None:
        """The newest complete checkpoint, or None."""
        complete = [f for f in self.files if f.complete]
        return complete[-1] if complete else None

    def find(self, name: str) -> CheckpointFile | None:
        """The file called ``name``, or None."""
        return next((f for f in self.files if f.name == name), None)

    def path_of(self, name: str) -> str:
        """Absolute path of ``name`` on the host."""
        assert self.directory is not None
        return posixpath.join(self.directory, name)


def _python_argv(
    host: Host, python: str | None, call: str, *args: Any
) -> tuple[list[str], dict[str, str]]:
    argv, var = shell_argv(host.python or python)
    return argv, {**host.env, var: program(SHIPPED, call, *args)}


def _describe_exit(code: int, proc: NodeProcess, stderr: bytes) -> str:
    lost = getattr(proc, "lost", None)
    if isinstance(lost, TransportError):
        return str(lost)
    lines = stderr.decode("utf-8", "replace").strip().splitlines()
    return lines[-1] if lines else f"exit status {code}"


async def _survey_one(
    transport: Transport,
    host: Host,
    directory: str,
    cwd: str | None,
    python: str | None,
    timeout: float,
) -> HostCheckpoints:
    argv, env = _python_argv(
        host, python, "corral.recovery.ckpt_host:list_checkpoints", directory, cwd
    )
    started: list[NodeProcess] = []

    async def ask() -> tuple[int, bytes, bytes, NodeProcess]:
        proc = await transport.start(host, argv, env=env)
        started.append(proc)
        proc.close_stdin()
        out, err = await asyncio.gather(proc.stdout.read(), proc.stderr.read())
        return await proc.wait(), out, err, proc

    try:
        code, out, err, proc = await asyncio.wait_for(ask(), timeout)
    except asyncio.TimeoutError:
        for proc in started:
            await kill_and_wait(proc, KILL_GRACE)
        return HostCheckpoints(host, error=f"no answer within {timeout:g} s")
    except CorralError as exc:
        return HostCheckpoints(host, error=str(exc))
    except asyncio.CancelledError:
        for proc in started:
            await asyncio.shield(kill_and_wait(proc, KILL_GRACE))
        raise
    for line in out.decode("utf-8", "replace").splitlines():
        if line.startswith("{"):
            with contextlib.suppress(ValueError, KeyError, TypeError):
                data = json.loads(line)
                files = tuple(
                    CheckpointFile(
                        name=str(f["name"]),
                        step=int(f["step"]),
                        size=int(f["size"]),
                        complete=bool(f["complete"]),
                        mtime=float(f["mtime"]),
                    )
                    for f in data["files"]
                )
                free = data.get("free")
                return HostCheckpoints(
                    host,
                    directory=str(data["directory"]),
                    exists=bool(data.get("exists")),
                    free=None if free is None else int(free),
                    files=files,
                )
    return HostCheckpoints(
        host, error=f"listing the checkpoints failed: {_describe_exit(code, proc, err)}"
    )


async def survey(
    transport: Transport,
    hosts: Sequence[Host],
    directory: str,
    cwd_of: Callable[[Host], str | None],
    *,
    python: str | None = None,
    timeout: float = SURVEY_TIMEOUT,
) -> dict[str, HostCheckpoints]:
    """List the rank-0 checkpoints of ``directory`` on every host at once.

    ``directory`` is resolved on each host against ``cwd_of(host)`` (the node's
    working directory), as the ranks resolve ``CORRAL_CHECKPOINT_DIR``. A host that
    cannot be asked within ``timeout`` seconds comes back with ``error`` set; this
    never raises for a host.
    """
    results = await asyncio.gather(
        *(_survey_one(transport, h, directory, cwd_of(h), python, timeout) for h in hosts)
    )
    return {r.host.name: r for r in results}


# --------------------------------------------------------------------------- streaming


class _Remote:
    """A helper process on a host, with its stderr tail collected in the background."""

    def __init__(self, host: Host, proc: NodeProcess, command: str) -> None:
        self.host = host
        self.proc = proc
        self.command = command
        self._err = bytearray()
        self.stopped = False
        self._collector = asyncio.ensure_future(self._collect())

    @property
    def alive(self) -> bool:
        """Whether the process may still be running (its stderr is open; not stopped)."""
        return not self.stopped and not self._collector.done()

    async def _collect(self) -> None:
        with contextlib.suppress(Exception):
            while chunk := await self.proc.stderr.read(65536):
                self._err += chunk
                del self._err[:-_TAIL]

    async def why(self) -> str:
        """Why the process ended early: the lost connection, its stderr, or its exit status."""
        try:
            code: int | None = await asyncio.wait_for(self.proc.wait(), KILL_GRACE)
        except (asyncio.TimeoutError, Exception):
            code = None
        with contextlib.suppress(asyncio.TimeoutError, Exception):
            await asyncio.wait_for(asyncio.shield(self._collector), 0.5)
        lost = getattr(self.proc, "lost", None)
        if isinstance(lost, TransportError):
            return lost.cause or lost.message
        lines = bytes(self._err).decode("utf-8", "replace").strip().splitlines()
        if lines:
            return lines[-1]
        return "it ended unexpectedly" if code is None else f"it exited with status {code}"

    async def stop(self) -> None:
        """End the process: EOF first (it cleans up), then SIGTERM, then SIGKILL."""
        self.stopped = True
        with contextlib.suppress(Exception):
            self.proc.close_stdin()
        for signum in (None, signal.SIGTERM, signal.SIGKILL):
            if signum is not None:
                with contextlib.suppress(Exception):
                    self.proc.signal(signum)
            try:
                await asyncio.wait_for(self.proc.wait(), KILL_GRACE)
                break
            except asyncio.TimeoutError:
                continue
            except Exception:
                break
        self._collector.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._collector


async def _start_remote(
    transport: Transport, host: Host, python: str | None, call: str, *args: Any
) -> _Remote:
    argv, env = _python_argv(host, python, call, *args)
    command = f"corral {call.rpartition(':')[2]} {' '.join(str(a) for a in args[:3])}"
    try:
        proc = await transport.start(host, argv, env=env)
    except TransportError as exc:
        raise CheckpointTransferError(
            exc.message, host=host.name, command=command, cause=exc.cause
        ) from exc
    return _Remote(host, proc, command)


class _Source(Protocol):
    label: str
    size: int

    def grant(self, count: int) -> None: ...

    async def read(self, limit: int) -> bytes: ...

    async def trailer(self) -> str | None: ...

    async def close(self) -> None: ...


class _Sink(Protocol):
    @property
    def acked(self) -> int: ...

    def check(self) -> None: ...

    async def write(self, data: bytes) -> None: ...

    async def finish(self, sha256: str) -> str: ...

    async def abort(self) -> None: ...


class _HostSource:
    """``ckpt_host.send`` on a host, or one request to a long-lived ``ckpt_host.serve``."""

    def __init__(self, remote: _Remote, path: str, stall: float, *, served: bool) -> None:
        self.remote = remote
        self.label = remote.host.name
        self.path = path
        self.size = 0
        self.served = served
        self._stall = stall
        self._received = 0
        self._done = False

    @classmethod
    async def open(
        cls, transport: Transport, host: Host, path: str, python: str | None, stall: float
    ) -> _HostSource:
        """A ``send`` process of its own for ``path``."""
        remote = await _start_remote(
            transport, host, python, "corral.recovery.ckpt_host:send", path
        )
        return await cls(remote, path, stall, served=False)._begin()

    @classmethod
    async def request(cls, server: _Remote, path: str, stall: float) -> _HostSource:
        """Ask a running ``serve`` process for ``path``. The server survives an
        unreadable file; any other failure stops it."""
        server.proc.write(json.dumps({"send": path}).encode() + b"\n")
        return await cls(server, path, stall, served=True)._begin()

    async def _begin(self) -> _HostSource:
        try:
            header = await self._line()
            if "error" in header:
                self._done = True  # the server answered and waits for the next request
                raise self._error(str(header["error"]), header.get("errno"))
            self.size = int(header["size"])
        except BaseException:
            await asyncio.shield(self.close())
            raise
        return self

    def _error(self, what: str, errno_name: Any = None) -> CheckpointTransferError:
        return CheckpointTransferError(
            f"cannot read checkpoint {self.path}: {what}",
            host=self.remote.host.name,
            command=self.remote.command,
            errno_name=None if errno_name is None else str(errno_name),
        )

    async def _line(self) -> dict[str, Any]:
        try:
            line = await asyncio.wait_for(self.remote.proc.stdout.readline(), self._stall)
        except asyncio.TimeoutError:
            raise self._error(f"no answer within {self._stall:g} s") from None
        except (ValueError, asyncio.LimitOverrunError):
            raise self._error("unexpected output") from None
        if not line:
            raise self._error(await self.remote.why())
        try:
            data = json.loads(line)
        except ValueError:
            raise self._error(f"unexpected output {line[:80]!r}") from None
        if not isinstance(data, dict):
            raise self._error(f"unexpected output {line[:80]!r}")
        return data

    def grant(self, count: int) -> None:
        self.remote.proc.write(f"{count}\n".encode())

    async def read(self, limit: int) -> bytes:
        want = min(limit, READ_SIZE, self.size - self._received)
        try:
            data = await asyncio.wait_for(self.remote.proc.stdout.read(want), self._stall)
        except asyncio.TimeoutError:
            raise self._error(f"no data for {self._stall:g} s") from None
        if not data:
            raise self._error(
                f"the stream broke after {self._received} of {self.size} bytes "
                f"({await self.remote.why()})"
            )
        self._received += len(data)
        return data

    async def trailer(self) -> str | None:
        data = await self._line()
        self._done = True
        return str(data.get("sha256", ""))

    async def close(self) -> None:
        """End the sender; a server that finished its answer is kept for the next request."""
        if not (self.served and self._done):
            await self.remote.stop()


class _FileSource:
    """A checkpoint file on the coordinator (the replica)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.label = REPLICA_SOURCE
        self._fh: IO[bytes] = open(path, "rb")  # noqa: SIM115 - closed by close()
        self.size = os.fstat(self._fh.fileno()).st_size

    def grant(self, count: int) -> None:
        pass  # a local file is read on demand

    async def read(self, limit: int) -> bytes:
        data = await asyncio.to_thread(self._fh.read, min(limit, READ_SIZE))
        if not data:
            raise CheckpointTransferError(
                f"{self.path} shrank while it was copied", host="coordinator"
            )
        return data

    async def trailer(self) -> str | None:
        return None  # nothing in between to check against

    async def close(self) -> None:
        self._fh.close()


class _HostSink:
    """``ckpt_host.receive`` on a host; its acknowledgements drive the flow control."""

    def __init__(
        self, remote: _Remote, directory: str, name: str, progress: asyncio.Event, stall: float
    ) -> None:
        self.remote = remote
        self.directory = directory
        self.name = name
        self.acked = 0
        self.result: dict[str, Any] | None = None
        self._progress = progress
        self._stall = stall
        self._failure: CheckpointTransferError | None = None
        self._reader = asyncio.ensure_future(self._read())

    @classmethod
    async def open(
        cls,
        transport: Transport,
        host: Host,
        directory: str,
        cwd: str | None,
        name: str,
        size: int,
        python: str | None,
        progress: asyncio.Event,
        stall: float,
    ) -> _HostSink:
        remote = await _start_remote(
            transport,
            host,
            python,
            "corral.recovery.ckpt_host:receive",
            directory,
            cwd,
            name,
            size,
            None,
        )
        return cls(remote, directory, name, progress, stall)

    def _fail(self, what: str, errno_name: Any = None) -> CheckpointTransferError:
        return CheckpointTransferError(
            what,
            host=self.remote.host.name,
            command=self.remote.command,
            errno_name=None if errno_name is None else str(errno_name),
        )

    async def _read(self) -> None:
        stdout = self.remote.proc.stdout
        try:
            while line := await stdout.readline():
                with contextlib.suppress(ValueError, TypeError):
                    msg = json.loads(line)
                    if not isinstance(msg, dict):
                        continue
                    if "ack" in msg:
                        self.acked = int(msg["ack"])
                    elif "ok" in msg:
                        self.result = msg
                        if not msg["ok"]:
                            self._failure = self._fail(str(msg.get("error")), msg.get("errno"))
                    self._progress.set()
        except (ValueError, asyncio.LimitOverrunError, ConnectionError):
            pass
        if self.result is None and self._failure is None:
            why = await self.remote.why()
            self._failure = self._fail(
                f"writing {self.name} into {self.directory} broke off ({why})"
            )
        self._progress.set()

    def check(self) -> None:
        if self._failure is not None:
            raise self._failure

    async def write(self, data: bytes) -> None:
        self.check()
        self.remote.proc.write(data)

    async def finish(self, sha256: str) -> str:
        self.check()
        self.remote.proc.write((json.dumps({"sha256": sha256}) + "\n").encode())
        self.remote.proc.close_stdin()
        try:
            # the host fsyncs the whole file now: allow it the stall time again
            await asyncio.wait_for(asyncio.shield(self._reader), self._stall)
        except asyncio.TimeoutError:
            raise self._fail(f"no confirmation within {self._stall:g} s") from None
        self.check()
        assert self.result is not None
        await self.remote.stop()
        return str(self.result.get("path"))

    async def abort(self) -> None:
        await self.remote.stop()  # EOF before the end: the host removes its temp file
        self._reader.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._reader


class _FileSink:
    """A new checkpoint file in a local directory (the replica): temp file, then rename."""

    def __init__(self, directory: Path, name: str, on_commit: Callable[[Path], None]) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.final = directory / name
        self.tmp = directory / f".{name}.tmp-{os.getpid()}-{secrets.token_hex(4)}"
        self._fh: IO[bytes] | None = open(self.tmp, "xb")  # noqa: SIM115 - closed in finish/abort
        self._on_commit = on_commit
        self.acked = 0

    def check(self) -> None:
        pass

    async def write(self, data: bytes) -> None:
        assert self._fh is not None
        try:
            await asyncio.to_thread(self._fh.write, data)
        except OSError as exc:
            raise CheckpointTransferError(
                f"cannot write {self.final}: {exc.strerror or exc}", host="coordinator"
            ) from exc
        self.acked += len(data)

    def _sync_and_rename(self) -> None:
        assert self._fh is not None
        self._fh.flush()
        os.fsync(self._fh.fileno())
        self._fh.close()
        self._fh = None
        if not is_complete_checkpoint(self.tmp):
            raise ValueError("the copy is not a complete checkpoint")
        os.replace(self.tmp, self.final)
        fsync_dir(self.final.parent)

    async def finish(self, sha256: str) -> str:
        try:
            await asyncio.to_thread(self._sync_and_rename)
        except (OSError, ValueError) as exc:
            await self.abort()
            raise CheckpointTransferError(
                f"cannot write {self.final}: {exc}", host="coordinator"
            ) from exc
        self._on_commit(self.final)
        return str(self.final)

    async def abort(self) -> None:
        if self._fh is not None:
            with contextlib.suppress(OSError):
                self._fh.close()
            self._fh = None
        with contextlib.suppress(OSError):
            self.tmp.unlink()


async def _pump(
    source: _Source, sinks: Sequence[_Sink], progress: asyncio.Event, stall: float
) -> str:
    """Move ``source.size`` bytes from the source into every sink; returns the SHA-256."""
    size = source.size
    digest = hashlib.sha256()
    granted = moved = 0
    while moved < size:
        for sink in sinks:
            sink.check()
        acked = min((s.acked for s in sinks), default=moved)
        want = min(size, acked + WINDOW)
        if want > granted:
            source.grant(want - granted)
            granted = want
        if granted <= moved:  # all granted bytes are here: wait for the sinks to catch up
            progress.clear()
            for sink in sinks:
                sink.check()
            if min(s.acked for s in sinks) > acked:
                continue
            try:
                await asyncio.wait_for(progress.wait(), stall)
            except asyncio.TimeoutError:
                slow = next(s for s in sinks if s.acked == acked)
                host = slow.remote.host.name if isinstance(slow, _HostSink) else "coordinator"
                raise CheckpointTransferError(
                    f"the copy stalled: nothing written for {stall:g} s", host=host
                ) from None
            continue
        data = await source.read(granted - moved)
        digest.update(data)
        for sink in sinks:
            await sink.write(data)
        moved += len(data)
    sha256 = digest.hexdigest()
    theirs = await source.trailer()
    if theirs is not None and theirs != sha256:
        raise CheckpointTransferError(
            f"checksum mismatch reading the checkpoint (sent {theirs}, received {sha256})",
            host=source.label,
        )
    return sha256


class _Tee:
    """A best-effort extra sink (the replica during a copy): its failure never fails the copy."""

    def __init__(self, inner: _FileSink) -> None:
        self.inner = inner
        self.dropped = False

    @property
    def acked(self) -> int:
        return 1 << 62 if self.dropped else self.inner.acked

    def check(self) -> None:
        pass

    async def write(self, data: bytes) -> None:
        if self.dropped:
            return
        try:
            await self.inner.write(data)
        except CheckpointTransferError:
            await self.abort()

    async def finish(self, sha256: str) -> str:
        if self.dropped:
            return ""
        try:
            return await self.inner.finish(sha256)
        except CheckpointTransferError:
            self.dropped = True
            return ""

    async def abort(self) -> None:
        self.dropped = True
        await self.inner.abort()


@dataclass(frozen=True)
class CopyResult:
    """One checkpoint copied."""

    name: str
    step: int
    size: int
    sha256: str
    seconds: float
    source: str
    """The source host's name, or :data:`REPLICA_SOURCE`."""
    target: str
    target_path: str
    """Absolute path on the target host."""
    replicated: Path | None = None
    """The coordinator replica's new copy, when the copy was teed into it."""


def _step_of(name: str) -> int:
    m = _RANK0_NAME.fullmatch(name)
    if m is None:
        raise ValueError(f"not a rank-0 checkpoint name: {name!r} (expected ckpt-NNNNNNNN.pt)")
    return int(m.group(1))


async def copy_checkpoint(
    transport: Transport,
    source: Host | Path,
    target: Host,
    *,
    directory: str,
    target_cwd: str | None = None,
    source_path: str | None = None,
    replica: Replica | None = None,
    python: str | None = None,
    stall_timeout: float = STALL_TIMEOUT,
) -> CopyResult:
    """Copy one checkpoint into ``directory`` on ``target`` (resolved against ``target_cwd``).

    ``source`` is a host (then ``source_path`` is the file's absolute path there)
    or a checkpoint file on the coordinator (a replica file). The bytes stream
    through the coordinator with bounded memory; with ``replica`` they are also
    written into the replica (unless it has that checkpoint already). Raises
    :class:`CheckpointTransferError` naming the host that failed (a full disk on
    the target names the path and says so); nothing partial is left behind.
    """
    name = posixpath.basename(source_path) if isinstance(source, Host) and source_path else ""
    if isinstance(source, Path):
        name = source.name
    elif not source_path:
        raise ValueError("copying from a host needs source_path (the file's path there)")
    step = _step_of(name)
    progress = asyncio.Event()
    started = time.monotonic()
    src: _Source
    if isinstance(source, Host):
        assert source_path is not None
        src = await _HostSource.open(transport, source, source_path, python, stall_timeout)
    else:
        src = _FileSource(source)
    sinks: list[_Sink] = []
    try:
        sink = await _HostSink.open(
            transport,
            target,
            directory,
            target_cwd,
            name,
            src.size,
            python,
            progress,
            stall_timeout,
        )
        sinks.append(sink)
        tee: _Tee | None = None
        if replica is not None and not replica.has(name):
            with contextlib.suppress(OSError):
                tee = _Tee(replica._sink(name))
        if tee is not None:
            sinks.append(tee)
        sha256 = await _pump(src, sinks, progress, stall_timeout)
        target_path = await sink.finish(sha256)
        teed = await tee.finish(sha256) if tee is not None else ""
        replicated = Path(teed) if teed else None
    except BaseException:
        await asyncio.shield(_abort(src, sinks))
        raise
    await src.close()
    return CopyResult(
        name=name,
        step=step,
        size=src.size,
        sha256=sha256,
        seconds=time.monotonic() - started,
        source=src.label,
        target=target.name,
        target_path=target_path,
        replicated=replicated,
    )


async def _abort(source: _Source, sinks: Sequence[_Sink]) -> None:
    await asyncio.gather(source.close(), *(s.abort() for s in sinks), return_exceptions=True)


# --------------------------------------------------------------------------- placement


@dataclass(frozen=True)
class CheckpointPlacement:
    """What :func:`ensure_latest_on` did, for the job summary.

    ``action``: ``"none"`` (no complete checkpoint anywhere: the job starts from
    scratch), ``"present"`` (the target already had the newest one) or
    ``"copied"``.
    """

    action: Literal["none", "present", "copied"]
    target: str
    step: int | None = None
    name: str | None = None
    source: str | None = None
    """Host it came from, :data:`REPLICA_SOURCE`, or the target itself when present."""
    path: str | None = None
    """Absolute path on the target."""
    bytes: int = 0
    seconds: float = 0.0
    unreachable: tuple[str, ...] = ()
    """Hosts whose checkpoints could not be listed (``name: why``)."""
    failed: tuple[str, ...] = ()
    """Copies that were tried first and failed (``source: why``)."""

    def describe(self) -> str:
        """One line for the run summary."""
        if self.action == "none":
            return "no complete checkpoint on any host or in the replica: starting from scratch"
        if self.action == "present":
            return f"checkpoint {self.name} (step {self.step}) already on {self.target}"
        mb = self.bytes / 1e6
        return (
            f"copied checkpoint {self.name} (step {self.step}, {mb:.1f} MB) from {self.source} "
            f"to {self.target}:{self.path} in {self.seconds:.1f} s"
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "action": self.action,
            "target": self.target,
            "step": self.step,
            "name": self.name,
            "source": self.source,
            "path": self.path,
            "bytes": self.bytes,
            "seconds": round(self.seconds, 3),
            "unreachable": list(self.unreachable),
            "failed": list(self.failed),
        }


@dataclass(frozen=True)
class _Candidate:
    step: int
    name: str
    size: int
    host: HostCheckpoints | None = None
    replica_file: Path | None = None


async def ensure_latest_on(
    transport: Transport,
    target: Host,
    survivors: Sequence[Host],
    directory: str,
    cwd_of: Callable[[Host], str | None],
    replica: Replica | None = None,
    *,
    python: str | None = None,
    survey_timeout: float = SURVEY_TIMEOUT,
    stall_timeout: float = STALL_TIMEOUT,
) -> CheckpointPlacement:
    """Make sure the newest complete checkpoint is in ``directory`` on ``target``.

    Looks at ``target``, every host in ``survivors`` (unreachable ones are skipped
    and listed in the result) and the coordinator ``replica``; picks the highest
    step among *complete* rank-0 checkpoints (temp files and damaged files are
    never candidates). Does nothing when the target already holds that file
    (same name, complete, same size); else copies it from a survivor that has
    it, falling back to the next one and then to the replica when a copy fails.
    A copy is teed into ``replica`` when that lacks it.

    Raises :class:`CheckpointTransferError` when the target cannot be listed,
    lacks the space (naming host and path), or every copy failed.
    """
    hosts: list[Host] = [target]
    for host in survivors:
        if all(host.name != h.name for h in hosts):
            hosts.append(host)
    listed = await survey(
        transport, hosts, directory, cwd_of, python=python, timeout=survey_timeout
    )
    mine = listed[target.name]
    if not mine.ok:
        raise CheckpointTransferError(
            f"cannot list the checkpoints in {directory}: {mine.error}", host=target.name
        )
    unreachable = tuple(f"{n}: {r.error}" for n, r in listed.items() if not r.ok)
    candidates: list[_Candidate] = []
    for result in listed.values():
        newest = result.latest
        if newest is not None:
            candidates.append(_Candidate(newest.step, newest.name, newest.size, host=result))
    replica_latest = replica.latest() if replica is not None else None
    if replica_latest is not None:
        size = replica_latest.stat().st_size
        candidates.append(
            _Candidate(
                _step_of(replica_latest.name),
                replica_latest.name,
                size,
                replica_file=replica_latest,
            )
        )
    if not candidates:
        return CheckpointPlacement("none", target.name, unreachable=unreachable)
    best = max(c.step for c in candidates)
    chosen = [c for c in candidates if c.step == best]
    have = mine.find(chosen[0].name)
    others = [c for c in chosen if c.host is None or c.host.host.name != target.name]
    if (
        have is not None
        and have.complete
        and (not others or any(have.size == c.size for c in others))
    ):
        return CheckpointPlacement(
            "present",
            target.name,
            step=best,
            name=have.name,
            source=target.name,
            path=mine.path_of(have.name),
            bytes=have.size,
            unreachable=unreachable,
        )
    chosen = others
    size = chosen[0].size
    if mine.free is not None and mine.free < size:
        raise CheckpointTransferError(
            f"cannot write {mine.path_of(chosen[0].name)}: no space left on device "
            f"({size} bytes needed, {mine.free} bytes free)",
            host=target.name,
            errno_name="ENOSPC",
        )
    # host-to-host first (the replica may be older or absent); the replica last
    ordered = [c for c in chosen if c.host is not None] + [c for c in chosen if c.host is None]
    failed: list[str] = []
    error: CheckpointTransferError | None = None
    for candidate in ordered:
        try:
            if candidate.host is not None:
                copied = await copy_checkpoint(
                    transport,
                    candidate.host.host,
                    target,
                    directory=directory,
                    target_cwd=cwd_of(target),
                    source_path=candidate.host.path_of(candidate.name),
                    replica=replica,
                    python=python,
                    stall_timeout=stall_timeout,
                )
            else:
                assert candidate.replica_file is not None
                copied = await copy_checkpoint(
                    transport,
                    candidate.replica_file,
                    target,
                    directory=directory,
                    target_cwd=cwd_of(target),
                    python=python,
                    stall_timeout=stall_timeout,
                )
        except CheckpointTransferError as exc:
            if exc.host == target.name and exc.errno_name in ("ENOSPC", "EDQUOT"):
                raise  # another source will not make room
            label = candidate.host.host.name if candidate.host is not None else REPLICA_SOURCE
            failed.append(f"{label}: {exc}")
            error = exc
            continue
        return CheckpointPlacement(
            "copied",
            target.name,
            step=copied.step,
            name=copied.name,
            source=copied.source,
            path=copied.target_path,
            bytes=copied.size,
            seconds=copied.seconds,
            unreachable=unreachable,
            failed=tuple(failed),
        )
    assert error is not None
    raise CheckpointTransferError(
        f"could not copy checkpoint {chosen[0].name} (step {best}) to {target.name}: "
        + "; ".join(failed),
        host=target.name,
        errno_name=error.errno_name,
    ) from error


# --------------------------------------------------------------------------- replica


@dataclass(frozen=True)
class PullResult:
    """What one :meth:`Replica.pull` call did.

    ``status``: ``"pulled"`` (``path`` is the new replica file), ``"queued"`` (a
    pull is running; it takes this checkpoint next unless a newer one comes),
    ``"skipped"`` (the replica already has this step or a newer one, or one is
    on its way) or ``"failed"`` (``error`` says why; nothing partial is left).
    """

    status: Literal["pulled", "queued", "skipped", "failed"]
    host: str
    name: str
    step: int
    path: Path | None = None
    bytes: int = 0
    seconds: float = 0.0
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "status": self.status,
            "host": self.host,
            "name": self.name,
            "step": self.step,
            "path": None if self.path is None else str(self.path),
            "bytes": self.bytes,
            "seconds": round(self.seconds, 3),
            "error": self.error,
        }


@dataclass
class _Want:
    transport: Transport
    host: Host
    path: str
    name: str
    step: int


@dataclass(eq=False)
class Replica:
    """The coordinator's copy of the newest checkpoints (``runs/<job>/checkpoints/``).

    Keeps the newest ``keep`` complete checkpoints. :meth:`pull` is called for
    every announced checkpoint; pulls never overlap: an announcement that
    arrives during a pull only replaces the queued one, so only the newest is
    pulled next. A pull writes a hidden temp file that is renamed once whole and
    verified, so a failed pull (host lost mid-copy) leaves nothing.
    ``on_result`` is called with the :class:`PullResult` of every pull performed.
    """

    directory: Path
    keep: int = 2
    python: str | None = None
    stall_timeout: float = STALL_TIMEOUT
    on_result: Callable[[PullResult], None] | None = None
    last_failure: PullResult | None = field(default=None, init=False)
    """The most recent pull that failed."""
    _wanted: _Want | None = field(default=None, init=False, repr=False)
    _current: _Want | None = field(default=None, init=False, repr=False)
    _idle: asyncio.Event = field(default_factory=asyncio.Event, init=False, repr=False)
    _servers: dict[str, _Remote] = field(default_factory=dict, init=False, repr=False)
    _starting: dict[str, asyncio.Task[_Remote]] = field(
        default_factory=dict, init=False, repr=False
    )

    def __post_init__(self) -> None:
        if self.keep < 1:
            raise ValueError(f"keep must be >= 1, got {self.keep}")
        self.directory = Path(self.directory)
        self._idle.set()
        for leftover in self.directory.glob(".ckpt-*.pt.tmp-*"):
            with contextlib.suppress(OSError):
                leftover.unlink()  # from a coordinator that died mid-pull

    @classmethod
    def for_job(cls, run_dir: str | os.PathLike[str], job_id: str, **kwargs: Any) -> Replica:
        """The replica of job ``job_id``: ``RUN_DIR/JOB_ID/checkpoints``."""
        return cls(Path(run_dir) / job_id / "checkpoints", **kwargs)

    def checkpoints(self) -> list[Path]:
        """The complete checkpoints held, oldest first."""
        return [p for _, p in checkpoint_files(self.directory) if is_complete_checkpoint(p)]

    def latest(self) -> Path | None:
        """The newest complete checkpoint held, or None."""
        held = self.checkpoints()
        return held[-1] if held else None

    def has(self, name: str) -> bool:
        """Whether a complete checkpoint ``name`` is held."""
        path = self.directory / name
        return path.is_file() and is_complete_checkpoint(path)

    async def confirm(self, name: str) -> tuple[bool, str | None]:
        """Once no pull is running: whether the replica holds checkpoint ``name``
        (or a newer one), else why not (the error of its failed pull)."""
        await self.wait_idle()
        step = _step_of(name)
        if self._claimed() >= step:  # idle: only what is held counts
            return True, None
        failed = self.last_failure
        if failed is not None and failed.step >= step and failed.error:
            return False, failed.error
        return False, "it was not copied (the replica holds an older checkpoint)"

    @property
    def busy(self) -> bool:
        """Whether a pull is running."""
        return not self._idle.is_set()

    async def wait_idle(self) -> None:
        """Wait until no pull is running (nor queued)."""
        await self._idle.wait()

    def _sink(self, name: str) -> _FileSink:
        """A new file ``name`` in the replica (used to tee a copy into it)."""
        return _FileSink(self.directory, name, self._committed)

    def _committed(self, path: Path) -> None:
        held = self.checkpoints()
        for old in held[: max(0, len(held) - self.keep)]:
            with contextlib.suppress(OSError):
                old.unlink()

    def _claimed(self) -> int:
        steps = [s for s, p in checkpoint_files(self.directory) if is_complete_checkpoint(p)]
        steps += [w.step for w in (self._current, self._wanted) if w is not None]
        return max(steps, default=-1)

    async def pull(self, transport: Transport, host: Host, path_on_host: str) -> PullResult:
        """Copy the checkpoint at ``path_on_host`` (absolute, on ``host``) into the replica.

        Returns at once with ``"skipped"`` when it holds this step or a newer one
        (or one is on its way) and ``"queued"`` while another pull runs (this one
        is then pulled next, unless a newer announcement replaces it). Otherwise
        pulls, and goes on with whatever got queued meanwhile; the result is that
        of the last pull it made. Never raises for a failed copy (``"failed"``).
        """
        name = posixpath.basename(path_on_host)
        step = _step_of(name)
        if step <= self._claimed():
            return PullResult("skipped", host.name, name, step)
        self._wanted = _Want(transport, host, path_on_host, name, step)
        if self.busy:
            return PullResult("queued", host.name, name, step)
        self._idle.clear()
        result = PullResult("skipped", host.name, name, step)
        try:
            while self._wanted is not None:
                want, self._wanted = self._wanted, None
                self._current = want
                result = await self._pull_one(want)
                self._current = None
                if result.status == "failed":
                    self.last_failure = result
                if self.on_result is not None:
                    self.on_result(result)
        finally:
            self._current = None
            self._wanted = None
            self._idle.set()
        return result

    def warm(self, transport: Transport, host: Host) -> None:
        """Start ``host``'s sender now (in the background), so the first pull after
        a save does not wait for a new session (SSH login, interpreter start)."""
        if not self._usable(host) and host.name not in self._starting:
            self._spawn_server(transport, host)

    def _usable(self, host: Host) -> bool:
        server = self._servers.get(host.name)
        return server is not None and server.alive

    def _spawn_server(self, transport: Transport, host: Host) -> asyncio.Task[_Remote]:
        task = asyncio.ensure_future(
            _start_remote(transport, host, self.python, "corral.recovery.ckpt_host:serve")
        )
        self._starting[host.name] = task

        def started(done: asyncio.Task[_Remote]) -> None:
            if self._starting.get(host.name) is done:
                del self._starting[host.name]
            if not done.cancelled() and done.exception() is None:
                self._servers[host.name] = done.result()

        task.add_done_callback(started)
        return task

    async def _server(self, transport: Transport, host: Host) -> _Remote:
        """``host``'s running sender, started if needed."""
        if self._usable(host):
            return self._servers[host.name]
        task = self._starting.get(host.name) or self._spawn_server(transport, host)
        return await asyncio.shield(task)  # its done-callback records it in _servers

    async def _source(self, want: _Want) -> _HostSource:
        """Ask ``want.host``'s sender for the file; a sender that died since its last
        answer (e.g. the connection was reset) is replaced once."""
        for fresh in (False, True):
            server = await self._server(want.transport, want.host)
            try:
                return await _HostSource.request(server, want.path, self.stall_timeout)
            except CheckpointTransferError:
                if fresh or not server.stopped:
                    raise  # a fresh sender failed too, or the file itself is unreadable
        raise AssertionError("unreachable")

    async def close(self) -> None:
        """Stop the senders (they exit at end of input)."""
        for task in list(self._starting.values()):
            task.cancel()
        servers = list(self._servers.values())
        self._servers.clear()
        await asyncio.gather(*(s.stop() for s in servers), return_exceptions=True)

    async def _pull_one(self, want: _Want) -> PullResult:
        started = time.monotonic()
        progress = asyncio.Event()
        source: _HostSource | None = None
        sink: _FileSink | None = None
        try:
            source = await self._source(want)
            sink = self._sink(want.name)
            await _pump(source, [sink], progress, self.stall_timeout)
            final = Path(await sink.finish(""))
            size = source.size
        except (CorralError, OSError) as exc:
            await asyncio.shield(_abort_pull(source, sink))
            error = str(exc)
            if isinstance(exc, OSError):  # the coordinator's side
                what = exc.strerror or type(exc).__name__
                error = f"cannot write {want.name} into {self.directory} here: {what}"
            return PullResult("failed", want.host.name, want.name, want.step, error=error)
        except BaseException:
            await asyncio.shield(_abort_pull(source, sink))
            raise
        await source.close()
        return PullResult(
            "pulled",
            want.host.name,
            want.name,
            want.step,
            path=final,
            bytes=size,
            seconds=time.monotonic() - started,
        )


async def _abort_pull(source: _HostSource | None, sink: _FileSink | None) -> None:
    if sink is not None:
        await sink.abort()
    if source is not None:
        await source.close()
