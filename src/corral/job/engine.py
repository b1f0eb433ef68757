"""The job engine: one job from spec to result, driven by the CLI or a server.

Build a :class:`Job` from a :class:`~corral.plan.spec.JobSpec`, a
:class:`~corral.cluster.model.Cluster` and typed policies
(:mod:`corral.job.options`), :meth:`Job.subscribe` to its
:mod:`~corral.job.events`, :meth:`Job.start` it (or ``await job.run()``) and
:meth:`Job.stop` it. One :class:`~corral.job.states.JobMachine` holds the job's
state across attempts and drives the decisions::

    PENDING -> PREPARING  sync (--sync, --sync-script), the pre-flight checklist and,
                          on SSH hosts, the node agents started and probed meanwhile
            -> STARTING -> RUNNING -> STOPPING   one attempt (the AttemptSupervisor)
            -> RESTARTING  backoff, lost hosts dropped, re-plan, checkpoint placed
            -> STARTING ...                      the next attempt
            -> SUCCEEDED | FAILED | TIMED_OUT | CANCELLED

Everything is written under ``<run_dir>/<job-id>/`` (private to the user):
``plan.json`` and ``job.json`` (secret env values redacted), ``attempts.json``,
``result.json`` and ``logs/``. The engine installs no signal handler and prints
nothing: the CLI subscribes a terminal renderer and maps Ctrl-C to :meth:`stop`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import re
import time
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from corral.checks.gather import AgentSessions
from corral.cluster.model import Cluster, Host
from corral.contract import NODE_DIR_ENV
from corral.errors import ConfigError, CorralError
from corral.job.agents import abort_all as _abort_all
from corral.job.agents import alongside, start_local_agents, start_remote
from corral.job.events import (
    AttemptEnded,
    AttemptStarted,
    Checked,
    Finished,
    JobEvent,
    Level,
    Message,
    StateChanged,
    Subscriber,
)
from corral.job.options import (
    CheckpointPolicy,
    CheckPolicy,
    RecoveryPolicy,
    RestartPolicy,
    SupervisionPolicy,
    SyncPolicy,
)
from corral.job.resolve import Prepared, plan_attempt, resolve
from corral.job.result import EXIT_INTERRUPTED, JobResult
from corral.job.states import JobMachine, JobState, NodeState
from corral.plan.launchers.command import template_of
from corral.plan.spec import NODE_LAUNCHERS, JobSpec
from corral.private import private_dir, write_private
from corral.recovery.restart import AttemptLog, decide
from corral.redact import REDACTED, is_secret
from corral.transport.base import NodeProcess, Transport
from corral.transport.choose import transport_for
from corral.transport.options import SshOptions

if TYPE_CHECKING:
    # imported where used: after the agents and the host checks were started, the
    # coordinator loads these while they start (see benchmarks/README.md, launch)
    from corral.checks.result import ChecklistReport
    from corral.job.supervisor import AttemptSupervisor
    from corral.recovery.keeper import CheckpointKeeper

__all__ = ["Job", "Prepared", "dry_run", "job_json", "result_json"]


def dry_run(spec: JobSpec, cluster: Cluster) -> Prepared:
    """The plan of attempt 0 without touching anything (``corral plan``)."""
    return plan_attempt(resolve(spec, cluster, dry_run=True), cluster)


# NAME=value, the value up to the end of its shell word (quoted parts included)
_ASSIGNMENT = re.compile(
    r"""(?<![\w.])([A-Za-z_][A-Za-z0-9_]*)=((?:"[^"]*"|'[^']*'|[^\s;&|<>()"'`])+)"""
)
_MIN_SECRET = 4  # shorter secret env values are not searched for in command words


def redact_words(words: Sequence[str], spec: JobSpec) -> list[str]:
    """``words`` as recorded: the value of every ``NAME=value`` whose name is a secret
    (see :mod:`corral.redact`) and every secret ``--env`` value replaced by
    :data:`~corral.redact.REDACTED`."""
    values = [
        v
        for k, v in spec.env.items()
        if len(v) >= _MIN_SECRET and is_secret(k, spec.secret_env, v)
    ]

    def assignment(match: re.Match[str]) -> str:
        name, value = match.group(1), match.group(2)
        if is_secret(name, spec.secret_env, value.strip("'\"")):
            return f"{name}={REDACTED}"
        return match.group(0)

    out = []
    for word in words:
        for value in values:
            word = word.replace(value, REDACTED)
        out.append(_ASSIGNMENT.sub(assignment, word))
    return out


def job_command(prepared: Prepared) -> list[str]:
    """The job's command as ``job.json`` records it: SCRIPT ARGS, or for a launcher
    that runs its own command per node (``command``, ``madengine``) node 0's
    rendered command; redacted (:func:`redact_words`)."""
    spec = prepared.spec
    if spec.launcher in NODE_LAUNCHERS and prepared.commands:
        return redact_words(prepared.commands[0].argv, spec)
    return redact_words([spec.script, *spec.args], spec)


def job_json(prepared: Prepared, ssh: SshOptions) -> dict[str, Any]:
    """What ``corral logs`` needs later to find the job's hosts again (no secrets:
    the SSH password is never known here, only the name of its variable), and the
    command (per host too for ``command``/``madengine``: each node's differs)."""
    spec = prepared.spec
    per_node = spec.launcher in NODE_LAUNCHERS
    doc: dict[str, Any] = {
        "job_id": prepared.spec.job_id,
        "hosts": [
            {
                "name": c.host.name,
                "address": c.host.address,
                "port": c.host.port,
                "user": c.host.user,
                "local": c.host.local,
                "python": c.host.python,
                "node_dir": c.env.get(NODE_DIR_ENV),
                **({"argv": redact_words(c.argv, spec)} if per_node else {}),
            }
            for c in prepared.commands
        ],
        "ssh": {
            "user": ssh.user,
            "key": ssh.key,
            "port": ssh.port,
            "config": ssh.config,
            "password_env": ssh.password_env,
            # what the user accepted for this job's hosts; `corral logs` connects the same way
            "accept_new_host_keys": ssh.accept_new_host_keys,
            "insecure_no_host_key_check": ssh.insecure_no_host_key_check,
        },
        "launcher": prepared.spec.launcher,
        "command": job_command(prepared),
    }
    if (template := template_of(spec)) is not None:
        doc["command_template"] = redact_words([template], spec)[0]
    return doc


def plan_json(prepared: Prepared) -> dict[str, Any]:
    """``plan.json``: every node's command, secret env values redacted."""
    return {
        "job_id": prepared.spec.job_id,
        "launcher": prepared.spec.launcher,
        "nodes": [c.to_json(redact=True) for c in prepared.commands],
    }


def result_json(result: JobResult) -> dict[str, Any]:
    """A JSON-able record of a finished job (``result.json``)."""
    return {
        "job_id": result.job_id,
        "state": result.state.value,
        "exit_code": result.exit_code,
        "started": result.started,
        "ended": result.ended,
        "reason": result.reason,
        "nodes": [
            {
                "host": n.host.name,
                "state": n.state.value,
                "detail": n.detail,
                "ranks": {str(r.rank): {"code": r.code, "pid": r.pid} for r in n.ranks.values()},
            }
            for n in result.nodes
        ],
        "failures": [
            {
                "host": f.host,
                "rank": f.rank,
                "code": f.code,
                "signal": f.signal,
                "exit_code": f.exit_code,
                "message": f.message,
                "time": f.time,
                "stderr_tail": f.stderr_tail,
                "traceback": f.traceback,
            }
            for f in result.failures
        ],
        "attempts": result.attempts,
        "groups": result.groups,  # --recovery in-place: each group's loss and rejoin
    }


def _write_json(path: Any, data: Any) -> None:
    with contextlib.suppress(OSError):
        write_private(path, json.dumps(data, indent=2, default=str))


class Job:
    """One job: its spec, cluster and policies, its state, its subscribers."""

    def __init__(
        self,
        spec: JobSpec,
        cluster: Cluster,
        *,
        ssh: SshOptions | None = None,
        checks: CheckPolicy | None = None,
        sync: SyncPolicy | None = None,
        restarts: RestartPolicy | None = None,
        checkpoints: CheckpointPolicy | None = None,
        supervision: SupervisionPolicy | None = None,
        recovery: RecoveryPolicy | None = None,
        transport: Transport | None = None,
    ) -> None:
        self.checks = checks or CheckPolicy()
        self.sync = sync or SyncPolicy()
        self.restarts = restarts or RestartPolicy()
        self.checkpoints = checkpoints or CheckpointPolicy()
        self.supervision = supervision or SupervisionPolicy()
        self.ssh = ssh or SshOptions()
        if self.restarts.min_nodes is not None and self.restarts.min_nodes > len(cluster.hosts):
            raise ConfigError(
                f"{self.restarts.min_nodes} is more than the {len(cluster.hosts)} hosts "
                "of the cluster",
                option="--min-nodes",
            )
        self.recovery = recovery or RecoveryPolicy()
        self.recovery.check(spec.launcher, len(cluster.hosts), self.restarts.min_nodes)
        # in-place recovery's spare hosts (the cluster's last ones), held in reserve
        self.spares = cluster.hosts[len(cluster.hosts) - self.recovery.spares :]
        if self.spares:
            cluster = Cluster(cluster.hosts[: -len(self.spares)], source=cluster.source)
        if self.checkpoints.directory:
            spec = dataclasses.replace(
                spec,
                checkpoint_dir=self.checkpoints.directory,
                replicate_checkpoints=self.checkpoints.replicate,
            )
        self.spec = spec
        self.cluster = cluster
        self.python = spec.python  # as given; remote hosts resolve their own
        self._requested_port = spec.master_port
        self.job_id = spec.job_id
        self._transport = transport
        self._subscribers: list[Subscriber] = []
        self.machine = JobMachine(self._state_changed)
        self.attempt = 0
        self._supervisor: AttemptSupervisor | None = None
        self._preparing: asyncio.Task[Any] | None = None
        self._agents: AgentSessions | None = None  # the agents answering the checklist
        self._cancelled: asyncio.Event | None = None  # set by stop(); made in run()
        self._stops = 0
        self._stopped_by: str | None = None
        self._task: asyncio.Task[JobResult] | None = None
        #: Called with the next attempt's spec and cluster before a restart is planned;
        #: returns the spec to plan (e.g. re-weighed, see corral.calibrate.drift).
        self.before_restart: Callable[[JobSpec, Cluster], JobSpec] | None = None

    # -- the API ------------------------------------------------------------------------

    @property
    def state(self) -> JobState:
        """Where the job is (see :mod:`corral.job.states`)."""
        return self.machine.state

    def subscribe(self, subscriber: Subscriber) -> None:
        """Send every later event to ``subscriber`` (in order, on the event loop)."""
        self._subscribers.append(subscriber)

    def start(self) -> asyncio.Task[JobResult]:
        """Start the job on the running event loop; the task's result is the JobResult
        (or the CorralError that kept it from starting)."""
        if self._task is None:
            self._task = asyncio.ensure_future(self.run())
        return self._task

    async def wait(self) -> JobResult:
        """Wait for the started job to end."""
        return await self.start()

    def stop(self, by: str | None = None) -> None:
        """Stop the job (``by`` whom, for its reason; None: Ctrl-C / SIGTERM): before
        launch it is cancelled, during an attempt every node is torn down (SIGTERM,
        SIGKILL after the grace period); a second call kills now."""
        self._stops += 1
        self._stopped_by = by or self._stopped_by
        if self._cancelled is not None:
            self._cancelled.set()
        if self._supervisor is not None and not self.machine.launching:
            self._supervisor.interrupt(self._stopped_by)
        elif self._preparing is not None and not self._preparing.done():
            self._preparing.cancel()

    async def run(self) -> JobResult:
        """Prepare, launch, supervise, restart as the policy allows; the last attempt's
        result. Errors before launch (bad input, a failed check, a host that is not
        ready) raise the CorralError after the job moved to FAILED."""
        self._cancelled = asyncio.Event()
        if self._stops:  # stop() came before run()
            self._cancelled.set()
        transport = self._transport or transport_for(self.cluster, self.ssh)
        try:
            return await self._run(transport)
        finally:
            if self._transport is None:
                await transport.close()

    # -- events -------------------------------------------------------------------------

    def emit(self, event: JobEvent) -> None:
        """Hand ``event`` to every subscriber."""
        for subscriber in self._subscribers:
            subscriber(event)

    def _say(self, text: str, level: Level = "info") -> None:
        self.emit(Message(job_id=self.job_id, text=text, level=level))

    def _state_changed(self, old: JobState, new: JobState, reason: str) -> None:
        self.emit(
            StateChanged(
                job_id=self.job_id, old=old, state=new, attempt=self.attempt, reason=reason
            )
        )

    def _checked(self, report: ChecklistReport, blocking: bool) -> None:
        self.emit(Checked(job_id=self.job_id, report=report, blocking=blocking))

    # -- the run ------------------------------------------------------------------------

    async def _run(self, transport: Transport) -> JobResult:
        try:
            prepared = plan_attempt(resolve(self.spec, self.cluster), self.cluster)
            self.spec = prepared.spec
            history = AttemptLog.load(prepared.job_dir)
            if history.records:
                prepared = plan_attempt(prepared.spec, self.cluster, history.next_number)
            self.attempt = prepared.attempt
            self.machine.to(JobState.PREPARING)
            self._preparing = asyncio.ensure_future(self._prepare(prepared, transport))
            prepared, started = await self._preparing
        except asyncio.CancelledError:
            if not (self._cancelled and self._cancelled.is_set()):
                raise
            self.machine.to(JobState.CANCELLED, "stopped before launch")
            return self._finish(self._empty_result(JobState.CANCELLED, EXIT_INTERRUPTED))
        except CorralError as exc:
            self.machine.to(JobState.FAILED, str(exc))
            raise
        finally:
            self._preparing = None
        if self._cancelled is not None and self._cancelled.is_set():
            await _abort_all(started.values())
            self.machine.to(JobState.CANCELLED, "stopped before launch")
            return self._finish(self._empty_result(JobState.CANCELLED, EXIT_INTERRUPTED))
        return self._finish(await self._attempts(prepared, transport, started, history))

    async def _prepare(
        self, prepared: Prepared, transport: Transport
    ) -> tuple[Prepared, dict[str, NodeProcess]]:
        """Sync, check and start the agents; the plan to launch and the agents started."""
        sync: dict[str, Any] | None = None
        if self.sync.enabled and not self.cluster.is_local:
            from corral.job.presync import sync_before_launch

            sync = await sync_before_launch(
                self.sync,
                prepared.spec,
                self.cluster,
                self.ssh,
                self.python,
                checked=self.checks.enabled,
                say=self._say,
            )
        if self.cluster.is_local:
            if self.checks.enabled:
                return await self._checked_local(prepared, transport, sync)
            return prepared, {}
        if self.checks.enabled:
            return await self._checked_remote(prepared, transport, sync)
        return await self._start_remote(prepared, self.cluster, transport)

    async def _checklist(self, prepared: Prepared, transport: Transport, sync: Any) -> Any:
        """The pre-flight checklist; the agents being started meanwhile
        (``self._agents``) answer it for their hosts."""
        from corral.job.preflight import checklist_options, preflight

        options = checklist_options(
            self.checks,
            prepared.spec,
            self.cluster,
            self.ssh,
            self.python,
            sync,
            in_place=self.recovery.in_place,
            supervision=self.supervision,
        )
        return await preflight(
            options, transport, prepared.spec.run_dir, self._checked, self._agents
        )

    async def _checked_alongside(
        self,
        prepared: Prepared,
        transport: Transport,
        sync: Any,
        sessions: AgentSessions,
        agents: Any,
    ) -> Any:
        """:func:`~corral.job.agents.alongside` of the checklist and ``agents`` (the
        agents' start-up), which answer it for their hosts through ``sessions``
        (``self._agents`` meanwhile; told when the checklist is done, however)."""
        self._agents = sessions

        async def checklist() -> Any:
            try:
                return await self._checklist(prepared, transport, sync)
            finally:
                sessions.finish()  # the agents may be told to exit from now on

        try:
            return await alongside(checklist(), agents)
        finally:
            self._agents = None

    def _replan(self, prepared: Prepared, cluster: Cluster) -> Prepared:
        """The same attempt on a changed cluster (hosts dropped, interfaces set)."""
        self.cluster = cluster
        return plan_attempt(prepared.spec, cluster, prepared.attempt)

    async def _checked_local(
        self, prepared: Prepared, transport: Transport, sync: Any
    ) -> tuple[Prepared, dict[str, NodeProcess]]:
        """The checklist, and meanwhile every simulated node's agent started and probed:
        its interpreter start and imports are off the launch's path, and so are its
        launcher's or ranks' (started with the probe, held at their gates until the
        start message: :mod:`corral.agent.prestart`). Nothing of the job runs until
        the checklist passed."""
        from corral.job.preflight import apply

        hosts = [c.host for c in prepared.commands]
        agents = AgentSessions(h.name for h in hosts)
        held = {c.host.name: c.to_json() for c in prepared.commands}  # started with the probe

        async def warm() -> tuple[None, dict[str, NodeProcess]]:
            argv = _agent_argv(prepared.spec)
            job_id = prepared.spec.job_id
            return None, await start_local_agents(transport, hosts, argv, job_id, agents, held)

        outcome, (_, started) = await self._checked_alongside(
            prepared, transport, sync, agents, warm()
        )
        cluster = apply(outcome, self.cluster)
        if cluster == self.cluster:
            return prepared, started
        keep = {h.name for h in cluster.hosts}
        await _abort_all(started.pop(name) for name in list(started) if name not in keep)
        return self._replan(prepared, cluster), started

    async def _checked_remote(
        self, prepared: Prepared, transport: Transport, sync: Any
    ) -> tuple[Prepared, dict[str, NodeProcess]]:
        """The checklist and the agents' start-up at the same time (both are a Python
        start on every host), each node's launcher or ranks started once its agent
        answered, held at their gates (:mod:`corral.agent.prestart`): nothing of the
        job runs until the checklist passed. The checklist tests the master port,
        so the agents do not (port 0 excepted)."""
        from corral.job.preflight import apply

        agents = AgentSessions(h.name for h in self.cluster.hosts)
        outcome, (planned, started) = await self._checked_alongside(
            prepared,
            transport,
            sync,
            agents,
            self._start_remote(
                prepared, self.cluster, transport, check_port=False, agents=agents, held=True
            ),
        )
        cluster = apply(outcome, self.cluster)
        if cluster == self.cluster:
            return planned, started
        keep = {h.name for h in cluster.hosts}
        await _abort_all(started.pop(name) for name in list(started) if name not in keep)
        pythons = {c.host.name: c.host.python for c in planned.commands}
        resolved = Cluster(
            tuple(dataclasses.replace(h, python=pythons.get(h.name)) for h in cluster.hosts),
            source=cluster.source,
        )
        self.cluster = cluster
        return plan_attempt(planned.spec, resolved, planned.attempt), started

    async def _start_remote(
        self, prepared: Prepared, cluster: Cluster, transport: Transport, **how: Any
    ) -> tuple[Prepared, dict[str, NodeProcess]]:
        """:func:`~corral.job.agents.start_remote` with this job's interpreter."""
        return await start_remote(transport, prepared, cluster, python=self.python, **how)

    # -- attempts -----------------------------------------------------------------------

    def _keeper(self, prepared: Prepared, transport: Transport) -> CheckpointKeeper:
        from corral.recovery.keeper import CheckpointKeeper

        spec = prepared.spec
        return CheckpointKeeper.create(
            transport,
            directory=spec.checkpoint_dir,
            replicate=spec.replicate_checkpoints,
            is_local=self.cluster.is_local,
            python=self.python,
            run_dir=spec.run_dir,
            job_id=spec.job_id,
            say=self._say,
        )

    async def _attempts(
        self,
        prepared: Prepared,
        transport: Transport,
        started: dict[str, NodeProcess],
        history: AttemptLog,
    ) -> JobResult:
        """Supervise attempt after attempt until one succeeds or the machine ends the
        job (see :mod:`corral.recovery.restart`); returns the last attempt's result."""
        initial_hosts = len(self.cluster.hosts)
        if history.records:
            self._say(
                f"job {self.job_id}: {len(history.records)} earlier attempt(s) "
                f"on record; this is attempt {history.next_number}"
            )
        keeper = self._keeper(prepared, transport)
        restarts = 0
        placed: str | None = None
        if history.records:  # a rerun: rank 0 may now be a host without the checkpoint
            try:
                placed = await keeper.place(prepared.spec, prepared.commands)
            except CorralError as exc:
                self._say(f"warning: the latest checkpoint could not be placed: {exc}", "warning")
        try:
            while True:
                hosts = [c.host.name for c in prepared.commands]
                self.attempt = prepared.attempt
                record = history.start(hosts, prepared.world_size, placed)
                keeper.warm(prepared.spec, prepared.commands)
                result = await self._supervise(prepared, transport, started, keeper, placed)
                record.finish(result)
                history.save()
                result.attempts = history.to_json()
                _write_json(prepared.job_dir / "result.json", result_json(result))
                if result.state != JobState.FAILED:
                    self._attempt_ended(record, False, "")
                    self.machine.to(result.state, result.reason)
                    return result
                unreachable = await _unreachable(transport, self.cluster, result)
                decision = decide(
                    self.restarts,
                    result,
                    restarts_done=restarts,
                    hosts=hosts,
                    unreachable=unreachable,
                    initial_hosts=initial_hosts,
                )
                self._attempt_ended(record, decision.restart, decision.reason)
                if not decision.restart:
                    if self.restarts.max_restarts:
                        self._say(f"not restarting: {decision.reason}", "error")
                    self.machine.to(JobState.FAILED, decision.reason)
                    return result
                self.machine.to(JobState.RESTARTING, decision.reason)
                restarts += 1
                delay = self.restarts.delay(restarts)
                self._say(
                    f"attempt {record.number} failed: {record.cause}; {decision.reason} "
                    f"(restart {restarts} of {self.restarts.max_restarts}) in {delay:g} s",
                    "warning",
                )
                if not await self._backoff(delay):
                    result.exit_code = EXIT_INTERRUPTED
                    self.machine.to(JobState.CANCELLED, "stopped while waiting to restart")
                    return result
                try:
                    prepared, started = await self._next_attempt(
                        prepared, transport, decision.hosts, history.next_number
                    )
                    placed = await keeper.place(prepared.spec, prepared.commands)
                except CorralError as exc:
                    await _abort_all(started.values())
                    started = {}
                    self._say(f"not restarting: {exc}", "error")
                    self.machine.to(JobState.FAILED, str(exc))
                    return result
        finally:
            await keeper.close()

    def _attempt_ended(self, record: Any, restart: bool, decision: str) -> None:
        self.emit(
            AttemptEnded(
                job_id=self.job_id,
                number=record.number,
                record=dataclasses.asdict(record),
                restart=restart,
                decision=decision,
            )
        )

    async def _next_attempt(
        self, prepared: Prepared, transport: Transport, keep: Iterable[str], number: int
    ) -> tuple[Prepared, dict[str, NodeProcess]]:
        """Re-plan on the surviving hosts (ranks re-assigned, a new rendezvous id)."""
        names = set(keep)
        cluster = Cluster(
            tuple(h for h in self.cluster.hosts if h.name in names), source=self.cluster.source
        )
        self.cluster = cluster
        spec = prepared.spec
        if not any(spec.master_addr in (h.address, h.name) for h in cluster.hosts):
            spec = dataclasses.replace(spec, master_addr=None)  # its host is gone
        # the port the user asked for (0: any free one, picked again)
        spec = resolve(dataclasses.replace(spec, master_port=self._requested_port), cluster)
        if self.before_restart is not None:
            spec = self.before_restart(spec, cluster)
        nxt = plan_attempt(spec, cluster, number)
        if cluster.is_local:
            return nxt, {}
        return await self._start_remote(nxt, cluster, transport)

    async def _backoff(self, delay: float) -> bool:
        """Wait before a restart; False when the job was stopped meanwhile."""
        assert self._cancelled is not None
        if self._cancelled.is_set():
            return False
        if delay > 0:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._cancelled.wait(), delay)
        return not self._cancelled.is_set()

    async def _supervise(
        self,
        prepared: Prepared,
        transport: Transport,
        started: dict[str, NodeProcess],
        keeper: CheckpointKeeper,
        placed: str | None,
    ) -> JobResult:
        from corral.job.fold import teardown_marker
        from corral.job.logfiles import LogFiles
        from corral.job.supervisor import AttemptSupervisor

        inplace: dict[str, Any] = {}  # the in-place supervisor's own arguments
        supervising: type[AttemptSupervisor] = AttemptSupervisor
        if self.recovery.in_place:  # every node its own replica group (torchft)
            from corral.job import inplace as ip  # the Lighthouse's machinery: only here

            supervising = ip.ReplicaGroupSupervisor
            prepared, inplace = await ip.setup(
                prepared, self.spares, self.restarts.min_nodes, ssh=self.ssh
            )
        spec = prepared.spec
        private_dir(prepared.job_dir)
        _write_json(prepared.job_dir / "plan.json", plan_json(prepared))
        _write_json(prepared.job_dir / "job.json", job_json(prepared, self.ssh))
        logs = LogFiles(prepared.job_dir / "logs", attempt=prepared.attempt)
        marker = teardown_marker(logs).on_event  # where each node's teardown began
        self._subscribers.append(marker)
        self.emit(
            AttemptStarted(
                job_id=self.job_id,
                number=prepared.attempt,
                hosts=[c.host.name for c in prepared.commands],
                world_size=prepared.world_size,
                checkpoint=placed,
                log_dir=str(prepared.job_dir / "logs"),
                launcher=spec.launcher,
                workload_weights=list(spec.workload_weights),
            )
        )
        supervisor = supervising(
            prepared.commands,
            transport,
            self.emit,
            logs=logs,
            job_id=spec.job_id,
            agent_argv=_agent_argv(spec),
            grace=self.supervision.grace,
            timeout=spec.timeout,
            master_timeout=spec.rdzv_timeout,
            require_master=spec.launcher == "torchrun",
            started=started,
            heartbeat_timeout=self.supervision.host_timeout,
            host_timeout=self.supervision.host_timeout,
            hang_timeout=self.supervision.hang_timeout,
            hang_dir=prepared.job_dir / "hang",
            on_report=keeper.on_report,
            holding=keeper.holding,
            machine=self.machine,
            settle=False,
            **inplace,
        )
        self._supervisor = supervisor
        if self._stops:  # stopped while the attempt was being set up
            asyncio.get_running_loop().call_soon(supervisor.interrupt, self._stopped_by)
        try:
            return await supervisor.run()
        finally:
            self._supervisor = None
            self._subscribers.remove(marker)
            logs.close()
            if inplace:
                await inplace["lighthouse"].close()

    # -- the end ------------------------------------------------------------------------

    def _empty_result(self, state: JobState, exit_code: int) -> JobResult:
        now = time.time()
        return JobResult(
            job_id=self.job_id,
            state=state,
            exit_code=exit_code,
            nodes=[],
            failures=[],
            started=now,
            ended=now,
            reason=self.machine.reason,
        )

    def _finish(self, result: JobResult) -> JobResult:
        self.emit(
            Finished(
                job_id=self.job_id,
                state=self.machine.state,
                exit_code=result.exit_code,
                result=result,
            )
        )
        return result


def _agent_argv(spec: JobSpec) -> Any:
    def argv(host: Host) -> list[str]:
        return [host.python or spec.python or "python3", "-m", "corral.agent"]

    return argv


async def _unreachable(transport: Transport, cluster: Cluster, result: JobResult) -> list[str]:
    """The connectivity check between attempts: hosts (not already lost) that do not
    answer an echo within the ping deadline."""
    if cluster.is_local:
        return []
    from corral.fleet.ping import failed_hosts, ping_hosts

    alive = [n.host for n in result.nodes if n.state != NodeState.LOST]
    if not alive:
        return []
    return failed_hosts(await ping_hosts(transport, alive))
