"""The coordinator's machinery: one asyncio loop in a background thread that starts
worker processes through a corral transport and supervises each one.

A :class:`WorkerSupervisor` per worker runs its process: it writes the init frame,
reads frames from the process's stdout into the worker's :class:`Mailbox`,
streams its stderr as ``[host:rank]`` lines (and to its log file), and notices
its end at once (stdout EOF, then the exit status or the lost connection), when
it either restarts the worker or marks the mailbox dead, so every waiting and
future ``recv`` raises :class:`WorkerDied`.

A worker's life is the job engine's: one :class:`~corral.job.states.JobMachine`
per worker across its restarts (PENDING -> STARTING -> RUNNING, then SUCCEEDED
when work_fn returned, or STOPPING -> RESTARTING -> STARTING ... | FAILED |
CANCELLED), and the restart is the engine's decision
(:func:`corral.recovery.restart.decide` under a
:class:`~corral.recovery.restart.RestartPolicy`: the budget, its backoff, never
after a launch error or a clean end). A worker is one rank bound to its host, so
a lost host is tried again (``min_nodes`` does not apply): the restart reconnects,
and a reconnect that fails is a launch error, which ends it.

A local worker's pipes skip the loop on the message path (a round trip costs a
few thread wake-ups, so each hop counts): :meth:`WorkerSupervisor.send_msg` writes a small
frame straight to its stdin from the caller's thread, and a thread of its own
reads its stdout into the mailbox. SSH channels stay on the loop.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import io
import os
import signal
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from corral.actors import _framing as fr
from corral.actors._channel import LocalPipes, Mailbox
from corral.actors._loop import Output
from corral.actors.errors import ActorError, RemoteError, WorkerDied, WorkerRestarted
from corral.cluster.model import Host
from corral.contract import ATTEMPT_ENV
from corral.errors import CorralError
from corral.job.result import EXIT_LAUNCH, EXIT_LOST, EXIT_SIGNAL_BASE, Failure, JobResult
from corral.job.states import JobMachine, JobState
from corral.recovery.restart import RestartPolicy, decide
from corral.transport.base import NodeProcess, Transport, kill_and_wait

TAIL_LINES = 20
#: Seconds to wait for the exit status once a worker's channel closed.
EXIT_WAIT = 5.0
#: Seconds between looks at an SSH worker's exit status.
EXIT_POLL = 0.2
#: Seconds a worker's process group may outlive its channel before it is killed.
LEFTOVER_WAIT = 0.5
#: Seconds the rest of a dead worker's stderr may take to arrive.
STDERR_DRAIN = 1.0
_CHUNK = 1 << 16
#: Frames of a local worker's reader thread that the loop handles.
_LOOP_FRAMES = frozenset({fr.HELLO, fr.READY, fr.ERROR, fr.DONE, fr.REPORT})


@dataclass
class WorkerSpec:
    """What one worker is: where it runs, its ranks, its command and its init frame."""

    host: Host
    rank: int
    local_rank: int
    node_rank: int
    argv: list[str]
    env: dict[str, str]
    init: dict[str, Any] = field(default_factory=dict)


async def _exit_status(proc: NodeProcess) -> None:
    """Returns once ``proc`` reports an exit status before its channel closes (SSH
    processes do; for others this waits until cancelled)."""
    while getattr(proc, "returncode", None) is None:
        await asyncio.sleep(EXIT_POLL)


def _lost(proc: NodeProcess) -> Any:
    """The ConnectionLost of an SSH process whose connection broke (else None)."""
    return getattr(proc, "lost", None)


def _forget(tasks: set[asyncio.Future[Any]]) -> Callable[[asyncio.Future[Any]], None]:
    def done(task: asyncio.Future[Any]) -> None:
        tasks.discard(task)
        if not task.cancelled():
            task.exception()  # retrieved: a failed best-effort kill is not an error

    return done


def _signal_name(code: int) -> str:
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


def policy_exit_code(died: WorkerDied, launched: bool) -> int:
    """A worker's end in the engine's exit codes (what the restart policy reads)."""
    if not launched:
        return EXIT_LAUNCH
    if died.lost is not None:
        return EXIT_LOST
    if died.signal_name is not None:
        with contextlib.suppress(AttributeError):
            return EXIT_SIGNAL_BASE + int(getattr(signal, died.signal_name))
    return died.exit_code if died.exit_code is not None else 1


class WorkerSupervisor:
    """Runs and watches one worker process (lives on the loop); its state is
    :attr:`machine`, its restarts decided by :attr:`policy` (see the module doc)."""

    def __init__(
        self,
        spec: WorkerSpec,
        transport: Transport,
        output: Output,
        mailbox: Mailbox,
        *,
        policy: RestartPolicy | None = None,
        on_report: Callable[[int, dict[str, Any]], None] | None = None,
    ) -> None:
        self.spec = spec
        self.transport = transport
        self.output = output
        self.mailbox = mailbox
        self.policy = policy or RestartPolicy(backoff=0.0)
        self.on_report = on_report
        self.machine = JobMachine()
        self.ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.proc: NodeProcess | None = None
        self.hello: dict[str, Any] = {}
        self.restarts = 0
        #: The channel to the current process is open (frames can be written).
        self.alive = False
        self.started = time.time()
        self.result: bytes | None = None
        self.last_report: dict[str, Any] | None = None
        self.tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        self.task: asyncio.Task[None] | None = None
        self._notice: WorkerRestarted | None = None
        #: Best-effort kills of what dead workers left behind (awaited by stop).
        self.cleanups: set[asyncio.Future[Any]] = set()
        self._loop = asyncio.get_running_loop()
        #: Guards writes to the process: taken by the loop and by senders' threads.
        self._write_lock = threading.Lock()
        #: Frames handed to the loop and not yet given to the transport.
        self._queued = 0
        self._pipes: LocalPipes | None = None
        #: The id of the last message sent (ids go on across restarts).
        self._last_id = 0
        self._backoff: asyncio.Future[None] | None = None

    @property
    def host(self) -> str:
        return self.spec.host.name

    @property
    def rank(self) -> int:
        return self.spec.rank

    def start(self) -> None:
        """Start the process (and restarts) in a task."""
        self.task = asyncio.get_running_loop().create_task(self._run())

    def send_msg(self, body: bytes) -> int:
        """Send a user message (pickled ``body``) from any thread; its id (see
        :mod:`._framing`). Dropped when no process runs."""
        with self._write_lock:
            self._last_id += 1
            self._send(fr.MSG, body, fr.msg_head(self._last_id))
            return self._last_id

    def _send(self, kind: int, body: bytes, head: bytes) -> None:
        """One frame to the current process (the caller holds the write lock). A small
        frame to a local worker is written right here when nothing is ahead of it;
        anything else goes through the loop, in order."""
        if self.proc is None or not self.alive:
            return
        if self._pipes is not None and self._queued == 0 and len(body) < _CHUNK:
            left = self._pipes.write_now(fr.header(kind, len(head) + len(body)) + head + body)
            if left is not None:
                if left:  # the rest of a partly written frame goes next
                    self._queue(None, left, b"")
                return
        self._queue(kind, body, head)

    def _queue(self, kind: int | None, body: bytes, head: bytes) -> None:
        """Hand a frame (kind None: raw bytes) to the loop, behind every frame
        before it (the caller holds the write lock)."""
        self._queued += 1
        self._loop.call_soon_threadsafe(self._write_queued, kind, body, head)

    def _write_queued(self, kind: int | None, body: bytes, head: bytes) -> None:
        with self._write_lock:
            self._queued -= 1
            if kind is None:
                if self.proc is not None and self.alive:
                    self.proc.write(body)
            else:
                self._write(kind, body, head)

    def write(self, kind: int, body: bytes = b"") -> None:
        """Send one frame to the current process (on the loop; dropped when there is none)."""
        with self._write_lock:
            self._write(kind, body)

    def _write(self, kind: int, body: bytes, head: bytes = b"") -> None:
        """Give one frame (body ``head + body``) to the transport; the caller holds
        the write lock."""
        proc = self.proc
        if proc is None or not self.alive:
            return
        start = fr.header(kind, len(head) + len(body)) + head
        if len(body) < _CHUNK:
            proc.write(start + body)
        else:
            proc.write(start)
            proc.write(body)

    async def stop(self, grace: float) -> None:
        """Ask the worker to stop; SIGKILL its process group after ``grace`` seconds."""
        machine = self.machine
        if machine.launching:  # not started yet, or waiting to restart
            machine.to(JobState.CANCELLED, "stopped by the coordinator")
            if self._backoff is not None:
                self._backoff.cancel()
        elif not machine.state.terminal:
            machine.to(JobState.STOPPING, "stopped by the coordinator")
        self.write(fr.STOP)
        if self.task is None:
            return
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.shield(self.task), grace)
        if not self.task.done() and self.proc is not None:
            await kill_and_wait(self.proc, EXIT_WAIT)
        with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
            await asyncio.wait_for(asyncio.shield(self.task), EXIT_WAIT)
        if not self.task.done():
            self.task.cancel()
        if not self.ready.done():
            self.ready.cancel()
        if self.mailbox.dead is None:
            self.mailbox.finish(self._died("stopped by the coordinator", None))
        if self.cleanups:
            await asyncio.wait(set(self.cleanups), timeout=EXIT_WAIT + 1)

    # -- the process ----------------------------------------------------------------

    async def _run(self) -> None:
        machine = self.machine
        died: WorkerDied | None = None
        while machine.state in (JobState.PENDING, JobState.RESTARTING):
            machine.to(JobState.STARTING, f"attempt {self.restarts}")
            died, launched = await self._run_once()
            if not self.ready.done():
                self.ready.set_exception(died)
            if self._settle(died, launched) != JobState.RESTARTING:
                break
            self.restarts += 1
            self._notice = WorkerRestarted(died, self.restarts)
            if delay := self.policy.delay(self.restarts):  # stop() cuts it short
                self._backoff = asyncio.ensure_future(asyncio.sleep(delay))
                with contextlib.suppress(asyncio.CancelledError):
                    await self._backoff
        if died is None:
            died = self._died("stopped by the coordinator before it started", None)
        self.mailbox.finish(died)

    def _settle(self, died: WorkerDied, launched: bool) -> JobState:
        """Where the worker goes once its process ended (on the loop, without a pause,
        so a concurrent :meth:`stop` is either before or after it)."""
        machine = self.machine
        if machine.state == JobState.STOPPING:  # only stop() puts a live worker there
            machine.to(JobState.CANCELLED, died.message)
        elif self.ready.cancelled() or self.ready.exception() is not None:
            machine.to(JobState.FAILED, died.message)  # never started: start() reports it
        elif died.exit_code == 0 and machine.state == JobState.RUNNING:
            machine.to(JobState.SUCCEEDED, died.message)
        else:
            machine.to(JobState.STOPPING, died.message)
            code = policy_exit_code(died, launched)
            now = time.time()
            cause = Failure(
                self.host,
                self.rank,
                died.exit_code,
                now,
                died.message,
                [],
                could_not_start=not launched,
            )
            result = JobResult(
                job_id=f"{self.host}:{self.rank}",
                state=JobState.SUCCEEDED if code == 0 else JobState.FAILED,
                exit_code=code,
                nodes=[],
                failures=[cause],
                started=self.started,
                ended=now,
                reason=died.message,
            )
            decision = decide(
                self.policy,
                result,
                restarts_done=self.restarts,
                hosts=[self.host],
                unreachable=(),  # bound to its host: a lost one is reconnected
                initial_hosts=1,
            )
            target = JobState.RESTARTING if decision.restart else JobState.FAILED
            machine.to(target, decision.reason)
        return machine.state

    async def _run_once(self) -> tuple[WorkerDied, bool]:
        """One process from start to end: what ended it, and whether it was started."""
        spec = self.spec
        self.tail.clear()
        try:
            # each restart is the next attempt, as the engine numbers a job's restarts
            env = {**spec.env, ATTEMPT_ENV: str(self.restarts)}
            proc = await self.transport.start(spec.host, spec.argv, env=env)
        except CorralError as exc:
            return self._died(f"could not start: {exc}", None), False
        self.started = time.time()
        self.mailbox.renew()
        self.hello = {}  # the pid of a dead process is no longer the worker's
        with self._write_lock:  # nothing is sent to the new process before init
            self.proc = proc
            self.alive = True
            self._pipes = LocalPipes.of(proc)
            self._write(fr.INIT, fr.encode_json(spec.init))
        pump = asyncio.ensure_future(self._pump_stderr(proc))
        beat = asyncio.ensure_future(self._heartbeat(float(spec.init.get("heartbeat_every", 0))))
        problem = await self._read_until_gone(proc)
        self._tell_restart()  # it ended before its first frame: told before its end
        with self._write_lock:
            self.alive = False
            if self._pipes is not None:
                self._pipes.close_writer()
        beat.cancel()
        if problem is not None:
            proc.signal(signal.SIGKILL)
        code = await self._exit_code(proc)
        self._kill_group(proc)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.shield(pump), STDERR_DRAIN)
        pump.cancel()
        proc.close_stdin()
        return self._ended(proc, code, problem), True

    def _kill_group(self, proc: NodeProcess) -> None:
        """SIGKILL what the worker left in its process group. Once an SSH channel has
        closed its process cannot be signalled, so ``kill`` runs in a new session
        (in the background; not on a lost host)."""
        proc.signal(signal.SIGKILL)
        run = getattr(self.transport, "run", None)
        pid = self.hello.get("pid")
        if not self.spec.host.local and run is not None and pid and _lost(proc) is None:
            command = f"kill -KILL -- -{int(pid)} 2>/dev/null; true"
            task = asyncio.ensure_future(run(self.spec.host, command, timeout=EXIT_WAIT))
            self.cleanups.add(task)
            task.add_done_callback(_forget(self.cleanups))

    async def _read_until_gone(self, proc: NodeProcess) -> str | None:
        """Read frames until the channel closes, or until shortly after the exit
        status came (over SSH the channel stays open while the worker's children
        hold its stderr: they are killed then); a channel problem, if any."""
        reader = asyncio.ensure_future(self._read_frames(proc))
        exited = asyncio.ensure_future(_exit_status(proc))
        await asyncio.wait({reader, exited}, return_when=asyncio.FIRST_COMPLETED)
        exited.cancel()
        if not reader.done():
            await asyncio.wait({reader}, timeout=LEFTOVER_WAIT)
        if not reader.done():
            proc.signal(signal.SIGKILL)
            await asyncio.wait({reader}, timeout=EXIT_WAIT)
        if not reader.done():
            reader.cancel()
            return "the channel stayed open after the worker exited"
        exc = reader.exception()
        if isinstance(exc, (fr.ProtocolError, asyncio.IncompleteReadError, EOFError, ValueError)):
            return f"unexpected output on the worker's channel ({exc})"
        if exc is not None:
            return f"channel error ({exc})"
        return None

    @staticmethod
    async def _exit_code(proc: NodeProcess) -> int | None:
        """The exit status once the channel closed (the worker is gone). What it left
        in its process group (holding stderr, so delaying the status) is SIGKILLed."""
        with contextlib.suppress(asyncio.TimeoutError):
            return await asyncio.wait_for(asyncio.shield(proc.wait()), LEFTOVER_WAIT)
        proc.signal(signal.SIGKILL)
        with contextlib.suppress(asyncio.TimeoutError):
            return await asyncio.wait_for(asyncio.shield(proc.wait()), EXIT_WAIT)
        await kill_and_wait(proc, EXIT_WAIT)
        return None

    def _ended(self, proc: NodeProcess, code: int | None, problem: str | None) -> WorkerDied:
        lost = _lost(proc)
        if problem is not None:
            return self._died(problem, code)
        if lost is not None:
            return self._died(f"connection to {self.host} lost ({lost.cause or lost})", None, lost)
        if code is None:
            return self._died("did not exit after closing its channel (killed)", None)
        if code < 0:
            return self._died(f"killed by {_signal_name(code)}", code)
        if code == 0:
            why = "stopped" if self.machine.state == JobState.STOPPING else "work_fn returned"
            return self._died(f"exited with code 0 ({why})", code)
        return self._died(f"exited with code {code}", code)

    def _died(self, message: str, code: int | None, lost: Any = None) -> WorkerDied:
        tail = list(self.tail)
        last = next((line for line in reversed(tail) if line.strip()), "")
        if last and code != 0 and lost is None:
            message = f"{message}: {last.strip()}"
        return WorkerDied(
            message,
            host=self.host,
            rank=self.rank,
            exit_code=code if code is not None and code >= 0 else None,
            signal_name=_signal_name(code) if code is not None and code < 0 else None,
            lost=str(lost) if lost is not None else None,
            stderr_tail=tail,
        )

    async def _read_frames(self, proc: NodeProcess) -> None:
        pipes = self._pipes
        if pipes is not None:
            await self._read_frames_in_thread(pipes)
            return
        while (frame := await fr.read_frame_async(proc.stdout)) is not None:
            self._frame(*frame)

    async def _read_frames_in_thread(self, pipes: LocalPipes) -> None:
        """A local worker's frames, read by a thread: messages straight into the
        mailbox, the rest through the loop (in order); returns at EOF."""
        done: asyncio.Future[None] = self._loop.create_future()

        def settle(error: BaseException | None) -> None:
            if done.done():
                return
            if error is None:
                done.set_result(None)
            else:
                done.set_exception(error)

        def on_loop(kind: int, body: bytearray) -> None:
            try:
                self._frame(kind, body)
            except Exception as exc:  # a broken control frame ends the reading
                settle(exc)

        def read() -> None:
            error: BaseException | None = None
            try:
                os.set_blocking(pipes.read_fd, True)
                with io.FileIO(pipes.read_fd, "rb", closefd=True) as raw:
                    stream = io.BufferedReader(raw, _CHUNK)
                    while (frame := fr.read_frame(stream)) is not None:
                        kind, body = frame
                        if kind == fr.HELLO:  # here: before its messages, as it sent it
                            self._hello(body)
                            continue
                        if self._notice is not None:
                            self._tell_restart()
                        if kind == fr.MSG:
                            self.mailbox.put_msg(body)
                        elif kind in _LOOP_FRAMES:
                            self._loop.call_soon_threadsafe(on_loop, kind, body)
                        else:
                            raise fr.ProtocolError(f"unexpected frame kind {kind} from the worker")
            except BaseException as exc:  # handed to the loop, which judges it
                error = exc
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
                self._loop.call_soon_threadsafe(settle, error)

        threading.Thread(target=read, name=f"corral-actor-{self.rank}", daemon=True).start()
        try:
            await done
        finally:
            pipes.stdout.close()  # its EOF for the transport (the thread has its own fd)

    def _frame(self, kind: int, body: bytes | bytearray) -> None:
        """One frame from the worker (on the loop)."""
        if kind == fr.HELLO:
            self._hello(body)
            return
        if self._notice is not None:
            self._tell_restart()
        if kind == fr.MSG:
            self.mailbox.put_msg(body)
        elif kind == fr.READY:
            if self.machine.state == JobState.STARTING:
                self.machine.to(JobState.RUNNING, "ready")
            if not self.ready.done():
                self.ready.set_result(None)
        elif kind == fr.ERROR:
            self._remote_error(fr.decode_json(body))
        elif kind == fr.DONE:
            self.result = bytes(body)
        elif kind == fr.REPORT:
            self._report(body)
        else:
            raise fr.ProtocolError(f"unexpected frame kind {kind} from the worker")

    def _hello(self, body: bytes | bytearray) -> None:
        """The process's first frame (its pid, interface...); then its restart is told,
        so a handle that raised WorkerRestarted already shows the new process."""
        self.hello = fr.decode_json(body)
        self._tell_restart()

    def _tell_restart(self) -> None:
        """Put the pending WorkerRestarted in the mailbox, once: before anything the
        new process sent (from its reader thread or the loop)."""
        with self.mailbox.cond:  # a reentrant lock (put takes it too)
            notice, self._notice = self._notice, None
            if notice is not None:
                self.mailbox.put("raise", notice)

    def _remote_error(self, info: Mapping[str, Any]) -> None:
        error = RemoteError(
            host=self.host,
            rank=self.rank,
            type_name=str(info.get("type", "Exception")),
            remote_message=str(info.get("message", "")),
            traceback=str(info.get("traceback", "")),
            phase=str(info.get("phase", "run")),
        )
        if not self.ready.done():
            self.ready.set_exception(error)
        else:
            self.mailbox.put("raise", error)

    def _report(self, body: bytes | bytearray) -> None:
        with contextlib.suppress(ValueError):
            report = fr.decode_json(body)
            if not isinstance(report, dict):
                return
            batch = [report]
            if report.get("type") == "reports":  # what sdk.report buffered: one each
                from corral.agent.messages import ReportsMessage, forwarded, parse_message

                message = parse_message(bytes(body))
                if not isinstance(message, ReportsMessage):
                    return
                batch = forwarded(message, self.rank)
            for one in batch:
                self.last_report = one
                if self.on_report is not None:
                    self.on_report(self.rank, one)

    async def _heartbeat(self, every: float) -> None:
        """A ping every ``every`` seconds (0: none), so a cut-off worker knows."""
        while every > 0:
            await asyncio.sleep(every)
            self.write(fr.PING)

    async def _pump_stderr(self, proc: NodeProcess) -> None:
        pending = b""
        while chunk := await proc.stderr.read(_CHUNK):
            data = pending + chunk
            cut = data.rfind(b"\n") + 1
            if cut == 0 and len(data) < _CHUNK:
                pending = data
                continue
            cut = cut or len(data)
            self._emit(data[:cut])
            pending = data[cut:]
        if pending:
            self._emit(pending + b"\n")

    def _emit(self, data: bytes) -> None:
        self.tail.extend(data.decode(errors="replace").splitlines())
        self.output.lines(self.host, self.rank, data)


async def start_all(
    supervisors: Sequence[WorkerSupervisor], wait_time: float
) -> dict[int, ActorError]:
    """Start every worker; the ones not ready within ``wait_time`` (rank -> cause).
    After the first failure the others get a second to report theirs."""
    for sup in supervisors:
        sup.start()
    pending = {sup.ready for sup in supervisors}
    done, pending = await asyncio.wait(
        pending, timeout=wait_time, return_when=asyncio.FIRST_EXCEPTION
    )
    if pending and any(f.exception() is not None for f in done):
        await asyncio.wait(pending, timeout=1.0)
    failures: dict[int, ActorError] = {}
    for sup in supervisors:
        if not sup.ready.done():
            failures[sup.rank] = ActorError(
                f"not ready within wait_time={wait_time:g} s", host=sup.host, rank=sup.rank
            )
        elif (exc := sup.ready.exception()) is not None:
            assert isinstance(exc, ActorError)
            failures[sup.rank] = exc
    return failures
