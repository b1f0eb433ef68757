"""The supervisor of one attempt: starts every node's agent, streams, watches, tears down.

It talks to one :mod:`corral.agent` per node through any
:class:`~corral.transport.base.Transport`. On the first failure of any rank
(or a lost host, a hang, the ``--timeout`` deadline, a stop request) it moves
the job to STOPPING and asks every agent to stop (SIGTERM to the node's process
groups, SIGKILL after the grace period); a second stop request kills at once.
Everything it sees goes out as :mod:`corral.job.events` through ``emit``; every
rank's output is also written to the job's :class:`~corral.job.logfiles.LogFiles`.
Whether a failure still stops the job, and whether a node that ended was
stopped or failed, is read from the shared :class:`~corral.job.states.JobMachine`.
How the attempt ends is decided once, by the first stop (a failure, the deadline,
an interrupt), as an :class:`Outcome`: the state it ends in, its exit code and the
failure that caused it; :meth:`AttemptSupervisor.run` returns the result built from it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from corral.agent.protocol import EVENT, NODE, STDERR, encode_op, read_frame
from corral.cluster.model import Host
from corral.contract import NODE_DIR_ENV
from corral.defaults import DEFAULT_GRACE
from corral.diagnose.stragglers import StragglerScores
from corral.errors import CorralError
from corral.job.events import (
    HangReported,
    JobEvent,
    Level,
    LogLines,
    Message,
    NodeChanged,
    Progress,
    RankExited,
    StragglerFound,
)
from corral.job.logfiles import OUTPUT_LIMIT_ENV, LogFiles
from corral.job.result import (
    EXIT_HANG,
    EXIT_INTERRUPTED,
    EXIT_LAUNCH,
    EXIT_LOST,
    EXIT_SIGNAL_BASE,
    EXIT_TIMEOUT,
    STDERR_TAIL,
    Failure,
    JobResult,
    NodeReport,
    NodeRun,
    RankRecord,
    signal_name,
)
from corral.job.rootcause import counts_after_stop, ordered, precedes, rank_failure
from corral.job.states import JobMachine, JobState, NodeState
from corral.plan.spec import NodeCommand
from corral.recovery.hang import HangVerdict
from corral.recovery.hangwatch import HangWatch
from corral.recovery.health import (
    DEFAULT_HOST_TIMEOUT,
    HostHealth,
    HostWatch,
    RankHealth,
)
from corral.signals import stop_on_signals
from corral.transport.base import NodeProcess, Transport

INTERRUPTED_SAY = "interrupted: stopping every node (Ctrl-C again to kill now)"
STACK_TIMEOUT = 10.0  # seconds a node may take to dump its ranks' stacks


@dataclass(frozen=True)
class Outcome:
    """How an attempt ends: ``state`` (SUCCEEDED, or what the stop decided: FAILED,
    TIMED_OUT, CANCELLED), the ``exit_code`` corral exits with, ``reason`` (why the
    teardown started: ``failure``, ``timeout``, ``interrupted``; empty for a success)
    and ``cause``, the failure behind it (the earliest one, once the attempt ended)."""

    state: JobState
    exit_code: int = 0
    reason: str = ""
    cause: Failure | None = None
    decided: float | None = None  # when the teardown was decided (coordinator clock)


SUCCESS = Outcome(JobState.SUCCEEDED)


class AttemptSupervisor:
    """Runs planned NodeCommands through a transport and supervises them."""

    def __init__(
        self,
        commands: Sequence[NodeCommand],
        transport: Transport,
        emit: Callable[[JobEvent], None],
        *,
        logs: LogFiles,
        job_id: str,
        agent_argv: Callable[[Host], list[str]],
        grace: float = DEFAULT_GRACE,
        timeout: float | None = None,
        heartbeat_interval: float = 2.0,
        heartbeat_timeout: float = DEFAULT_HOST_TIMEOUT,
        master_timeout: float = 300.0,
        require_master: bool = True,
        started: Mapping[str, NodeProcess] | None = None,
        host_timeout: float = DEFAULT_HOST_TIMEOUT,
        hang_timeout: float | None = None,
        hang_dir: Path | None = None,
        on_report: Callable[[NodeRun, dict[str, Any]], None] | None = None,
        holding: Callable[[], bool] | None = None,
        machine: JobMachine | None = None,
        settle: bool = True,
    ) -> None:
        now = time.monotonic()
        self.nodes = [
            NodeRun(command=c, watch=HostWatch(c.host.name, now), listener=self._node_changed)
            for c in commands
        ]
        self.transport = transport
        self.emit = emit
        self.logs = logs
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
        self.stragglers = StragglerScores()  # sdk.section timings -> named stragglers
        self.on_report = on_report
        # True while the job waits on corral itself (a checkpoint copy a save waits for)
        self.holding = holding
        # the job's state machine (shared with the engine, which decides what follows a
        # stopped attempt when ``settle`` is False)
        self.machine = machine or JobMachine()
        self.settle = settle
        self.decision: Outcome | None = None  # decided by the first stop, never changed
        self.extra_failures: list[Failure] = []
        self._earliest: Failure | None = None  # the earliest failure announced so far
        self._interrupts = 0
        self._complained: set[str] = set()
        self._all_done = asyncio.Event()
        self._tasks: list[asyncio.Task[Any]] = []
        self._master_ready = False
        self.started = time.time()

    # -- state -----------------------------------------------------------------------

    @property
    def state(self) -> JobState:
        """The job's state (see :mod:`corral.job.states`)."""
        return self.machine.state

    def _set_state(self, new: JobState, reason: str = "") -> None:
        self.machine.to(new, reason)

    def _node_changed(self, node: NodeRun) -> None:
        self.emit(
            NodeChanged(
                job_id=self.job_id, host=node.host.name, state=node.state, detail=node.detail
            )
        )

    def _say(self, text: str, level: Level = "info") -> None:
        self.emit(Message(job_id=self.job_id, text=text, level=level))

    def _lines(self, host: str, rank: int, data: bytes) -> None:
        was_full = self.logs.full
        if self.logs.write(host, rank, data):
            self.emit(LogLines(job_id=self.job_id, time=0.0, host=host, rank=rank, data=data))
        elif not was_full:
            self._say(
                f"the job's output passed {self.logs.limit} bytes: the rest is not kept on "
                f"the coordinator ({OUTPUT_LIMIT_ENV})",
                "warning",
            )

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
                Failure.not_started(cmd.host.name, time.time(), f"could not start the node: {exc}"),
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
            self._lines(node.host.name, NODE, line)

    async def _read_frames(self, node: NodeRun) -> None:
        assert node.proc is not None
        reader = node.proc.stdout
        host = node.host.name
        try:
            while (frame := await read_frame(reader)) is not None:
                node.frame_at = time.time()
                node.watch.heard(time.monotonic())
                kind, rank, payload = frame
                if kind == EVENT:
                    try:
                        event = _parse_event(payload)
                    except ValueError as exc:  # never let a bad event end the reader
                        self._complain(node, str(exc))
                        continue
                    self._on_event(node, event)
                    continue
                self._lines(host, rank, payload)
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
                code, node.detail = EXIT_LOST, str(exc)
            lost = getattr(node.proc, "lost", None)  # the SSH transport says why it broke
            if lost is not None and not node.detail:
                node.detail = str(lost)
            self._node_gone(node, code)

    def _complain(self, node: NodeRun, why: str) -> None:
        """An invalid event from a node's agent: dropped, said once per node."""
        if node.host.name in self._complained:
            return
        self._complained.add(node.host.name)
        self._say(f"{node.host.name}: dropped {why} (further ones are dropped silently)", "warning")

    def _score_sections(self, host: str, rank: int, event: Mapping[str, Any]) -> None:
        """A report's ``sdk.section`` timings: emit the stragglers they name."""
        sections, step = event.get("sections"), event.get("step")
        if not isinstance(sections, dict) or not sections:
            return
        step = step if isinstance(step, int) and not isinstance(step, bool) else None
        for found in self.stragglers.observe(host, rank, step, sections):
            self.emit(
                StragglerFound(
                    job_id=self.job_id,
                    host=found.host,
                    rank=found.rank,
                    section=found.section,
                    ratio=round(found.ratio, 3),
                    basis=found.basis,
                    span=found.span,
                    step=found.step,
                    text=found.message(),
                )
            )

    def _rank(self, node: NodeRun, rank: int) -> RankRecord:
        record = node.ranks.get(rank)
        if record is None:
            record = node.ranks[rank] = RankRecord(host=node.host.name, rank=rank)
        return record

    # -- events ------------------------------------------------------------------------

    def _on_event(self, node: NodeRun, event: dict[str, Any]) -> None:
        name = event.get("event")
        if isinstance(event.get("time"), (int, float)):
            # every event bounds the offset again: a frame read late (a busy coordinator,
            # a buffered pipe) only ever overstates it, so the least seen is the best
            received = node.frame_at or time.time()
            node.bound_offset(received - float(event["time"]))
        if name == "started":
            # failures on different hosts are ordered on one clock: ours (the offset
            # also absorbs the transit delay, which is small next to real skew; not our
            # own parsing of the event: the first builds the validators, 0.1-1 s)
            received = node.frame_at or time.time()
            node.clock_offset = received - float(event["time"])
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
            self._score_sections(node.host.name, record.rank, event)
            metrics = event.get("metrics")
            self.emit(
                Progress(
                    job_id=self.job_id,
                    time=node.made_at(event.get("time")),
                    host=node.host.name,
                    rank=record.rank,
                    step=event.get("step"),
                    total=event.get("total"),
                    metrics=metrics if isinstance(metrics, dict) else {},
                    gpu=event.get("gpu"),
                )
            )
        elif name == "stacks":
            node.stacks = list(event.get("stacks") or [])
            node.stacks_ready.set()
        elif name == "master_ready":
            self._master_ready = True
            self._say(
                f"Master node {event['addr']}:{event['port']} is ready for connections "
                + self._master_role(),
                "success",
            )
        elif name == "master_timeout":
            text = (
                f"master {event['addr']}:{event['port']} did not accept connections "
                f"within {event['timeout']:g} s"
            )
            if self.require_master:
                self._fail(
                    Failure.not_started(
                        node.host.name, node.failure_time(float(event["time"])), text
                    ),
                    EXIT_LAUNCH,
                )
            else:
                self._say(f"warning: {text}", "warning")
        elif name == "start_failed":
            node.detail = str(event.get("error"))
            node.report = NodeReport(started=False)
            failure = Failure.not_started(
                node.host.name,
                node.failure_time(float(event["time"])),
                f"could not start the node: {node.detail}",
            )
            node.fault = node.fault or failure
            self._fail(failure, EXIT_LAUNCH)
        elif name == "node_exit":
            code = int(event.get("code") or 0)
            node.report = NodeReport(code=code)
            if (
                code
                and node.fault is None
                and not any(r.code for r in node.ranks.values())
                and not self.machine.stopping
            ):
                # torchrun itself failed (rendezvous timeout, bad arguments) before any
                # rank reported a failure; a launcher that exits non-zero because corral
                # stopped it was stopped, not failed
                node.fault = Failure(
                    node.host.name,
                    None,
                    code,
                    node.failure_time(float(event["time"])),
                    f"the launcher on {node.host.name} exited with code {code}",
                    list(node.agent_tail),
                )
                self._fail(node.fault, _exit_code_for(code))

    def _on_rank_exit(self, node: NodeRun, event: dict[str, Any]) -> None:
        record = self._rank(node, int(event["rank"]))
        if record.exited:
            return  # already settled; the first report wins
        record.exited = True
        record.set_health(RankHealth.EXITED)
        record.code = event.get("code")
        record.pid = event.get("pid") or record.pid
        host_time = event.get("eof_time") or event.get("time")
        record.time = node.failure_time(float(host_time)) if host_time is not None else None
        record.error = event.get("error")
        exited = sum(1 for r in node.ranks.values() if r.exited)
        self.emit(
            RankExited(
                job_id=self.job_id,
                host=node.host.name,
                rank=record.rank,
                code=record.code,
                last=exited >= max(node.command.nproc, len(node.ranks)),
            )
        )
        if record.code == 0:
            return
        stopped_at = self.decision.decided if self.decision is not None else None
        late = stopped_at is not None and (record.time or 0) >= stopped_at
        teardown = bool(event.get("teardown"))
        if not counts_after_stop(record.code, by_teardown=teardown, stopped_late=late):
            return
        failure = rank_failure(record, node.failure_time, by_teardown=teardown)
        node.fault = node.fault or failure
        self._fail(failure, _exit_code_for(record.code))

    def _node_gone(self, node: NodeRun, code: int) -> None:
        node.ended = time.time()
        if not node.state.terminal:
            settled = node.settled(stopping=self.machine.stopping)
            if settled is NodeState.LOST:
                detail = node.detail or (
                    f"agent exited with code {code} without reporting"
                    if code >= 0
                    else f"agent killed by {signal_name(code)}"
                )
                failure = self._mark_lost(node, detail, code)
                if not self.machine.stopping:
                    self._fail(failure, EXIT_LOST)
            else:
                node.set_state(settled)
        if all(n.state.terminal for n in self.nodes):
            self._all_done.set()

    # -- failure and teardown --------------------------------------------------------

    def _fail(self, failure: Failure, exit_code: int) -> None:
        failure.exit_code = exit_code
        self.extra_failures.append(failure)
        if not self.machine.stopping:
            self._earliest = failure
            self._say(failure.message + ": stopping the job", "error")
            self.stop(Outcome(JobState.FAILED, exit_code, "failure", failure))
            return
        trigger = self.decision.cause if self.decision is not None else None
        earliest = self._earliest
        if trigger is not None and earliest is not None and precedes(failure, earliest):
            # reported after the stop but explains it (a SIGKILLed peer, which torchrun
            # reports late; an earlier error): the root cause, as the summary will say
            self._earliest = failure
            self._say(f"root cause: {failure.message} (before {trigger.message})", "error")

    def _master_role(self) -> str:
        """What the master endpoint is to the ranks (torchrun's is its rendezvous)."""
        if self.require_master:
            return (
                "(torchrun's c10d rendezvous endpoint; the ranks' MASTER_PORT is one torchrun "
                "picks)"
            )
        return "(the ranks' MASTER_ADDR:MASTER_PORT)"

    def stop(self, outcome: Outcome) -> None:
        """Decide how the attempt ends and tear every node down (once): stop, then
        kill after the grace period."""
        if self.machine.stopping:
            return
        self.decision = replace(outcome, decided=time.time())
        self._set_state(JobState.STOPPING, outcome.reason)
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
                    kill_recorded_groups(node.command.env.get(NODE_DIR_ENV, ""))

    def interrupt(self, by: str | None = None) -> None:
        """A stop request (``by`` whom; None: Ctrl-C / SIGTERM to corral): teardown
        once, kill at the second. The reason reads the same in every view."""
        self._interrupts += 1
        if self._interrupts == 1:
            reason = f"stopped by {by or 'Ctrl-C or SIGTERM'}"
            # a terminal's Ctrl-C may come again; another requester's words are neutral
            said = f"{reason}: stopping every node" if by else INTERRUPTED_SAY
            self._say(said, "warning")
            self.stop(Outcome(JobState.CANCELLED, EXIT_INTERRUPTED, reason))
        else:
            self._say("killing every node now", "error")
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
                if change == HostHealth.SILENT and not self.machine.stopping:
                    self._say(
                        f"no heartbeat from {node.host.name} for "
                        f"{node.watch.silence(now):.0f} s (lost after {self.host_timeout:g} s)",
                        "warning",
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
        if not self.machine.stopping:
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
        while not self.machine.stopping:
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
            if verdict is not None and not self.machine.stopping:
                await self._on_hang(verdict)
                return

    async def _on_hang(self, verdict: HangVerdict) -> None:
        """Dump every rank's stack, say who is stuck and where, then stop the job."""
        for node in self.nodes:
            for host, rank in verdict.suspects:  # not a rank of a torn-down node on it
                if host == node.host.name and rank in node.ranks and not node.ranks[rank].exited:
                    node.ranks[rank].set_health(RankHealth.HUNG)
        self._say(f"hang detected: {verdict.message()}; dumping stacks", "error")
        asking = [n for n in self.nodes if n.proc is not None and not n.state.terminal]
        wait = self._trace_wait()
        for node in asking:
            node.stacks = None
            node.stacks_ready.clear()
            assert node.proc is not None
            node.proc.write(encode_op({"op": "dump", "timeout": STACK_TIMEOUT, "trace_wait": wait}))
        waits = [asyncio.ensure_future(n.stacks_ready.wait()) for n in asking]
        if waits:  # the job is stopped only once every node answered, or could have
            await asyncio.wait(waits, timeout=STACK_TIMEOUT + wait + 5.0)
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
            self._say(line, "error")
        traces = {  # the flight recorder dumps the agents collected
            int(entry["rank"]): str(entry["trace"])
            for node in asking
            for entry in node.stacks or []
            if entry.get("trace")
        }
        trace_errors = {
            int(entry["rank"]): str(entry["trace_error"])
            for node in asking
            for entry in node.stacks or []
            if entry.get("trace_error") and not entry.get("trace")
        }
        trace_errors.update(
            {
                int(rank): f"{node.host.name} sent no dumps within {STACK_TIMEOUT + wait + 5.0:g} s"
                for node in asking
                if node.stacks is None
                for rank in node.ranks
            }
        )
        from corral.diagnose.hangreport import write_hang_report  # only once a rank hangs

        report, report_path = write_hang_report(
            self.hang.directory, verdict.message(), stacks, paths, traces, trace_errors
        )
        self._say(report["summary"] + (f" (report: {report_path})" if report_path else ""), "error")
        self.emit(HangReported.of(self.job_id, report, str(report_path) if report_path else None))
        blamed, blamed_rank, stuck, where, label = self.hang.blame(verdict, stacks, report)
        if report_path is not None:
            where = [*where, f"hang report: {report_path}"]
        message = f"hang: {verdict.message()}{stuck}"
        failure = Failure(
            blamed or self.nodes[0].host.name,
            blamed_rank,
            None,
            time.time(),
            message,
            where,
            tail=label,
        )
        self._fail(failure, EXIT_HANG)

    def _trace_wait(self) -> float:
        """How long the agents wait for the flight recorder dumps (the job's
        ``CORRAL_TRACE_WAIT``; a bad value is said and the default used)."""
        from corral.agent.flight import TRACE_WAIT, trace_wait

        try:
            return trace_wait(self.nodes[0].command.env) if self.nodes else TRACE_WAIT
        except ValueError as exc:
            self._say(f"{exc}; waiting {TRACE_WAIT:g} s", "warning")
            return TRACE_WAIT

    async def _deadline(self, timeout: float) -> None:
        await asyncio.sleep(timeout)
        if not self.machine.stopping:
            self._say(f"job timed out after {timeout:g} s: stopping", "error")
            self.stop(Outcome(JobState.TIMED_OUT, EXIT_TIMEOUT, "timeout"))

    # -- main ------------------------------------------------------------------------

    async def run(self, *, handle_signals: bool = False) -> JobResult:
        """Start every node, supervise until all are done, return the result."""
        signals = contextlib.ExitStack()
        if handle_signals:
            signals.enter_context(stop_on_signals(self.interrupt))
        self._set_state(JobState.STARTING)
        try:
            # no node hosts a master endpoint for some launchers (MLX): nothing to wait for
            master = next((n.command for n in self.nodes if n.command.hosts_master), None)
            await asyncio.gather(*(self._start_node(n) for n in self.nodes))
            if master is not None and not self.machine.stopping:
                what = "torchrun's rendezvous endpoint" if self.require_master else "master"
                self._say(
                    f"Waiting for {what} {master.master_addr}:{master.master_port}...", "detail"
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
            signals.close()
            self.logs.flush()
            for task in self._tasks:
                task.cancel()
            # the tasks' own errors are returned, not raised; a cancellation of this
            # attempt itself propagates
            await asyncio.gather(*self._tasks, return_exceptions=True)
        return self._result()

    def outcome(self) -> Outcome:
        """How the attempt ended: what the stop decided (a failed one: the exit code
        and cause of its earliest failure), else SUCCEEDED."""
        if self.decision is None:
            return SUCCESS
        failures = ordered(self.extra_failures)
        if self.decision.state == JobState.FAILED and failures:
            return replace(self.decision, exit_code=failures[0].exit_code, cause=failures[0])
        return self.decision

    def _result(self) -> JobResult:
        """The attempt's result, from its :meth:`outcome`; with ``settle`` the machine
        moves to it too (the engine settles it itself: a failed attempt may become
        RESTARTING)."""
        if self.decision is None and self.state == JobState.STARTING:
            self._set_state(JobState.RUNNING)
        outcome = self.outcome()
        if self.settle:
            self._set_state(outcome.state, outcome.reason)
        return JobResult(
            job_id=self.job_id,
            state=outcome.state,
            exit_code=outcome.exit_code,
            nodes=self.nodes,
            failures=ordered(self.extra_failures),
            started=self.started,
            ended=time.time(),
            reason=outcome.reason,
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


def _parse_event(payload: bytes) -> dict[str, Any]:
    """An agent's event frame, validated (:func:`corral.agent.events.parse_event`).
    Its validators (pydantic) are built at the first event, not at the start: an
    agent sends none before its launcher has imported torch, so building them then
    does not slow that import down."""
    from corral.agent.events import parse_event

    return parse_event(payload)
