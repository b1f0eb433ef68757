"""The supervisor: starts every node's agent, streams, watches, tears down.

It talks to one :mod:`corral.agent` per node through any
:class:`~corral.transport.base.Transport`. On the first failure of any rank
(or a lost host, the ``--timeout`` deadline, Ctrl-C) it asks every agent to
stop (SIGTERM to the node's process groups, SIGKILL after the grace period)
and then reports; a second Ctrl-C kills at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from corral.agent.protocol import EVENT, NODE, STDERR, decode_header, encode_op
from corral.cluster.model import Host
from corral.errors import CorralError
from corral.job.output import LogSink
from corral.job.states import (
    JobState,
    NodeState,
    check_job_transition,
    check_node_transition,
)
from corral.plan.spec import NodeCommand
from corral.recovery.hang import HangVerdict
from corral.recovery.hangwatch import HangWatch
from corral.recovery.health import (
    DEFAULT_HOST_TIMEOUT,
    HostHealth,
    HostWatch,
    RankHealth,
    check_rank_transition,
)
from corral.transport.base import NodeProcess, Transport

STDERR_TAIL = 20
STACK_TIMEOUT = 10.0  # seconds a node may take to dump its ranks' stacks

#: corral's exit codes besides 0 and the failing rank's own code.
EXIT_SIGNAL_BASE = 128  # rank killed by signal N -> 128 + N
EXIT_TIMEOUT = 124  # --timeout reached
EXIT_INTERRUPTED = 130  # Ctrl-C / SIGTERM to corral
EXIT_LOST = 255  # a host was lost (connection or agent died)
EXIT_LAUNCH = 3  # a node could not be started / the master never came up
EXIT_HANG = 125  # hang detection stopped the job (no progress for --hang-timeout)


def signal_name(code: int | None) -> str | None:
    """``SIGKILL`` for -9 (and for 137, the shell's 128+9), else None."""
    if code is None:
        return None
    num = -code if code < 0 else code - EXIT_SIGNAL_BASE if code > EXIT_SIGNAL_BASE else 0
    if num <= 0:
        return None
    try:
        return signal.Signals(num).name
    except ValueError:
        return f"signal {num}"


@dataclass
class RankRecord:
    """What the coordinator knows about one rank."""

    host: str
    rank: int
    local_rank: int = 0
    pid: int | None = None
    code: int | None = None
    exited: bool = False
    time: float | None = None
    error: dict[str, Any] | None = None
    stderr_tail: deque[str] = field(default_factory=lambda: deque(maxlen=STDERR_TAIL))
    progress: dict[str, Any] | None = None
    health: RankHealth = RankHealth.STARTED

    def set_health(self, new: RankHealth) -> None:
        """Move to ``new`` along a documented transition (no-op if already there)."""
        if new != self.health:
            self.health = check_rank_transition(self.health, new)


@dataclass
class NodeRun:
    """One node during and after the job."""

    command: NodeCommand
    state: NodeState = NodeState.STARTING
    proc: NodeProcess | None = None
    started: float = 0.0
    ended: float | None = None
    ranks: dict[int, RankRecord] = field(default_factory=dict)
    agent_tail: deque[str] = field(default_factory=lambda: deque(maxlen=STDERR_TAIL))
    detail: str = ""
    got_exit_event: bool = False
    clock_offset: float = 0.0  # coordinator clock minus the host's clock
    watch: HostWatch = field(default_factory=lambda: HostWatch("", time.monotonic()))
    stacks: list[dict[str, Any]] | None = None  # the latest stack dump (hang detection)
    stacks_ready: asyncio.Event = field(default_factory=asyncio.Event)

    def to_local(self, host_time: float) -> float:
        """A timestamp of this host's clock on the coordinator's clock."""
        return host_time + self.clock_offset

    failed: bool = False  # one of its ranks failed before the job was stopping

    @property
    def host(self) -> Host:
        """The node's host."""
        return self.command.host

    def set_state(self, new: NodeState) -> None:
        """Move to ``new`` along a documented transition (no-op if already there)."""
        if new != self.state:
            self.state = check_node_transition(self.state, new)


@dataclass
class Failure:
    """The root cause of a failed job (or one more failure after it)."""

    host: str
    rank: int | None
    code: int | None
    time: float
    message: str
    stderr_tail: list[str]
    traceback: str | None = None
    exit_code: int = 1

    @property
    def signal(self) -> str | None:
        """Signal name when the process was killed by a signal."""
        return signal_name(self.code)


@dataclass
class JobResult:
    """Outcome of a supervised job."""

    job_id: str
    state: JobState
    exit_code: int
    nodes: list[NodeRun]
    failures: list[Failure]
    started: float
    ended: float
    reason: str = ""
    attempts: list[dict[str, Any]] = field(default_factory=list)  # every attempt so far

    @property
    def root_cause(self) -> Failure | None:
        """The earliest failure, if any."""
        return self.failures[0] if self.failures else None


class Supervisor:
    """Runs planned NodeCommands through a transport and supervises them."""

    def __init__(
        self,
        commands: Sequence[NodeCommand],
        transport: Transport,
        sink: LogSink,
        *,
        job_id: str,
        agent_argv: Callable[[Host], list[str]],
        grace: float = 10.0,
        timeout: float | None = None,
        heartbeat_interval: float = 2.0,
        heartbeat_timeout: float = 15.0,
        master_timeout: float = 300.0,
        require_master: bool = True,
        started: Mapping[str, NodeProcess] | None = None,
        host_timeout: float = DEFAULT_HOST_TIMEOUT,
        hang_timeout: float | None = None,
        hang_dir: Path | None = None,
        on_report: Callable[[NodeRun, dict[str, Any]], None] | None = None,
        holding: Callable[[], bool] | None = None,
    ) -> None:
        now = time.monotonic()
        self.nodes = [NodeRun(command=c, watch=HostWatch(c.host.name, now)) for c in commands]
        self.transport = transport
        self.sink = sink
        self.job_id = job_id
        self.agent_argv = agent_argv
        self.grace = grace
        self.timeout = timeout
        self.heartbeat_interval = heartbeat_interval
        self.heartbeat_timeout = heartbeat_timeout
        self.master_timeout = master_timeout
        self.require_master = require_master
        self.prestarted = dict(started or {})  # agents already running (probed SSH hosts)
        self.host_timeout = host_timeout
        self.hang = HangWatch(hang_timeout, hang_dir)
        self.on_report = on_report
        # True while the job waits on corral itself (a checkpoint copy a save waits for)
        self.holding = holding
        self.state = JobState.PENDING
        self.stop_reason: str | None = None
        self.stop_time: float | None = None
        self.stop_state = JobState.FAILED
        self.extra_failures: list[Failure] = []
        self._interrupts = 0
        self._all_done = asyncio.Event()
        self._tasks: list[asyncio.Task[Any]] = []
        self._master_ready = False
        self.started = time.time()

    # -- state -----------------------------------------------------------------------

    def _set_state(self, new: JobState) -> None:
        if new != self.state:
            self.state = check_job_transition(self.state, new)

    # -- starting ----------------------------------------------------------------------

    async def _start_node(self, node: NodeRun) -> None:
        cmd = node.command
        node.started = time.time()
        try:
            node.proc = self.prestarted.pop(cmd.host.name, None) or await self.transport.start(
                cmd.host, self.agent_argv(cmd.host)
            )
        except CorralError as exc:
            node.detail = str(exc)
            node.set_state(NodeState.FAILED)
            node.ended = time.time()
            self._fail(
                Failure(
                    cmd.host.name, None, None, time.time(), f"could not start the node: {exc}", []
                ),
                EXIT_LAUNCH,
            )
            return
        start = {
            "op": "start",
            "node": cmd.to_json(),
            "grace": self.grace,
            "heartbeat_timeout": self.heartbeat_timeout,
            "heartbeat_interval": self.heartbeat_interval,
            "master_timeout": self.master_timeout,
        }
        node.proc.write(encode_op(start))
        self._tasks.append(asyncio.ensure_future(self._read_agent_stderr(node)))
        self._tasks.append(asyncio.ensure_future(self._read_frames(node)))

    async def _read_agent_stderr(self, node: NodeRun) -> None:
        assert node.proc is not None
        while True:
            line = await node.proc.stderr.readline()
            if not line:
                return
            if not line.endswith(b"\n"):
                line += b"\n"
            node.watch.heard(time.monotonic())
            node.agent_tail.append(line.decode("utf-8", "replace").rstrip("\n"))
            self.sink.lines(node.host.name, NODE, line)

    async def _read_frames(self, node: NodeRun) -> None:
        assert node.proc is not None
        reader = node.proc.stdout
        host = node.host.name
        try:
            while True:
                header = await reader.readline()
                if not header:
                    break
                node.watch.heard(time.monotonic())
                kind, rank, length = decode_header(header)
                payload = await reader.readexactly(length)
                if kind == EVENT:
                    self._on_event(node, json.loads(payload))
                    continue
                self.sink.lines(host, rank, payload)
                if kind == STDERR:
                    tail = node.agent_tail if rank == NODE else self._rank(node, rank).stderr_tail
                    tail.extend(payload.decode("utf-8", "replace").splitlines()[-STDERR_TAIL:])
        except Exception as exc:
            # Without a reader the agent would block on a full pipe forever: end it
            # (its processes die with it) and report the node.
            node.detail = f"corral stopped reading this node's agent: {exc!r}"
            node.proc.signal(signal.SIGKILL)
        finally:
            try:
                code = await node.proc.wait()
            except CorralError as exc:
                code, node.detail = 255, str(exc)
            lost = getattr(node.proc, "lost", None)  # the SSH transport says why it broke
            if lost is not None and not node.detail:
                node.detail = str(lost)
            self._node_gone(node, code)

    def _rank(self, node: NodeRun, rank: int) -> RankRecord:
        record = node.ranks.get(rank)
        if record is None:
            record = node.ranks[rank] = RankRecord(host=node.host.name, rank=rank)
        return record

    # -- events ------------------------------------------------------------------------

    def _on_event(self, node: NodeRun, event: dict[str, Any]) -> None:
        name = event.get("event")
        if name == "started":
            # failures on different hosts are ordered on one clock: ours (the offset
            # also absorbs the transit delay, which is small next to real skew)
            node.clock_offset = time.time() - float(event["time"])
            if node.state == NodeState.STARTING:
                node.set_state(NodeState.RUNNING)
            if all(n.state != NodeState.STARTING for n in self.nodes) and (
                self.state == JobState.STARTING
            ):
                self._set_state(JobState.RUNNING)
        elif name == "rank_start":
            record = self._rank(node, int(event["rank"]))
            record.local_rank = int(event.get("local_rank") or 0)
            record.pid = event.get("pid")
        elif name == "rank_exit":
            self._on_rank_exit(node, event)
        elif name == "report":
            record = self._rank(node, int(event.get("rank", 0)))
            if self.on_report is not None:
                self.on_report(node, event)
            if event.get("type", "progress") != "progress":
                return
            record.progress = event
            if record.health == RankHealth.STARTED:
                record.set_health(RankHealth.PROGRESSING)
            self.hang.observe(node.host.name, record.rank, event.get("step"))
            self.sink.report(node.host.name, event)
        elif name == "stacks":
            node.stacks = list(event.get("stacks") or [])
            node.stacks_ready.set()
        elif name == "master_ready":
            self._master_ready = True
            self.sink.message(
                f"Master node {event['addr']}:{event['port']} is ready for connections",
                style="green",
            )
        elif name == "master_timeout":
            text = (
                f"master {event['addr']}:{event['port']} did not accept connections "
                f"within {event['timeout']:g} s"
            )
            if self.require_master:
                self._fail(
                    Failure(
                        node.host.name, None, None, node.to_local(float(event["time"])), text, []
                    ),
                    EXIT_LAUNCH,
                )
            else:
                self.sink.message(f"warning: {text}", style="yellow")
        elif name == "start_failed":
            node.detail = str(event.get("error"))
            node.failed = node.got_exit_event = True
            self._fail(
                Failure(
                    node.host.name,
                    None,
                    None,
                    node.to_local(float(event["time"])),
                    f"could not start the node: {node.detail}",
                    [],
                ),
                EXIT_LAUNCH,
            )
        elif name == "node_exit":
            node.got_exit_event = True
            code = int(event.get("code") or 0)
            if code and not node.failed and not any(r.code for r in node.ranks.values()):
                # torchrun itself failed (rendezvous timeout, bad arguments) before any
                # rank reported a failure
                node.failed = True
                if self.stop_reason is None:
                    self._fail(
                        Failure(
                            node.host.name,
                            None,
                            code,
                            node.to_local(float(event["time"])),
                            f"the launcher on {node.host.name} exited with code {code}",
                            list(node.agent_tail),
                        ),
                        _exit_code_for(code),
                    )

    def _on_rank_exit(self, node: NodeRun, event: dict[str, Any]) -> None:
        record = self._rank(node, int(event["rank"]))
        if record.exited:
            return  # already settled; the first report wins
        record.exited = True
        record.set_health(RankHealth.EXITED)
        record.code = event.get("code")
        record.pid = event.get("pid") or record.pid
        host_time = event.get("eof_time") or event.get("time")
        record.time = node.to_local(float(host_time)) if host_time is not None else None
        record.error = event.get("error")
        if record.code == 0:
            return
        failed_before_stop = self.stop_time is None or (record.time or 0) < self.stop_time
        if not failed_before_stop:
            return
        code = record.code
        what = (
            f"killed by {signal_name(code)}"
            if signal_name(code) and (code or 0) < 0
            else "exited without reporting a status"
            if code is None
            else f"exited with code {code}"
        )
        node.failed = True
        tb = record.error.get("traceback") if record.error else None
        failure = Failure(
            node.host.name,
            record.rank,
            code,
            record.time or time.time(),
            f"rank {record.rank} on {node.host.name} {what}",
            list(record.stderr_tail),
            tb,
        )
        self._fail(failure, _exit_code_for(code))

    def _node_gone(self, node: NodeRun, code: int) -> None:
        node.ended = time.time()
        if node.state.terminal:
            pass
        elif not node.got_exit_event:
            detail = node.detail or (
                f"agent exited with code {code} without reporting"
                if code >= 0
                else f"agent killed by {signal_name(code)}"
            )
            failure = self._mark_lost(node, detail, code)
            if self.stop_reason is None:
                self._fail(failure, EXIT_LOST)
        else:
            if node.failed:
                node.set_state(NodeState.FAILED)
            elif self.stop_reason is not None or any(r.code != 0 for r in node.ranks.values()):
                node.set_state(NodeState.TERMINATED)
            else:
                node.set_state(NodeState.EXITED)
        if all(n.state.terminal for n in self.nodes):
            self._all_done.set()

    # -- failure and teardown --------------------------------------------------------

    def _fail(self, failure: Failure, exit_code: int) -> None:
        failure.exit_code = exit_code
        self.extra_failures.append(failure)
        if self.stop_reason is None:
            self._exit_code = exit_code
            self.sink.message(failure.message + ": stopping the job", style="bold red")
            self.stop("failure", JobState.FAILED)

    def stop(self, reason: str, final_state: JobState) -> None:
        """Tear every node down (once): stop, then kill after the grace period."""
        if self.stop_reason is not None:
            return
        self.stop_reason = reason
        self.stop_time = time.time()
        self.stop_state = final_state
        if self.state in (JobState.STARTING, JobState.RUNNING):
            self._set_state(JobState.STOPPING)
        for node in self.nodes:
            if node.proc is not None and not node.state.terminal:
                node.set_state(NodeState.STOPPING)
                node.proc.write(encode_op({"op": "stop", "grace": self.grace}))
        self._tasks.append(asyncio.ensure_future(self._kill_after(self.grace + 5.0)))

    def kill_now(self) -> None:
        """Second interrupt: SIGKILL everything without waiting."""
        for node in self.nodes:
            if node.proc is not None and not node.state.terminal:
                node.proc.write(encode_op({"op": "kill"}))
        self._tasks.append(asyncio.ensure_future(self._kill_after(3.0)))

    async def _kill_after(self, delay: float) -> None:
        await asyncio.sleep(delay)
        for node in self.nodes:
            if node.proc is not None and not node.state.terminal:
                node.proc.write(encode_op({"op": "kill"}))
                node.proc.signal(signal.SIGKILL)
                if node.host.local:
                    kill_recorded_groups(node.command.env.get("CORRAL_NODE_DIR", ""))

    def interrupt(self) -> None:
        """Ctrl-C / SIGTERM to corral: teardown once, kill at the second."""
        self._interrupts += 1
        if self._interrupts == 1:
            self.sink.message(
                "interrupted: stopping every node (Ctrl-C again to kill now)", style="bold yellow"
            )
            self._exit_code = EXIT_INTERRUPTED
            self.stop("interrupted", JobState.CANCELLED)
        else:
            self.sink.message("killing every node now", style="bold red")
            self.kill_now()

    async def _heartbeats(self) -> None:
        while True:
            await asyncio.sleep(self.heartbeat_interval)
            for node in self.nodes:
                if node.proc is not None and not node.state.terminal:
                    node.proc.write(b'{"op":"hb"}\n')

    async def _watch_hosts(self) -> None:
        """Declare a host LOST when nothing (not even its agent's heartbeat) arrived
        for ``host_timeout`` seconds; warn once when it falls SILENT."""
        interval = min(1.0, self.heartbeat_interval)
        last_tick = time.monotonic()
        while True:
            await asyncio.sleep(interval)
            now = time.monotonic()
            stalled = now - last_tick > 2 * interval + 1.0
            last_tick = now
            for node in self.nodes:
                if node.proc is None or node.state.terminal:
                    continue
                if stalled:
                    # this loop itself was held up (e.g. a burst of output): frames that
                    # arrived meanwhile are still unread, so the silence is ours
                    node.watch.heard(now - interval)
                change = node.watch.check(
                    now, interval=self.heartbeat_interval, timeout=self.host_timeout
                )
                if change == HostHealth.SILENT and self.stop_reason is None:
                    self.sink.message(
                        f"no heartbeat from {node.host.name} for "
                        f"{node.watch.silence(now):.0f} s (lost after {self.host_timeout:g} s)",
                        style="yellow",
                    )
                elif change == HostHealth.LOST:
                    self._declare_lost(
                        node,
                        f"no heartbeat from its agent for {self.host_timeout:g} s "
                        "(--host-timeout): link down or host hung",
                    )

    def _declare_lost(self, node: NodeRun, detail: str) -> None:
        """The host stopped answering: it is LOST; its agent tears itself down when our
        heartbeats stop reaching it, and the rest of the job is stopped."""
        failure = self._mark_lost(node, detail, None)
        node.ended = time.time()
        if node.proc is not None:
            node.proc.signal(signal.SIGKILL)
        if self.stop_reason is None:
            self._fail(failure, EXIT_LOST)
        else:
            self.extra_failures.append(failure)
        if all(n.state.terminal for n in self.nodes):
            self._all_done.set()

    def _mark_lost(self, node: NodeRun, detail: str, code: int | None) -> Failure:
        """Move ``node`` to LOST with ``detail``; the failure that names it."""
        node.detail = detail
        node.set_state(NodeState.LOST)
        node.watch.lose()
        name = node.host.name
        return Failure(
            name,
            None,
            code,
            time.time(),
            f"lost host {name}: " + detail.removeprefix(f"{name}: "),
            list(node.agent_tail),
        )

    async def _watch_progress(self) -> None:
        """Hang detection: no progress for the hang timeout, or one rank lagging."""
        while self.stop_reason is None:
            await asyncio.sleep(1.0)
            live = [
                (node.host.name, record.rank)
                for node in self.nodes
                if not node.state.terminal
                for record in node.ranks.values()
                if not record.exited
            ]
            now = time.monotonic()
            if self.holding is not None and self.holding():
                self.hang.hold(now)
            verdict = self.hang.check(now, live)
            if verdict is not None and self.stop_reason is None:
                await self._on_hang(verdict)
                return

    async def _on_hang(self, verdict: HangVerdict) -> None:
        """Dump every rank's stack, say who is stuck and where, then stop the job."""
        for node in self.nodes:
            for host, rank in verdict.suspects:
                if host == node.host.name and rank in node.ranks:
                    node.ranks[rank].set_health(RankHealth.HUNG)
        self.sink.message(f"hang detected: {verdict.message()}; dumping stacks", style="bold red")
        asking = [n for n in self.nodes if n.proc is not None and not n.state.terminal]
        for node in asking:
            node.stacks = None
            node.stacks_ready.clear()
            assert node.proc is not None
            node.proc.write(encode_op({"op": "dump", "timeout": STACK_TIMEOUT}))
        waits = [asyncio.ensure_future(n.stacks_ready.wait()) for n in asking]
        if waits:
            await asyncio.wait(waits, timeout=STACK_TIMEOUT + 5.0)
            for task in waits:
                task.cancel()
        stacks: dict[tuple[str, int], str] = {}
        for node in asking:
            for entry in node.stacks or []:
                text = str(entry.get("text") or "")
                if not text:
                    text = f"(no stack: {entry.get('error') or 'nothing captured'})\n"
                stacks[(node.host.name, int(entry["rank"]))] = text
        paths = self.hang.write(stacks)
        for line in self.hang.describe(verdict, stacks, paths):
            self.sink.message(line, style="red")
        key = self.hang.culprit(verdict, stacks)
        blamed: str = key[0] if key is not None else self.nodes[0].host.name
        blamed_rank: int | None = key[1] if key is not None else None
        where = self.hang.where(stacks, key)
        stuck = f"; rank {blamed_rank} on {blamed} is stuck in {where[0]}" if where else ""
        message = f"hang: {verdict.message()}{stuck}"
        self._fail(Failure(blamed, blamed_rank, None, time.time(), message, where), EXIT_HANG)

    async def _deadline(self, timeout: float) -> None:
        await asyncio.sleep(timeout)
        if self.stop_reason is None:
            self.sink.message(f"job timed out after {timeout:g} s: stopping", style="bold red")
            self._exit_code = EXIT_TIMEOUT
            self.stop("timeout", JobState.TIMED_OUT)

    # -- main ------------------------------------------------------------------------

    async def run(self, *, handle_signals: bool = True) -> JobResult:
        """Start every node, supervise until all are done, return the result."""
        loop = asyncio.get_running_loop()
        self._exit_code = 0
        if handle_signals:
            for signum in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(signum, self.interrupt)
        self._set_state(JobState.STARTING)
        try:
            master = self.nodes[0].command
            await asyncio.gather(*(self._start_node(n) for n in self.nodes))
            if self.stop_reason is None:
                self.sink.message(
                    f"Waiting for master {master.master_addr}:{master.master_port}...", style="dim"
                )
            self._tasks.append(asyncio.ensure_future(self._heartbeats()))
            self._tasks.append(asyncio.ensure_future(self._watch_hosts()))
            self._tasks.append(asyncio.ensure_future(self._watch_progress()))
            if self.timeout:
                self._tasks.append(asyncio.ensure_future(self._deadline(self.timeout)))
            if all(n.state.terminal for n in self.nodes):
                self._all_done.set()
            await self._all_done.wait()
        finally:
            if handle_signals:
                for signum in (signal.SIGINT, signal.SIGTERM):
                    loop.remove_signal_handler(signum)
            for task in self._tasks:
                task.cancel()
            with contextlib.suppress(BaseException):
                await asyncio.gather(*self._tasks, return_exceptions=True)
        return self._result()

    def _result(self) -> JobResult:
        if self.stop_reason is None:
            if self.state == JobState.STARTING:
                self._set_state(JobState.RUNNING)
            self._set_state(JobState.SUCCEEDED)
        else:
            if self.state != JobState.STOPPING:
                self._set_state(JobState.STOPPING)
            self._set_state(self.stop_state)
        failures = sorted(self.extra_failures, key=lambda f: f.time)
        exit_code = self._exit_code if self.stop_reason else 0
        if self.state == JobState.FAILED and failures:
            exit_code = failures[0].exit_code
        return JobResult(
            job_id=self.job_id,
            state=self.state,
            exit_code=exit_code,
            nodes=self.nodes,
            failures=failures,
            started=self.started,
            ended=time.time(),
            reason=self.stop_reason or "",
        )


def kill_recorded_groups(node_dir: str) -> None:
    """SIGKILL the process groups a local node's agent recorded (its last resort,
    when the agent itself did not finish its teardown)."""
    try:
        text = (Path(node_dir) / "pgids").read_text()
    except OSError:
        return
    for line in text.split():
        with contextlib.suppress(ValueError, OSError):
            os.killpg(int(line), signal.SIGKILL)


def _exit_code_for(code: int | None) -> int:
    if code is None:
        return 1
    if code < 0:
        return EXIT_SIGNAL_BASE - code
    return code
