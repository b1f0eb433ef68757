"""Streaming one checkpoint from a source to one or more targets through the coordinator.

The source is a host (``hostside.send``, or one request to the replica's
long-lived ``hostside.serve``) or a file on the coordinator (a replica file);
each target is a host running ``hostside.receive``, and the coordinator's
replica can be teed in. Credit-based flow control bounds what is in flight to
:data:`~corral.recovery.checkpoints.common.WINDOW` bytes ahead of the slowest
target whatever the file size; the SHA-256 is computed on the way and checked
at both ends; a target writes a hidden temp file that becomes the checkpoint
only once whole (``os.replace``). A target that fails is dropped without
failing the others; a failed copy leaves no partial checkpoint anywhere.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import posixpath
import secrets
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Protocol

from corral.cluster.model import Host
from corral.contract import fsync_dir, is_complete_checkpoint
from corral.errors import TransportError
from corral.recovery.checkpoints.common import (
    HOSTSIDE,
    KILL_GRACE,
    READ_SIZE,
    REPLICA_SOURCE,
    SHIPPED,
    STALL_TIMEOUT,
    WINDOW,
    CheckpointTransferError,
    step_of,
)
from corral.remote.python import start_program
from corral.transport.base import NodeProcess, Transport

__all__ = [
    "CopyResult",
    "FileSink",
    "Guarded",
    "HostSource",
    "NoTargetLeft",
    "Remote",
    "TeeTarget",
    "copy_checkpoint",
    "copy_to_many",
    "pump",
    "start_remote",
]

_TAIL = 4096


class Remote:
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


async def start_remote(
    transport: Transport, host: Host, python: str | None, call: str, *args: Any
) -> Remote:
    """Start ``hostside.<call>`` on ``host`` (its program written to stdin first)."""
    command = f"corral {call} {' '.join(str(a) for a in args[:3])}".rstrip()
    try:
        proc = await start_program(transport, host, python, SHIPPED, f"{HOSTSIDE}:{call}", *args)
    except TransportError as exc:
        raise CheckpointTransferError(
            exc.message, host=host.name, command=command, cause=exc.cause
        ) from exc
    return Remote(host, proc, command)


class Source(Protocol):
    """Where the bytes of a copy come from."""

    label: str
    size: int

    def grant(self, count: int) -> None: ...

    async def read(self, limit: int) -> bytes: ...

    async def trailer(self) -> str | None: ...

    async def close(self) -> None: ...


class Sink(Protocol):
    """Where they go (a host's ``receive``, a replica file)."""

    @property
    def acked(self) -> int: ...

    def check(self) -> None: ...

    async def write(self, data: bytes) -> None: ...

    async def finish(self, sha256: str) -> str: ...

    async def abort(self) -> None: ...


class HostSource:
    """``hostside.send`` on a host, or one request to a long-lived ``hostside.serve``."""

    def __init__(self, remote: Remote, path: str, stall: float, *, served: bool) -> None:
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
    ) -> HostSource:
        """A ``send`` process of its own for ``path``."""
        remote = await start_remote(transport, host, python, "send", path)
        return await cls(remote, path, stall, served=False)._begin()

    @classmethod
    async def request(cls, server: Remote, path: str, stall: float) -> HostSource:
        """Ask a running ``serve`` process for ``path``. The server survives an
        unreadable file; any other failure stops it."""
        server.proc.write(json.dumps({"send": path}).encode() + b"\n")
        return await cls(server, path, stall, served=True)._begin()

    async def _begin(self) -> HostSource:
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
    """``hostside.receive`` on a host; its acknowledgements drive the flow control."""

    def __init__(
        self, remote: Remote, directory: str, name: str, progress: asyncio.Event, stall: float
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
        remote = await start_remote(
            transport,
            host,
            python,
            "receive",
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


class FileSink:
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


class Guarded:
    """A sink whose failure drops it (``error`` says why) instead of failing the copy.

    ``required`` sinks are the targets: a copy goes on while one of them is left.
    The replica teed into a copy is not required (its failure never fails a copy).
    """

    def __init__(self, inner: Sink, label: str, *, required: bool = True) -> None:
        self.inner = inner
        self.label = label
        self.required = required
        self.error: CheckpointTransferError | None = None

    @property
    def dropped(self) -> bool:
        """Whether this sink failed (or was given up)."""
        return self.error is not None

    @property
    def acked(self) -> int:
        """Bytes it has written (dropped: never holds the others back)."""
        return 1 << 62 if self.dropped else self.inner.acked

    async def fail(self, exc: CheckpointTransferError) -> None:
        """Drop the sink: record why and abort it (nothing partial is left)."""
        if self.error is None:
            self.error = exc
            await self.inner.abort()

    async def poll(self) -> None:
        """Drop the sink when it reported a failure."""
        if not self.dropped:
            try:
                self.inner.check()
            except CheckpointTransferError as exc:
                await self.fail(exc)

    async def write(self, data: bytes) -> None:
        """Write unless dropped; a failure drops it."""
        if not self.dropped:
            try:
                await self.inner.write(data)
            except CheckpointTransferError as exc:
                await self.fail(exc)

    async def finish(self, sha256: str) -> str | None:
        """Commit the file; its path, or None when dropped now or before."""
        if self.dropped:
            return None
        try:
            return await self.inner.finish(sha256)
        except CheckpointTransferError as exc:
            await self.fail(exc)
            return None

    async def abort(self) -> None:
        """Give the sink up (idempotent)."""
        await self.inner.abort()


class NoTargetLeft(Exception):
    """Every required sink of a copy failed."""


async def pump(
    source: Source, sinks: Sequence[Guarded], progress: asyncio.Event, stall: float
) -> str:
    """Move ``source.size`` bytes from the source into every sink; returns the SHA-256.

    Raises :class:`CheckpointTransferError` when the source fails (naming it) and
    ``NoTargetLeft`` when every required sink was dropped (each has its ``error``).
    """
    size = source.size
    digest = hashlib.sha256()
    granted = moved = 0
    while moved < size:
        live = await _live(sinks)
        acked = min(s.acked for s in live)
        want = min(size, acked + WINDOW)
        if want > granted:
            source.grant(want - granted)
            granted = want
        if granted <= moved:  # all granted bytes are here: wait for the sinks to catch up
            progress.clear()
            live = await _live(sinks)
            if min(s.acked for s in live) > acked:
                continue
            try:
                await asyncio.wait_for(progress.wait(), stall)
            except asyncio.TimeoutError:
                for slow in live:
                    if slow.acked == acked:
                        await slow.fail(
                            CheckpointTransferError(
                                f"the copy stalled: nothing written for {stall:g} s",
                                host=slow.label,
                            )
                        )
            continue
        data = await source.read(granted - moved)
        digest.update(data)
        for sink in live:
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


async def _live(sinks: Sequence[Guarded]) -> list[Guarded]:
    for sink in sinks:
        await sink.poll()
    live = [s for s in sinks if not s.dropped]
    if not any(s.required for s in live):
        raise NoTargetLeft()
    return live


class TeeTarget(Protocol):
    """What a copy tees into besides its targets (the coordinator's replica)."""

    def has(self, name: str) -> bool:
        """Whether it already holds a complete ``name``."""
        ...

    def open_sink(self, name: str) -> FileSink:
        """A new file ``name`` in it."""
        ...


@dataclass(frozen=True)
class CopyResult:
    """One checkpoint copied to one target."""

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


async def copy_to_many(
    transport: Transport,
    source: Host | Path,
    targets: Sequence[tuple[Host, str | None]],
    *,
    directory: str,
    source_path: str | None = None,
    replica: TeeTarget | None = None,
    python: str | None = None,
    stall_timeout: float = STALL_TIMEOUT,
) -> dict[str, CopyResult | CheckpointTransferError]:
    """Copy one checkpoint into ``directory`` on every target (``(host, cwd)``: the
    directory is resolved against ``cwd`` there), reading the source once.

    ``source`` is a host (then ``source_path`` is the file's absolute path there)
    or a checkpoint file on the coordinator (a replica file). Returns, per target
    name, its :class:`CopyResult` or the :class:`CheckpointTransferError` that
    dropped it (a full disk names the path and says so). Raises
    :class:`CheckpointTransferError` naming the source when reading it fails (then
    no target got the file). Nothing partial is left behind anywhere.
    """
    if isinstance(source, Path):
        name = source.name
    elif source_path:
        name = posixpath.basename(source_path)
    else:
        raise ValueError("copying from a host needs source_path (the file's path there)")
    step = step_of(name)
    progress = asyncio.Event()
    started = time.monotonic()
    src: Source
    if isinstance(source, Host):
        assert source_path is not None
        src = await HostSource.open(transport, source, source_path, python, stall_timeout)
    else:
        src = _FileSource(source)
    outcome: dict[str, CopyResult | CheckpointTransferError] = {}
    guards: list[Guarded] = []
    try:
        opened = await asyncio.gather(
            *(
                _HostSink.open(
                    transport,
                    host,
                    directory,
                    cwd,
                    name,
                    src.size,
                    python,
                    progress,
                    stall_timeout,
                )
                for host, cwd in targets
            ),
            return_exceptions=True,
        )
        for (host, _), sink in zip(targets, opened, strict=True):
            if isinstance(sink, CheckpointTransferError):
                outcome[host.name] = sink
            elif isinstance(sink, BaseException):
                raise sink
            else:
                guards.append(Guarded(sink, host.name))
        hosts = list(guards)
        tee: Guarded | None = None
        if hosts and replica is not None and not replica.has(name):
            with contextlib.suppress(OSError):
                tee = Guarded(replica.open_sink(name), "coordinator", required=False)
        if tee is not None:
            guards.append(tee)
        sha256 = ""
        with contextlib.suppress(NoTargetLeft):
            if hosts:
                sha256 = await pump(src, guards, progress, stall_timeout)
        paths = await asyncio.gather(*(g.finish(sha256) for g in hosts)) if sha256 else []
        teed = await tee.finish(sha256) if tee is not None and sha256 else None
    except BaseException:
        await asyncio.shield(_abort(src, guards))
        raise
    if tee is not None and not sha256:
        await tee.abort()
    await src.close()
    seconds = time.monotonic() - started
    for guard in hosts:
        if guard.error is not None:
            outcome[guard.label] = guard.error
    for guard, path in zip(hosts, paths, strict=False):
        if path is not None:
            outcome[guard.label] = CopyResult(
                name=name,
                step=step,
                size=src.size,
                sha256=sha256,
                seconds=seconds,
                source=src.label,
                target=guard.label,
                target_path=path,
                replicated=Path(teed) if teed else None,
            )
    return {host.name: outcome[host.name] for host, _ in targets}


async def copy_checkpoint(
    transport: Transport,
    source: Host | Path,
    target: Host,
    *,
    directory: str,
    target_cwd: str | None = None,
    source_path: str | None = None,
    replica: TeeTarget | None = None,
    python: str | None = None,
    stall_timeout: float = STALL_TIMEOUT,
) -> CopyResult:
    """Copy one checkpoint into ``directory`` on ``target`` (resolved against ``target_cwd``).

    :func:`copy_to_many` with one target; with ``replica`` the bytes are also
    written into the replica (unless it has that checkpoint already). Raises
    :class:`CheckpointTransferError` naming the host that failed.
    """
    result = await copy_to_many(
        transport,
        source,
        [(target, target_cwd)],
        directory=directory,
        source_path=source_path,
        replica=replica,
        python=python,
        stall_timeout=stall_timeout,
    )
    copied = result[target.name]
    if isinstance(copied, CheckpointTransferError):
        raise copied
    return copied


async def _abort(source: Source, sinks: Sequence[Guarded]) -> None:
    await asyncio.gather(source.close(), *(s.abort() for s in sinks), return_exceptions=True)
