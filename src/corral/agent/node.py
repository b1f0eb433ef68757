"""NodeAgent: runs one node's processes and reports on them.

Lifecycle of the agent (one direction only)::

    STARTING -> RUNNING -> STOPPING -> DONE

RUNNING ends when every workload process has exited (the agent then cleans
up whatever they left behind) or when a teardown is requested: a ``stop`` /
``kill`` op, EOF on stdin (the coordinator or its SSH channel is gone),
missed heartbeats, or a failed rank on this node.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from corral.agent import procs
from corral.agent.control import ControlServer
from corral.agent.protocol import (
    EVENT,
    NODE,
    STDERR,
    STDOUT,
    Complaints,
    Framer,
    decode_op,
    encode_event,
    encode_frame,
    frame_payload,
)
from corral.agent.spawn import STOP_SIGNALS, SpawnedNode, Workload, record_pgid
from corral.agent.worker import error_file
from corral.contract import ATTEMPT_ENV
from corral.defaults import DEFAULT_GRACE
from corral.logflush import FlushSoon
from corral.private import append_private, write_private

CHUNK = 1 << 16
CONTROL_DRAIN = 2.0  # seconds the ranks' last control messages may take to be read
DRAIN_WINDOW = 2.0
_TORCHRUN_EXIT = re.compile(rb"exitcode\s*:\s*(-?\d+)\s*\(pid:\s*(\d+)\)")


def _status_to_code(status: int) -> int:
    if os.WIFSIGNALED(status):
        return -os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


@dataclass
class RankTrack:
    """What the agent knows about one rank process."""

    rank: int
    local_rank: int = 0
    pid: int | None = None
    code: int | None = None
    open_streams: int = 0
    eof_time: float | None = None
    reported: bool = False
    log: IO[bytes] | None = None


class NodeAgent:
    """Supervises the processes of one node described by a start message."""

    def __init__(self, start: dict[str, Any], out: IO[bytes], spawned: SpawnedNode) -> None:
        node = start["node"]
        self.node = node
        self.grace: float = float(start.get("grace", DEFAULT_GRACE))
        self.heartbeat_timeout: float | None = start.get("heartbeat_timeout")
        self.heartbeat_interval: float = float(start.get("heartbeat_interval", 2.0))
        self.master_timeout: float = float(start.get("master_timeout", 300.0))
        self.stack_timeout = 10.0
        self.out = out
        self.spawned = spawned
        self.env = spawned.env
        self.node_dir = spawned.node_dir
        # what spawn_node started is known at once: a SIGCHLD may come any time
        self.workloads: dict[int, Workload] = {w.pid: w for w in spawned.workloads}
        self.ranks: dict[int, RankTrack] = {
            w.rank: RankTrack(rank=w.rank, local_rank=w.local_rank, pid=w.pid)
            for w in spawned.workloads
            if w.rank != NODE
        }
        self.pgids = spawned.pgids
        self.reaped: dict[int, int] = {}
        self.stopping = False
        self._sent: dict[int, float] = {}  # signal -> when the teardown first sent it
        self.done = asyncio.Event()
        self.last_heartbeat = time.monotonic()
        self.node_log = spawned.node_log
        self._loop: asyncio.AbstractEventLoop | None = None
        self._teardown_task: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._control = (
            ControlServer(self._on_control, limit=CHUNK * 8, bound=spawned.control)
            if spawned.control is not None
            else None
        )
        # Each rank's SDK connection, for the coordinator's replies ("reply" op).
        self._control_writers: dict[int, asyncio.StreamWriter] = {}
        self._broken_logs: set[int] = set()
        # host-side logs reach the disk within a moment of a line (tail -f while it runs)
        self._soon = FlushSoon(on_error=self._log_flush_failed)
        self._complaints = Complaints()
        # each rank's last GPU sample (corral.agent.gpusample), sent with its next report
        self.gpu: dict[int, dict[str, Any]] = {}

    # -- output ---------------------------------------------------------------------

    def emit(self, frame: bytes) -> None:
        """Write one frame to the coordinator (ignored once the pipe is gone)."""
        try:
            self.out.write(frame)
            self.out.flush()
        except (BrokenPipeError, OSError, ValueError):
            pass

    def event(self, name: str, **fields: Any) -> None:
        """Emit a JSON event frame."""
        self.emit(encode_event({"event": name, "time": time.time(), **fields}))

    def _rank_log(self, rank: int) -> IO[bytes] | None:
        if rank == NODE:
            return self.node_log
        track = self.ranks.get(rank)
        if track is None:
            track = self.ranks[rank] = RankTrack(rank=rank)
        if track.log is None:
            track.log = append_private(self.node_dir / "logs" / f"rank-{rank}.log")
        return track.log

    def forward(self, kind: bytes, rank: int, data: bytes) -> None:
        """Send a :class:`Framer` chunk of ``rank`` to the coordinator and the host-side log.

        A host-side log that cannot be written (disk full) is given up on; the
        lines still go to the coordinator, so the rank never blocks on its output.
        """
        self.emit(encode_frame(kind, rank, frame_payload(data)))
        if rank in self._broken_logs:
            return
        try:
            log = self._rank_log(rank)
            if log is not None:
                log.write(data)
                self._soon.wrote(log)
        except OSError as exc:
            self._disable_log(rank, exc)

    def _disable_log(self, rank: int, exc: OSError) -> None:
        self._broken_logs.add(rank)
        self.emit(
            encode_frame(
                STDERR,
                NODE,
                f"corral agent: host-side log of rank {rank} disabled: {exc}\n".encode(),
            )
        )

    def _log_flush_failed(self, handle: IO[bytes], exc: OSError) -> None:
        """A deferred flush failed (disk full): give that log up as a failed write does."""
        if handle is self.node_log:
            rank = NODE
        else:
            rank = next((t.rank for t in self.ranks.values() if t.log is handle), NODE)
        if rank not in self._broken_logs:
            self._disable_log(rank, exc)

    def _spawn(self, coro: Any) -> asyncio.Task[Any]:
        task: asyncio.Task[Any] = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _pump(
        self,
        reader: asyncio.StreamReader,
        kind: bytes,
        rank_of: Callable[[], int],
        on_line: Callable[[bytes], None] | None = None,
    ) -> None:
        """Forward a byte stream as frames until EOF, cut by a :class:`Framer`
        (whole lines, plus ``\\r`` progress output at most every 0.2 s)."""
        framer = Framer()

        def send(data: bytes) -> None:
            if data:
                self.forward(kind, rank_of(), data)
                if on_line is not None:
                    for line in data.splitlines():
                        on_line(line)

        while True:
            due = framer.due()
            if due is None:
                chunk = await reader.read(CHUNK)
            else:
                try:
                    chunk = await asyncio.wait_for(reader.read(CHUNK), due - time.monotonic())
                except asyncio.TimeoutError:
                    send(framer.poll())
                    continue
            if not chunk:
                break
            send(framer.feed(chunk))
        send(framer.close())

    # -- process tracking ------------------------------------------------------------

    def _record_pgid(self, pid: int) -> None:
        record_pgid(self.pgids, self.node_dir, pid)

    def _descendants(self) -> list[int]:
        """The pids of the agent's descendants (:mod:`corral.agent.procs`: its own
        subtree, not every process of the host)."""
        return procs.descendants()

    def _reap(self) -> None:
        """Collect exit statuses of children and adopted orphans."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            code = _status_to_code(status)
            self.reaped[pid] = code
            work = self.workloads.get(pid)
            if work is not None:
                work.code = code
                work.exit_time = time.time()
                work.popen.returncode = code
                self._workload_progress(work)
            for track in self.ranks.values():
                if track.pid == pid and track.code is None:
                    track.code = code

    # -- starting --------------------------------------------------------------------

    async def _attach_pipe(self, work: Workload, fd: IO[bytes], kind: bytes) -> None:
        assert self._loop is not None
        reader = asyncio.StreamReader(limit=CHUNK * 8)
        await self._loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), fd)

        def on_line(line: bytes) -> None:
            if work.rank == NODE and kind == STDERR:
                work.stderr_tail.append(line)
                del work.stderr_tail[:-200]

        async def pump() -> None:
            await self._pump(reader, kind, lambda: work.rank, on_line)
            work.open_streams -= 1
            self._workload_progress(work)

        self._spawn(pump())

    async def _adopt_workloads(self) -> None:
        """Announce the ranks :func:`~corral.agent.spawn.spawn_node` started and read
        every workload's output."""
        for work in self.spawned.workloads:
            if work.rank != NODE:
                self.event("rank_start", rank=work.rank, local_rank=work.local_rank, pid=work.pid)
        for work in self.spawned.workloads:
            assert work.popen.stdout is not None and work.popen.stderr is not None
            await self._attach_pipe(work, work.popen.stdout, STDOUT)
            await self._attach_pipe(work, work.popen.stderr, STDERR)

    # -- control socket (torchrun ranks' streams and SDK reports) -----------------------

    async def _serve_control(self) -> None:
        """Serve the private, authenticated control socket (:mod:`corral.agent.control`)
        that spawn_node bound; its address and token reached the ranks through their
        environment only."""
        if self._control is not None:
            await self._control.start()

    def close_control(self) -> None:
        """Stop serving the control socket and remove it (idempotent)."""
        if self._control is not None:
            self._control.close()

    async def _on_control(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            hello = (await reader.readline()).split()
            if len(hello) >= 2 and hello[0] in (b"out", b"err"):
                await self._rank_stream(hello, reader)
            elif len(hello) >= 2 and hello[0] == b"ctl":
                rank = int(hello[1])
                self._control_writers[rank] = writer
                try:
                    await self._rank_control(rank, reader)
                finally:
                    if self._control_writers.get(rank) is writer:
                        del self._control_writers[rank]
        except (ValueError, ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def _rank_stream(self, hello: list[bytes], reader: asyncio.StreamReader) -> None:
        rank = int(hello[1])
        track = self.ranks.get(rank)
        if track is None:
            track = self.ranks[rank] = RankTrack(rank=rank)
        if len(hello) >= 4:
            track.local_rank = int(hello[2])
            if track.pid is None:
                track.pid = int(hello[3])
                self._record_pgid(track.pid)
                self.event("rank_start", rank=rank, local_rank=track.local_rank, pid=track.pid)
        track.open_streams += 1
        kind = STDOUT if hello[0] == b"out" else STDERR
        await self._pump(reader, kind, lambda: rank)
        track.open_streams -= 1
        if track.open_streams == 0:
            track.eof_time = time.time()
            self._maybe_report_rank(track, final=False)

    async def _rank_control(self, rank: int, reader: asyncio.StreamReader) -> None:
        """Validate each line of a rank's SDK connection: ``exit`` settles the rank,
        the rest is forwarded as ``report`` events (one per progress report of a
        batch); invalid lines are dropped."""
        while True:
            try:
                line = await reader.readline()
            except ValueError:  # longer than the stream's limit
                self._complain(f"dropped an overlong message from rank {rank}; disconnected it")
                return
            if not line:
                return
            # when the line was read, not parsed (the first parse imports pydantic: a
            # second or more on a busy machine): no report is dated after it
            received = time.time()
            code = exit_code(line)  # the wrapper's last line: no pydantic for it
            if code is not None:
                track = self.ranks.setdefault(rank, RankTrack(rank=rank))
                track.code = code
                self._maybe_report_rank(track, final=False)
                continue
            try:
                # pydantic is imported on the first message, not at the agent's start
                from corral.agent.messages import (
                    ExitMessage,
                    ReportsMessage,
                    forwarded,
                    parse_message,
                )

                msg = parse_message(line)
            except ValueError as exc:
                self._complain(f"dropped an invalid message from rank {rank}: {exc}")
                continue
            if isinstance(msg, ExitMessage):
                track = self.ranks.setdefault(rank, RankTrack(rank=rank))
                track.code = msg.code
                self._maybe_report_rank(track, final=False)
            else:
                if isinstance(msg, ReportsMessage) and msg.dropped:  # its invalid reports
                    self._complain(f"dropped {msg.dropped} invalid report(s) from rank {rank}")
                for event in forwarded(msg, rank, received):  # one per report of a batch
                    if rank in self.gpu and event.get("type", "progress") == "progress":
                        event["gpu"] = self.gpu[rank]
                    self.emit(encode_event(event))

    def _complain(self, text: str) -> None:
        """One line on the agent's stderr, rate-limited (a rank cannot flood it)."""
        line = self._complaints.note(text)
        if line is not None:
            print(line, file=sys.stderr, flush=True)

    def _error_file(self, rank: int) -> dict[str, Any] | None:
        attempt = self.env.get(ATTEMPT_ENV, "0")
        path = Path(error_file(str(self.node_dir), attempt, rank))
        try:
            data: dict[str, Any] = json.loads(path.read_text())
            return data
        except (OSError, ValueError):
            return None

    def _maybe_report_rank(self, track: RankTrack, *, final: bool) -> None:
        """Emit ``rank_exit`` once the rank's streams are closed and its code is
        known; with ``final``, report whatever is known by now."""
        if track.reported or track.open_streams > 0:
            return
        if not final and (track.eof_time is None or track.code is None):
            return
        track.reported = True
        code = track.code
        # killed by a signal this agent's teardown had sent by then: not a root cause
        sent = self._sent.get(-code) if code is not None and code < 0 else None
        self.event(
            "rank_exit",
            rank=track.rank,
            local_rank=track.local_rank,
            pid=track.pid,
            code=code,
            eof_time=track.eof_time,
            error=self._error_file(track.rank),
            teardown=sent is not None and (track.eof_time or time.time()) >= sent,
        )
        if code not in (0, None) and not self.stopping:
            self.request_teardown(self.grace, reason=f"rank {track.rank} failed")
        if track.log is not None:
            track.log.flush()

    async def _drain_window(self, work: Workload) -> None:
        """A process exited but its pipes stay open: a child it left behind holds
        them. Stop waiting for them after a moment; teardown kills that child."""
        await asyncio.sleep(DRAIN_WINDOW)
        if work.open_streams > 0:
            work.streams_abandoned = True
            self._workload_progress(work)

    def _workload_progress(self, work: Workload) -> None:
        if work.code is not None and work.open_streams > 0 and not work.streams_abandoned:
            if not work.drain_scheduled:
                work.drain_scheduled = True
                self._spawn(self._drain_window(work))
            return
        if not work.finished or work.settled:
            return
        work.settled = True
        if work.rank != NODE:
            track = self.ranks[work.rank]
            track.code = work.code
            # when it died, not when its pipes (maybe held by its children) closed
            track.eof_time = work.exit_time or time.time()
            self._maybe_report_rank(track, final=True)
        else:
            # torchrun exited: settle ranks whose end we saw but not their code.
            codes = {
                int(m.group(2)): int(m.group(1))
                for m in _TORCHRUN_EXIT.finditer(b"\n".join(work.stderr_tail))
            }
            for track in self.ranks.values():
                if track.code is None and track.pid in codes:
                    track.code = codes[track.pid]
                if track.code is None and track.pid in self.reaped:
                    track.code = self.reaped[track.pid]
                if track.eof_time is not None or track.code is not None:
                    self._maybe_report_rank(track, final=True)
            if work.code != 0 and not self.stopping:
                self.request_teardown(self.grace, reason="torchrun failed")
        if all(w.finished for w in self.workloads.values()):
            self.request_teardown(self.grace, reason="workload finished", finished=True)

    # -- master readiness ------------------------------------------------------------

    async def _probe_master(self) -> None:
        host, port = self.node["master_addr"], int(self.node["master_port"])
        deadline = time.monotonic() + self.master_timeout
        while not self.stopping:
            try:
                _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), 1.0)
                writer.close()
                self.event("master_ready", addr=host, port=port)
                return
            except (OSError, asyncio.TimeoutError):
                pass
            if time.monotonic() > deadline:
                self.event("master_timeout", addr=host, port=port, timeout=self.master_timeout)
                return
            await asyncio.sleep(0.2)

    # -- coordinator link --------------------------------------------------------------

    async def _read_ops(self, stdin: asyncio.StreamReader) -> None:
        while True:
            line = await stdin.readline()
            if not line:
                self.request_teardown(self.grace, reason="coordinator disconnected")
                return
            self.last_heartbeat = time.monotonic()
            try:
                self._on_op(decode_op(line))
            except (ValueError, TypeError) as exc:
                print(f"corral agent: ignoring an invalid op: {exc}", file=sys.stderr, flush=True)

    def _on_op(self, op: dict[str, Any]) -> None:
        """Act on one coordinator op (ValueError/TypeError when it is malformed)."""
        kind = op["op"]
        if kind == "stop":
            self.request_teardown(float(op.get("grace", self.grace)), reason="stop requested")
        elif kind == "kill":
            self.request_teardown(0.0, reason="kill requested")
        elif kind == "dump":
            self.stack_timeout = float(op.get("timeout", self.stack_timeout))
            self._spawn(self._dump_stacks(op.get("trace_wait")))
        elif kind == "reply":
            self._reply(op)
        elif kind != "hb":
            raise ValueError(f"unknown op {kind[:40]!r}")

    def _reply(self, op: dict[str, Any]) -> None:
        """Pass the coordinator's answer to a rank's SDK request (dropped when that
        rank is no longer connected: it is not waiting any more)."""
        try:
            writer = self._control_writers.get(int(op["rank"]))
            line = json.dumps(op["message"]).encode() + b"\n"
        except (KeyError, TypeError, ValueError):
            return
        if writer is not None and not writer.is_closing():
            writer.write(line)

    async def _watch_heartbeat(self) -> None:
        if not self.heartbeat_timeout:
            return
        interval = min(1.0, self.heartbeat_timeout / 4)
        last_tick = time.monotonic()
        while not self.stopping:
            await asyncio.sleep(interval)
            now = time.monotonic()
            if now - last_tick > 2 * interval + 1.0:
                # This loop itself was stalled (blocked writing to a coordinator that
                # is slow to read, e.g. a paused terminal): heartbeats sent meanwhile
                # wait unread in stdin. Do not count the stall against the coordinator.
                self.last_heartbeat = max(self.last_heartbeat, now - interval)
            last_tick = now
            if now - self.last_heartbeat > self.heartbeat_timeout:
                self.request_teardown(self.grace, reason="coordinator heartbeat lost")
                return

    async def _send_heartbeats(self) -> None:
        """The agent's own heartbeat: the coordinator declares the host lost when these
        stop arriving (link cut, host hung) for its ``--host-timeout``."""
        while not self.done.is_set():
            self.event("hb")
            await asyncio.sleep(self.heartbeat_interval)

    async def _dump_stacks(self, trace_wait: float | None = None) -> None:
        """Dump every live rank's Python stack and flight recorder (hang detection,
        waiting ``trace_wait`` seconds for the latter) and send them."""
        from corral.agent.stacks import TRACE_WAIT, dump_event

        ranks = {
            t.rank: t.pid
            for t in self.ranks.values()
            if t.pid is not None and t.code is None and not t.reported
        }
        wait = TRACE_WAIT if trace_wait is None else float(trace_wait)
        fields = await dump_event(ranks, self.node_dir, self.stack_timeout, wait)
        self.event("stacks", **fields)

    async def _track_groups(self) -> None:
        while not self.stopping:
            for pid in self._descendants():
                self._record_pgid(pid)
            await asyncio.sleep(1.0)

    async def _sample_gpus(self) -> None:
        """Each live rank's GPU utilisation, memory and temperature every few seconds
        (nothing on a host without NVIDIA devices or NVML)."""
        from corral.agent.gpusample import INTERVAL, GpuSampler, nvidia_devices

        if not nvidia_devices():
            return
        sampler = await asyncio.to_thread(GpuSampler.open)  # NVML starts in ~0.1-1 s
        if sampler is None:
            return
        try:
            while not self.stopping:
                ranks = {
                    t.rank: (t.pid, t.local_rank) for t in self.ranks.values() if t.code is None
                }
                visible = self.env.get("CUDA_VISIBLE_DEVICES")
                self.gpu = await asyncio.to_thread(sampler.take, ranks, visible)
                await asyncio.sleep(INTERVAL)
        finally:
            sampler.close()

    # -- teardown --------------------------------------------------------------------

    def request_teardown(self, grace: float, *, reason: str, finished: bool = False) -> None:
        """Start tearing down (once); a later request with no grace (kill) kills at once."""
        if self._teardown_task is not None:
            if grace == 0.0:
                self._kill_all(signal.SIGKILL)
            return
        self.stopping = True
        if not finished:
            self.event("stopping", reason=reason)
        self._teardown_task = self._spawn(self._teardown(grace))

    def _signal_groups(self, signum: int) -> None:
        # only groups that still hold one of our processes: a long-gone group id
        # may have been reused by an unrelated process
        live = set()
        for pid in self._descendants():
            with contextlib.suppress(OSError):
                live.add(os.getpgid(pid))
        for pgid in self.pgids & live:
            with contextlib.suppress(OSError):
                os.killpg(pgid, signum)

    def _kill_all(self, signum: int) -> None:
        """Signal every recorded process group once, and any descendant outside them."""
        self._sent.setdefault(signum, time.time())
        for pid in self._descendants():
            self._record_pgid(pid)
        self._signal_groups(signum)
        for pid in self._descendants():
            with contextlib.suppress(OSError):
                if os.getpgid(pid) not in self.pgids:
                    os.kill(pid, signum)

    def _alive(self) -> bool:
        return any(procs.running(pid) for pid in self._descendants())

    async def _teardown(self, grace: float) -> None:
        if self._alive() and grace > 0:  # no grace (kill): SIGKILL only
            self._kill_all(signal.SIGTERM)
            deadline = time.monotonic() + grace
            while self._alive() and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
        if self._alive():
            self._kill_all(signal.SIGKILL)
        deadline = time.monotonic() + 10.0
        while time.monotonic() < deadline:
            self._reap()
            streams_open = any(w.open_streams for w in self.workloads.values()) or any(
                t.open_streams for t in self.ranks.values()
            )
            if not streams_open and not self._descendants():
                break
            await asyncio.sleep(0.02)
        for track in self.ranks.values():
            self._maybe_report_rank(track, final=True)
        self.done.set()

    # -- main ------------------------------------------------------------------------

    async def run(self, stdin_fd: int, pending: bytes = b"") -> int:
        """Start the node, supervise it, return the agent's exit code (``pending``:
        coordinator ops already read from ``stdin_fd``)."""
        self._loop = asyncio.get_running_loop()
        self._loop.add_signal_handler(signal.SIGCHLD, self._reap)
        for signum in STOP_SIGNALS:
            self._loop.add_signal_handler(
                signum, lambda: self.request_teardown(self.grace, reason="agent signalled")
            )
        stdin = asyncio.StreamReader()
        if pending:
            stdin.feed_data(pending)
        await self._loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(stdin), os.fdopen(stdin_fd, "rb", 0)
        )
        try:
            if self.spawned.error is not None:
                raise self.spawned.error
            await self._serve_control()
            await self._adopt_workloads()
        except Exception as exc:
            self.event(
                "start_failed", error=str(exc) or type(exc).__name__, host=socket.gethostname()
            )
            self._kill_all(signal.SIGKILL)
            return 3
        self.event(
            "started",
            pid=os.getpid(),
            pgids=sorted(self.pgids),
            node_dir=str(self.node_dir),
            hostname=socket.gethostname(),
        )
        self._spawn(self._read_ops(stdin))
        self._spawn(self._watch_heartbeat())
        self._spawn(self._send_heartbeats())
        self._spawn(self._track_groups())
        self._spawn(self._sample_gpus())
        if self.node.get("hosts_master"):
            self._spawn(self._probe_master())
        self._reap()  # a child may have exited before the SIGCHLD handler was in place
        if self.spawned.signals:  # signalled while the node was being spawned
            self.request_teardown(self.grace, reason="agent signalled")
        await self.done.wait()
        # what a rank sent just before it exited may still be queued or being read:
        # its connection is at EOF now, so this is quick (bounded anyway)
        if self._control is not None:
            await self._control.drain(CONTROL_DRAIN)
        self.close_control()
        codes = {str(t.rank): t.code for t in self.ranks.values()}
        self._soon.flush()
        for track in self.ranks.values():
            if track.log is not None:
                track.log.close()
        if self.node_log is not None:
            self.node_log.close()
        status = {"ranks": codes, "time": time.time()}
        with contextlib.suppress(OSError):
            write_private(self.node_dir / "status.json", json.dumps(status))
        failed = [w.code for w in self.workloads.values() if w.rank == NODE and w.code]
        self.event("node_exit", ranks=codes, code=failed[0] if failed else 0)
        return 0


def exit_code(line: bytes) -> int | None:
    """The code of a rank wrapper's ``{"type": "exit", "code": N}`` line, read with the
    standard library (None: any other line, for :func:`~corral.agent.messages.parse_message`
    to validate; it accepts what this accepts)."""
    if b'"exit"' not in line:
        return None
    try:
        data = json.loads(line)
    except ValueError:
        return None
    if not isinstance(data, dict) or data.keys() != {"type", "code"} or data["type"] != "exit":
        return None
    code = data["code"]
    return code if type(code) is int and -255 <= code <= 255 else None


def run_agent(
    start: dict[str, Any], out: IO[bytes], stdin_fd: int, spawned: SpawnedNode, pending: bytes = b""
) -> int:
    """Run the node described by the ``start`` message, whose processes
    :func:`~corral.agent.spawn.spawn_node` started, until it is done; ``pending``:
    what was already read from ``stdin_fd`` (coordinator ops)."""
    agent = NodeAgent(start, out, spawned)
    try:
        return asyncio.run(agent.run(stdin_fd, pending))
    finally:
        agent.close_control()
        out.flush()


__all__ = ["EVENT", "NodeAgent", "run_agent"]
