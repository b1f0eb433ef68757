"""Attempts: each one launched and supervised (the
:class:`~corral.job.supervisor.AttemptSupervisor`, or the in-place replica groups'),
recorded, and after a failure the restart policy's decision, the backoff, the
re-plan on the surviving hosts and the checkpoint placed for the next one."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from corral.cluster.model import Cluster
from corral.errors import CorralError
from corral.job.agents import abort_all as _abort_all
from corral.job.base import agent_argv
from corral.job.events import AttemptEnded, AttemptStarted
from corral.job.prepare import Preparing
from corral.job.records import job_json, plan_json, result_json, write_json
from corral.job.resolve import Prepared, plan_attempt, resolve
from corral.job.result import EXIT_INTERRUPTED, JobResult
from corral.job.states import JobState, NodeState
from corral.private import private_dir
from corral.recovery.restart import AttemptLog, decide
from corral.transport.base import NodeProcess, Transport

if TYPE_CHECKING:
    from corral.job.supervisor import AttemptSupervisor
    from corral.recovery.keeper import CheckpointKeeper

__all__ = ["Attempting"]


class Attempting(Preparing):
    """A prepared job's attempts, until one succeeds or the policy ends the job."""

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
                write_json(prepared.job_dir / "result.json", result_json(result))
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
                prepared,
                self.spares,
                self.restarts.min_nodes,
                ssh=self.ssh,
                join_timeout=self.recovery.join_seconds,
            )
        spec = prepared.spec
        private_dir(prepared.job_dir)
        write_json(prepared.job_dir / "plan.json", plan_json(prepared))
        write_json(prepared.job_dir / "job.json", job_json(prepared, self.ssh))
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
            agent_argv=agent_argv(spec),
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
