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

The phases live in their own modules, each class building on the one before:
:mod:`~corral.job.base` (state, subscribers), :mod:`~corral.job.prepare`
(PREPARING), :mod:`~corral.job.attempts` (launch, supervise, restart) and
:mod:`~corral.job.records` (what is written down).
"""

from __future__ import annotations

import asyncio

from corral.cluster.model import Cluster
from corral.errors import CorralError
from corral.job.agents import abort_all as _abort_all
from corral.job.attempts import Attempting
from corral.job.headstart import first_plan
from corral.job.records import job_json, redact_words, result_json
from corral.job.resolve import Prepared, plan_attempt, resolve
from corral.job.result import EXIT_INTERRUPTED, JobResult
from corral.job.states import JobState
from corral.plan.spec import JobSpec
from corral.transport.base import Transport
from corral.transport.choose import transport_for

__all__ = ["Job", "Prepared", "dry_run", "job_json", "redact_words", "result_json"]


def dry_run(spec: JobSpec, cluster: Cluster) -> Prepared:
    """The plan of attempt 0 without touching anything (``corral plan``)."""
    return plan_attempt(resolve(spec, cluster, dry_run=True), cluster)


class Job(Attempting):
    """One job: build it, :meth:`subscribe` to it, :meth:`start` or :meth:`run` it,
    :meth:`stop` it."""

    # -- the API ------------------------------------------------------------------------

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

    # -- the run ------------------------------------------------------------------------

    async def _run(self, transport: Transport) -> JobResult:
        try:
            prepared, history = first_plan(self.spec, self.cluster)
            self.spec = prepared.spec
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
