"""The coordinator's replica of a job's checkpoints, and the long-lived senders.

With ``--replicate-checkpoints`` the keeper hands every checkpoint a rank
announces (the SDK's ``{"type": "checkpoint", "path", ...}`` report) to
:meth:`Replica.pull`, so a copy survives the loss of the host that wrote it.
Each host that writes checkpoints keeps one ``hostside.serve`` sender running
(:meth:`Replica.warm`), so a pull waits for the bytes only, not for a new
session. The replica is also a source when a checkpoint is placed, and copies
between hosts are teed into it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import posixpath
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from corral.cluster.model import Host
from corral.contract import checkpoint_files, is_complete_checkpoint
from corral.errors import CorralError
from corral.recovery.checkpoints.common import STALL_TIMEOUT, CheckpointTransferError, step_of
from corral.recovery.checkpoints.transfer import (
    FileSink,
    Guarded,
    HostSource,
    NoTargetLeft,
    Remote,
    pump,
    start_remote,
)
from corral.transport.base import Transport

__all__ = ["PullResult", "Replica"]


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
    _servers: dict[str, Remote] = field(default_factory=dict, init=False, repr=False)
    _starting: dict[str, asyncio.Task[Remote]] = field(default_factory=dict, init=False, repr=False)

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
        step = step_of(name)
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

    def open_sink(self, name: str) -> FileSink:
        """A new file ``name`` in the replica (used to tee a copy into it)."""
        return FileSink(self.directory, name, self._committed)

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
        step = step_of(name)
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

    def _spawn_server(self, transport: Transport, host: Host) -> asyncio.Task[Remote]:
        task = asyncio.ensure_future(start_remote(transport, host, self.python, "serve"))
        self._starting[host.name] = task

        def started(done: asyncio.Task[Remote]) -> None:
            if self._starting.get(host.name) is done:
                del self._starting[host.name]
            if not done.cancelled() and done.exception() is None:
                self._servers[host.name] = done.result()

        task.add_done_callback(started)
        return task

    async def _server(self, transport: Transport, host: Host) -> Remote:
        """``host``'s running sender, started if needed."""
        if self._usable(host):
            return self._servers[host.name]
        task = self._starting.get(host.name) or self._spawn_server(transport, host)
        return await asyncio.shield(task)  # its done-callback records it in _servers

    async def _source(self, want: _Want) -> HostSource:
        """Ask ``want.host``'s sender for the file; a sender that died since its last
        answer (e.g. the connection was reset) is replaced once."""
        for fresh in (False, True):
            server = await self._server(want.transport, want.host)
            try:
                return await HostSource.request(server, want.path, self.stall_timeout)
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
        source: HostSource | None = None
        sink: FileSink | None = None
        try:
            source = await self._source(want)
            sink = self.open_sink(want.name)
            guard = Guarded(sink, "coordinator")
            try:
                await pump(source, [guard], progress, self.stall_timeout)
            except NoTargetLeft:
                assert guard.error is not None
                raise guard.error from None
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


async def _abort_pull(source: HostSource | None, sink: FileSink | None) -> None:
    if sink is not None:
        await sink.abort()
    if source is not None:
        await source.close()
