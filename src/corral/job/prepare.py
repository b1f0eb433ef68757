"""The PREPARING phase: code sync, the pre-flight checklist and, meanwhile, every
node's agent started and probed (its launcher or ranks held at their gates until
the checklist passed, :mod:`corral.agent.prestart`)."""

from __future__ import annotations

import dataclasses
from typing import Any

from corral.checks.gather import AgentSessions
from corral.cluster.model import Cluster
from corral.job.agents import abort_all as _abort_all
from corral.job.agents import alongside, start_local_agents, start_remote
from corral.job.base import JobBase, agent_argv
from corral.job.resolve import Prepared, plan_attempt
from corral.transport.base import NodeProcess, Transport

__all__ = ["Preparing"]


class Preparing(JobBase):
    """A job's preparation before its first launch (and a restart's agents)."""

    async def _prepare(
        self, prepared: Prepared, transport: Transport
    ) -> tuple[Prepared, dict[str, NodeProcess]]:
        """Sync, check and start the agents; the plan to launch and the agents started."""
        sync: dict[str, Any] | None = None
        if self.sync.enabled and not self.cluster.is_local:
            from corral.job.preflight import with_spares
            from corral.job.presync import sync_before_launch

            sync = await sync_before_launch(
                self.sync,
                prepared.spec,
                with_spares(self.cluster, self.spares),  # a spare needs the code too
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
        from corral.job.preflight import checklist_options, preflight, usable_spares

        options = checklist_options(
            self.checks,
            prepared.spec,
            self.cluster,
            self.ssh,
            self.python,
            sync,
            in_place=self.recovery.in_place,
            supervision=self.supervision,
            spares=self.spares,
            join_timeout=self.recovery.join_seconds,
        )
        outcome = await preflight(
            options, transport, prepared.spec.run_dir, self._checked, self._agents
        )
        usable = usable_spares(outcome, self.spares)  # a spare that failed: not used
        if usable != self.spares:
            dropped = ", ".join(h.name for h in self.spares if h not in usable)
            kept = ", ".join(h.name for h in usable) or "none"
            self._say(
                f"spare host(s) {dropped} failed the pre-flight (the spares row above says "
                f"why) and will not replace a lost node; spares left: {kept}",
                "warning",
            )
        self.spares = usable
        return outcome

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
            argv = agent_argv(prepared.spec)
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
