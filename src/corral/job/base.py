"""A job's state and its subscribers: what every phase of the engine stands on.

:class:`JobBase` holds a job's spec, cluster and policies (validated together
here), its :class:`~corral.job.states.JobMachine` and its subscribers; the
phases build on it in order: :mod:`corral.job.prepare` (sync, pre-flight, the
agents started), :mod:`corral.job.attempts` (launch, supervise, restart) and
:mod:`corral.job.engine` (the :class:`~corral.job.engine.Job` a caller drives).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from corral.checks.gather import AgentSessions
from corral.cluster.model import Cluster, Host
from corral.errors import ConfigError
from corral.job.events import Checked, Finished, JobEvent, Level, Message, StateChanged, Subscriber
from corral.job.headstart import node_agent_argv
from corral.job.options import (
    CheckpointPolicy,
    CheckPolicy,
    RecoveryPolicy,
    RestartPolicy,
    SupervisionPolicy,
    SyncPolicy,
)
from corral.job.result import JobResult
from corral.job.states import JobMachine, JobState
from corral.plan.spec import JobSpec
from corral.transport.base import Transport
from corral.transport.options import SshOptions

if TYPE_CHECKING:
    from corral.checks.result import ChecklistReport
    from corral.job.supervisor import AttemptSupervisor

__all__ = ["JobBase", "agent_argv"]


class JobBase:
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
        #: returns the spec to plan (e.g. re-weighed, see corral.job.drift).
        self.before_restart: Callable[[JobSpec, Cluster], JobSpec] | None = None

    # -- the API ------------------------------------------------------------------------

    @property
    def state(self) -> JobState:
        """Where the job is (see :mod:`corral.job.states`)."""
        return self.machine.state

    def subscribe(self, subscriber: Subscriber) -> None:
        """Send every later event to ``subscriber`` (in order, on the event loop)."""
        self._subscribers.append(subscriber)

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


def agent_argv(spec: JobSpec) -> Any:
    """How each host starts its node agent (its own interpreter, else the job's)."""

    def argv(host: Host) -> list[str]:
        return node_agent_argv(host, spec.python)

    return argv
