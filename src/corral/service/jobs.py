"""The job manager: plan, dispatch, watch, stop, list; one supervisor process per job.

Dispatch starts ``python -m corral.service.launch`` (:mod:`corral.service.launch`)
in its own session and hands it the job over stdin; it runs the job with the
engine ``corral run`` uses and appends every event to ``events.jsonl`` in the
job's run dir. The manager *ingests* that file (:meth:`JobManager.ingest_once`,
every fraction of a second): the job's state, nodes, ranks, attempts and
structured events go to the store; log lines stay in the run dir and are read
from the file by the output and SSE routes. So the server can be killed and
started again without stopping training: on start (:meth:`JobManager.reattach`)
it goes on ingesting the jobs whose supervisor is alive and marks the others
``lost`` with the reason.

Job states: ``planned`` (a plan, nothing started) and ``queued`` (waiting for
machines, see :mod:`corral.service.scheduler`), then the engine's states
(:class:`corral.job.states.JobState`), and ``lost`` (the supervisor ended
without a result).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
from sqlalchemy import delete, func, select, update

from corral.errors import Conflict, Forbidden, Invalid, NotFound
from corral.job.resolve import new_job_id
from corral.private import append_private, private_dir
from corral.service.eventlog import EVENTS_FILE, LoggedEvent, append_event, read_events
from corral.service.launch import LaunchRequest, job_dir
from corral.service.machines import ACTIVE_STATES, MachineService, busy_machines
from corral.service.models import (
    DispatchIn,
    DistributedJobStatus,
    JobList,
    JobRequest,
    JobSummary,
    NodeStatus,
    OutputPage,
    PlanOut,
    StopOut,
    WorkloadWeight,
)
from corral.service.planner import (
    Selection,
    execution_plan,
    has_secrets,
    launch_request,
    select_machines,
    stored_request,
)
from corral.service.settings import ServerSettings
from corral.store import Store
from corral.store.models import Attempt, Event, Job, Machine, Node, Preference, Rank

TERMINAL_STATES = ("succeeded", "failed", "timed_out", "cancelled", "lost")
WAITING_STATES = ("planned", "queued")
FINAL_EVENTS = ("finished", "error", "lost")
"""The last event of a job's events file."""
FILE_ALIASES = {
    "result": "result.json",
    "plan": "plan.json",
    "job": "job.json",
    "attempts": "attempts.json",
    "events": EVENTS_FILE,
    "supervisor_log": "supervisor.log",
}
SERVER_ONLY_ENV = ("CORRAL_TOKEN",)
"""Variables of the server that its jobs' supervisors never inherit."""


@dataclass
class _Supervisor:
    pid: int
    started: float
    proc: subprocess.Popen[bytes] | None = None


def _alive(pid: int | None, started: float | None) -> bool:
    """Whether process ``pid`` still runs and is the one started at ``started``."""
    if pid is None:
        return False
    try:
        proc = psutil.Process(pid)
        if started is not None and abs(proc.create_time() - started) > 1.0:
            return False
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


class JobManager:
    """Jobs over the store: planning, supervisor processes, ingest, status, output."""

    def __init__(self, store: Store, settings: ServerSettings, machines: MachineService) -> None:
        self.store = store
        self.settings = settings
        self.machines = machines
        self._requests: dict[str, JobRequest] = {}  # planned jobs, secret values included
        self._children: dict[str, subprocess.Popen[bytes]] = {}
        self._stop_sent: set[str] = set()
        self._waiters: dict[str, asyncio.Event] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ingesting = threading.Lock()
        self.on_finished: list[Any] = []  # callbacks(job_id) when a job ends (scheduler)

    # -- planning ------------------------------------------------------------------------

    def _preferred(self) -> list[str]:
        with self.store.session() as s:
            pref = s.get(Preference, "distributed")
        return list((pref.value if pref else {}).get("preferred_machines", []))

    def select(self, request: JobRequest, busy: dict[str, list[str]] | None = None) -> Selection:
        """The machines ``request`` would run on now (Conflict when it cannot)."""
        busy = busy_machines(self.store) if busy is None else busy
        with self.store.session() as s:
            machines = list(s.scalars(select(Machine).order_by(Machine.name)).all())
        chosen = None
        if request.machine_selection == "manual":
            if not request.selected_machines:
                raise Invalid(
                    "machine_selection manual needs selected_machines",
                    details={"field": "selected_machines"},
                )
            if len(set(request.selected_machines)) != len(request.selected_machines):
                raise Invalid(
                    "selected_machines names a machine twice",
                    details={"field": "selected_machines"},
                )
            chosen = self.machines.rows(request.selected_machines)
        return select_machines(machines, request, busy, self._preferred(), chosen)

    def plan(
        self,
        request: JobRequest,
        *,
        kind: str = "distributed",
        task_id: str | None = None,
        job_id: str | None = None,
    ) -> PlanOut:
        """Choose machines, build the execution plan and store the job as ``planned``."""
        selection = self.select(request)
        job_id = job_id or new_job_id()
        launch = launch_request(job_id, request, selection.chosen, self.settings)
        plan = execution_plan(launch, selection)
        with self.store.session() as s:
            row = s.get(Job, job_id)
            if row is None:
                row = Job(id=job_id, created=time.time())
                s.add(row)
            row.kind = kind
            row.state = "planned"
            row.request = stored_request(request)
            row.plan = plan
            row.machine_ids = [m.id for m in selection.chosen]
            row.master = plan["master"]["host"]
            row.world_size = int(plan["world_size"])
            row.task_id = task_id
            row.run_dir = str(job_dir(self.settings.run_dir, job_id))
        self._requests[job_id] = request
        return PlanOut(job_id=job_id, status="planned", execution_plan=plan)

    def execute_here(self, request: JobRequest) -> DistributedJobStatus:
        """Run a job on the server's own machine (one local node), now."""
        import socket

        name = socket.gethostname().split(".")[0] or "localhost"
        here = Machine(
            id="",
            name=name,
            address="127.0.0.1",
            slots=request.nproc_per_node or 1,
            local=True,
            labels={},
            created=time.time(),
            status="online",
            capabilities={},
            load={},
        )
        selection = Selection(chosen=[here], reasons={"": ["the server's own machine"]})
        job_id = new_job_id()
        launch = launch_request(job_id, request, [here], self.settings)
        plan = execution_plan(launch, selection)
        with self.store.session() as s:
            s.add(
                Job(
                    id=job_id,
                    kind="local",
                    state="planned",
                    request=stored_request(request),
                    plan=plan,
                    machine_ids=[],
                    master=name,
                    world_size=int(plan["world_size"]),
                    created=time.time(),
                    run_dir=str(job_dir(self.settings.run_dir, job_id)),
                )
            )
        self._claim(job_id)
        self._launch(job_id, launch)
        return self.status(job_id)

    # -- dispatch ------------------------------------------------------------------------

    def row(self, job_id: str) -> Job:
        """The job's row (NotFound when unknown)."""
        with self.store.session() as s:
            row = s.get(Job, job_id)
        if row is None:
            raise NotFound(f"no job {job_id!r}", details={"job_id": job_id})
        return row

    def _request_of(self, row: Job) -> JobRequest:
        request = self._requests.get(row.id)
        if request is not None:
            return request
        request = JobRequest.model_validate(row.request)
        if has_secrets(request):
            raise Conflict(
                f"job {row.id} was planned with secret env values, which the server keeps "
                "only in memory and lost when it restarted: plan the job again",
                details={"job_id": row.id},
            )
        return request

    def dispatch(self, body: DispatchIn) -> DistributedJobStatus:
        """Start a planned job's supervisor (pre-flight first, unless the request
        turned it off). Conflict when it is not ``planned`` or its machines are busy."""
        row = self.row(body.job_id)
        if row.state not in WAITING_STATES:
            raise Conflict(
                f"job {row.id} is {row.state}: only a planned job can be dispatched",
                details={"job_id": row.id, "status": row.state},
            )
        self._check_seed_fields(row, body)
        self.start(row)
        return self.status(row.id)

    def _check_seed_fields(self, row: Job, body: DispatchIn) -> None:
        """The seed's dispatch body repeats the plan; what it says must agree."""
        plan = row.plan or {}
        names = [m["name"] for m in plan.get("machines", [])]
        wrong: dict[str, Any] = {}
        if (
            body.target_machine is not None
            and body.target_machine not in names
            and not any(m.get("id") == body.target_machine for m in plan.get("machines", []))
        ):
            wrong["target_machine"] = {"given": body.target_machine, "plan": names}
        if body.world_size is not None and body.world_size != row.world_size:
            wrong["world_size"] = {"given": body.world_size, "plan": row.world_size}
        if body.rank is not None and body.rank >= max(len(names), 1):
            wrong["rank"] = {"given": body.rank, "plan": list(range(len(names)))}
        if body.master_addr is not None and body.master_addr not in (
            plan.get("master", {}).get("address"),
            plan.get("master", {}).get("host"),
        ):
            wrong["master_addr"] = {"given": body.master_addr, "plan": plan.get("master")}
        if wrong:
            raise Conflict(
                f"the dispatch body disagrees with job {row.id}'s plan: {', '.join(wrong)}",
                details={"mismatch": wrong},
            )

    def start(self, row: Job) -> None:
        """Claim the job (planned/queued -> pending, once) and start its supervisor."""
        request = self._request_of(row)
        machines = self.machines.rows(row.machine_ids or [])
        busy = busy_machines(self.store)
        taken = {m.name: busy[m.id] for m in machines if busy.get(m.id)}
        if taken:
            raise Conflict(
                "machines are busy: "
                + "; ".join(f"{n} with {', '.join(j)}" for n, j in taken.items()),
                details={"busy": taken},
            )
        launch = launch_request(
            row.id, request, machines, self.settings, weights=_planned_weights(row)
        )
        self._claim(row.id)
        self._launch(row.id, launch)

    def _claim(self, job_id: str) -> None:
        """planned/queued -> pending, exactly once (a second dispatch is a Conflict)."""
        with self.store.session() as s:
            claimed = _rowcount(
                s.execute(
                    update(Job)
                    .where(Job.id == job_id, Job.state.in_(WAITING_STATES))
                    .values(state="pending", started=time.time(), reason="")
                )
            )
        if not claimed:
            raise Conflict(f"job {job_id} was dispatched already", details={"job_id": job_id})

    def _launch(self, job_id: str, launch: LaunchRequest) -> None:
        try:
            sup = self._spawn(launch)
        except OSError as exc:
            self._set(
                job_id,
                state="failed",
                reason=f"could not start the supervisor: {exc}",
                ended=time.time(),
            )
            raise
        self._requests.pop(job_id, None)
        self._set(job_id, supervisor_pid=sup.pid, supervisor_started=sup.started)

    def _spawn(self, launch: LaunchRequest) -> _Supervisor:
        directory = private_dir(job_dir(launch.run_dir, launch.job_id))
        env = {k: v for k, v in os.environ.items() if k not in SERVER_ONLY_ENV}
        with append_private(directory / "supervisor.log") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "corral.service.launch"],
                stdin=subprocess.PIPE,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # a signal to the server never reaches the job
                close_fds=True,
                env=env,
            )
        assert proc.stdin is not None
        try:
            proc.stdin.write(launch.model_dump_json().encode())
        finally:
            proc.stdin.close()
        self._children[launch.job_id] = proc
        try:
            started = psutil.Process(proc.pid).create_time()
        except psutil.Error:
            started = time.time()
        return _Supervisor(proc.pid, started, proc)

    def _set(self, job_id: str, **values: Any) -> None:
        with self.store.session() as s:
            s.execute(update(Job).where(Job.id == job_id).values(**values))

    # -- stop ----------------------------------------------------------------------------

    def stop(self, job_id: str, *, force: bool = False) -> StopOut:
        """Stop a job: a planned or queued one is cancelled; a running one's supervisor
        is asked to tear every node down (``force``: kill now); a finished one is left
        as it is (idempotent)."""
        row = self.row(job_id)
        if row.state in TERMINAL_STATES:
            return StopOut(
                job_id=job_id,
                status=row.state,
                stopping=False,
                message=f"job {job_id} already {row.state}",
            )
        if row.state in WAITING_STATES:
            with self.store.session() as s:
                done = _rowcount(
                    s.execute(
                        update(Job)
                        .where(Job.id == job_id, Job.state.in_(WAITING_STATES))
                        .values(
                            state="cancelled",
                            reason="stopped before it started",
                            ended=time.time(),
                        )
                    )
                )
            if done:
                self._requests.pop(job_id, None)
                self._notify(job_id)
                return StopOut(
                    job_id=job_id,
                    status="cancelled",
                    stopping=False,
                    message=f"job {job_id} cancelled before it started",
                )
            return self.stop(job_id, force=force)
        if not _alive(row.supervisor_pid, row.supervisor_started):
            return StopOut(
                job_id=job_id,
                status=row.state,
                stopping=False,
                message=f"job {job_id}'s supervisor is gone; it will be marked lost",
            )
        if job_id in self._stop_sent and not force:
            return StopOut(
                job_id=job_id,
                status=row.state,
                stopping=True,
                message=f"job {job_id} is already stopping (force=true kills now)",
            )
        assert row.supervisor_pid is not None
        with contextlib.suppress(ProcessLookupError):
            os.kill(row.supervisor_pid, signal.SIGTERM)
            if force and job_id in self._stop_sent:
                os.kill(row.supervisor_pid, signal.SIGTERM)  # a second stop kills
        self._stop_sent.add(job_id)
        return StopOut(
            job_id=job_id,
            status=row.state,
            stopping=True,
            message=f"job {job_id} is stopping: every node is being torn down",
        )

    # -- ingest --------------------------------------------------------------------------

    def reattach(self) -> dict[str, str]:
        """On start: follow every active job whose supervisor still runs; mark the
        others lost (after reading what they wrote). Job id -> what happened."""
        outcome: dict[str, str] = {}
        with self.store.session() as s:
            ids = list(s.scalars(select(Job.id).where(Job.state.in_(ACTIVE_STATES))).all())
        for job_id in ids:
            self._ingest(job_id)
            state = self.row(job_id).state
            outcome[job_id] = "re-attached" if state in ACTIVE_STATES else state
        return outcome

    def ingest_once(self) -> list[str]:
        """Read new events of every active job; the ids of jobs that ended."""
        for job_id, proc in list(self._children.items()):
            if proc.poll() is not None:  # reap our own children
                self._children.pop(job_id, None)
        with self.store.session() as s:
            ids = list(s.scalars(select(Job.id).where(Job.state.in_(ACTIVE_STATES))).all())
        ended = [job_id for job_id in ids if self._ingest(job_id)]
        for job_id in ended:
            self._stop_sent.discard(job_id)
            for callback in self.on_finished:
                callback(job_id)  # must be thread-safe (the scheduler's wake is)
        return ended

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        """The event loop SSE readers wait on (notified from any thread)."""
        self._loop = loop

    async def run_ingest(self) -> None:
        """Ingest forever (the server's background task)."""
        self.bind(asyncio.get_running_loop())
        log = logging.getLogger("corral.serve")
        while True:
            try:
                await asyncio.to_thread(self.ingest_once)
            except RuntimeError:
                return  # the loop's executor is shut down: the server is exiting
            except Exception:
                log.exception("ingesting job events failed")  # the next round retries
            await asyncio.sleep(self.settings.ingest_interval)

    def _ingest(self, job_id: str) -> bool:
        """Apply the job's new events; True when it reached a final state now."""
        with self._ingesting:  # the background round and a reader may both ask
            return self._ingest_locked(job_id)

    def _ingest_locked(self, job_id: str) -> bool:
        with self.store.session() as s:
            job = s.get(Job, job_id)
            if job is None or job.state not in ACTIVE_STATES:
                return False
            path = Path(job.run_dir) / EVENTS_FILE
            alive = _alive(job.supervisor_pid, job.supervisor_started)
            new = list(read_events(path, job.events_offset))
            names = _machine_ids(job)
            for ev in new:
                _apply(s, job, ev, names)
                job.events_offset = ev.next_pos
            if job.state in ACTIVE_STATES and not alive and job.supervisor_pid is not None:
                more = list(read_events(path, job.events_offset))
                if not more:
                    _lost(job)
                    lost = {"kind": "lost", "time": time.time(), "reason": job.reason}
                    pos = append_event(path, lost)
                    s.add(
                        Event(
                            job_id=job.id,
                            pos=pos,
                            time=lost["time"],
                            kind="lost",
                            data={"reason": job.reason},
                        )
                    )
                    job.events_offset = path.stat().st_size if path.exists() else pos
            finished = job.state not in ACTIVE_STATES
        if new or finished:
            self._notify(job_id)
        return finished

    def catch_up(self, job_id: str) -> None:
        """Ingest an active job's events now, so what is read next includes all the
        supervisor wrote (the background round may be up to one interval behind)."""
        with self.store.session() as s:
            state = s.scalar(select(Job.state).where(Job.id == job_id))
        if state in ACTIVE_STATES:
            self._ingest(job_id)

    # -- reading -------------------------------------------------------------------------

    def status(self, job_id: str) -> DistributedJobStatus:
        """The seed's DistributedJobStatus of a job."""
        self.catch_up(job_id)
        with self.store.session() as s:
            job = s.get(Job, job_id)
            if job is None:
                raise NotFound(f"no job {job_id!r}", details={"job_id": job_id})
            nodes = list(
                s.scalars(select(Node).where(Node.job_id == job_id).order_by(Node.node_rank)).all()
            )
            ranks = list(
                s.scalars(select(Rank).where(Rank.job_id == job_id).order_by(Rank.rank)).all()
            )
            attempts = list(
                s.scalars(
                    select(Attempt).where(Attempt.job_id == job_id).order_by(Attempt.number)
                ).all()
            )
        return _status(job, nodes, ranks, attempts)

    def list_jobs(
        self,
        *,
        state: str | None = None,
        machine: str | None = None,
        task_id: str | None = None,
        kind: str | None = None,
        limit: int = 50,
        offset: int = 0,
    ) -> JobList:
        """Jobs, newest first, filtered by state (comma-separated), machine (id or
        name), task or kind."""
        query = select(Job)
        if state:
            query = query.where(Job.state.in_([x.strip() for x in state.split(",")]))
        if task_id:
            query = query.where(Job.task_id == task_id)
        if kind:
            query = query.where(Job.kind == kind)
        query = query.order_by(Job.created.desc())
        if not machine:  # page in SQL: never load (and JSON-decode) every job's row
            with self.store.session() as s:
                total = s.scalar(select(func.count()).select_from(query.subquery()))
                page = list(s.scalars(query.offset(offset).limit(limit)).all())
            return JobList(
                jobs=[_summary(r) for r in page], total=int(total or 0), limit=limit, offset=offset
            )
        with self.store.session() as s:
            rows = list(s.scalars(query).all())
            names = {m.id: m.name for m in s.scalars(select(Machine))}
        rows = [
            r
            for r in rows
            if machine in (r.machine_ids or [])
            or machine in [names.get(i) for i in (r.machine_ids or [])]
            or machine in [m.get("name") for m in (r.plan or {}).get("machines", [])]
        ]
        page = rows[offset : offset + limit]
        return JobList(
            jobs=[_summary(r) for r in page], total=len(rows), limit=limit, offset=offset
        )

    def output(self, job_id: str, offset: int = 0, limit: int = 1000) -> OutputPage:
        """Merged ``[host:rank]`` output from byte ``offset`` of the events file."""
        row = self.row(job_id)
        if offset < 0:
            raise Invalid("offset must be >= 0", details={"field": "offset"})
        lines: list[str] = []
        pos = offset
        path = Path(row.run_dir) / EVENTS_FILE
        for ev in read_events(path, offset):
            if ev.data.get("kind") == "log":
                lines.extend(prefixed_lines(ev.data))
            elif ev.data.get("kind") == "message":
                lines.append(f"[corral] {ev.data.get('text', '')}")
            pos = ev.next_pos
            if len(lines) >= limit:
                break
        size = path.stat().st_size if path.exists() else 0
        return OutputPage(
            job_id=job_id,
            offset=offset,
            next_offset=pos,
            lines=lines,
            finished=row.state in TERMINAL_STATES and pos >= size,
        )

    def file(self, job_id: str, key: str) -> Path:
        """A file of the job's run dir by alias (result, plan, job, attempts, events,
        supervisor_log) or relative path (``logs/HOST.RANK.log``); Forbidden outside."""
        row = self.row(job_id)
        base = Path(row.run_dir).resolve()
        name = FILE_ALIASES.get(key, key)
        target = (base / name).resolve()
        if not target.is_relative_to(base) or target == base:
            raise Forbidden(f"{key!r} is outside job {job_id}'s run dir", details={"key": key})
        if not target.is_file():
            raise NotFound(
                f"job {job_id} has no file {key!r}",
                details={"key": key, "files": self.files(job_id)},
            )
        return target

    def files(self, job_id: str) -> list[str]:
        """The job's files (relative paths; logs included)."""
        base = Path(self.row(job_id).run_dir)
        if not base.is_dir():
            return []
        return sorted(
            str(p.relative_to(base))
            for p in base.rglob("*")
            if p.is_file() and not p.name.startswith(".")
        )

    # -- live ----------------------------------------------------------------------------

    def _notify(self, job_id: str) -> None:
        """Wake the job's SSE readers (safe from any thread)."""
        if self._loop is not None and not self._loop.is_closed():
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._wake, job_id)

    def _wake(self, job_id: str) -> None:
        waiter = self._waiters.pop(job_id, None)
        if waiter is not None:
            waiter.set()

    async def _wait(self, job_id: str, timeout: float) -> None:
        waiter = self._waiters.setdefault(job_id, asyncio.Event())
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(waiter.wait(), timeout)

    async def events(self, job_id: str, start: int = 0) -> AsyncIterator[LoggedEvent]:
        """Every event of the job from byte ``start`` on, live, until it has ended
        (each event's ``next_pos`` is where a reconnect resumes)."""
        row = self.row(job_id)
        path = Path(row.run_dir) / EVENTS_FILE
        pos = start
        while True:
            ended = False
            for ev in read_events(path, pos):
                pos = ev.next_pos
                if ev.data.get("kind") in FINAL_EVENTS:  # the status agrees once it is seen
                    await asyncio.to_thread(self.catch_up, job_id)
                yield ev
                if ev.data.get("kind") in FINAL_EVENTS:
                    ended = True
            if ended:
                return
            state = self.row(job_id).state
            if state in TERMINAL_STATES and not list(read_events(path, pos)):
                return
            await self._wait(job_id, 0.25)

    def delete(self, job_id: str) -> JobSummary:
        """Forget a job that is not active (planned, queued or finished): its rows go,
        its run dir stays. Conflict while it runs."""
        row = self.row(job_id)
        if row.state in ACTIVE_STATES:
            raise Conflict(
                f"job {job_id} is {row.state}: stop it before deleting it",
                details={"job_id": job_id, "status": row.state},
            )
        with self.store.session() as s:
            s.execute(delete(Job).where(Job.id == job_id, Job.state.not_in(ACTIVE_STATES)))
        self._requests.pop(job_id, None)
        return _summary(row)


def _planned_weights(row: Job) -> list[float] | None:
    """The weights the job's plan showed (the calibration file is read once, at plan
    time); None for a plan that predates them."""
    plan = row.plan or {}
    if "workload_weights" not in plan:
        return None
    return [float(w["weight"]) for w in plan["workload_weights"] or []]


def _rowcount(result: Any) -> int:
    """Rows an UPDATE changed."""
    return int(result.rowcount)


def prefixed_lines(data: dict[str, Any]) -> list[str]:
    """A log event's lines, each prefixed ``[host:rank]`` (``[host]`` for the node's own).

    A line a progress bar rewrote with ``\r`` shows its last state, and a chunk that
    ends in ``\r`` (an update without a newline yet) counts as a line."""
    rank = data.get("rank", -1)
    host = data.get("host")
    prefix = f"[{host}:{rank}]" if rank is not None and rank >= 0 else f"[{host}]"
    text = str(data.get("text", "")).replace("\r\n", "\n")
    pieces = text.split("\n")
    if pieces and pieces[-1] == "":
        pieces.pop()  # the newline that ended the last line
    out = []
    for piece in pieces:
        shown = next((seg for seg in reversed(piece.split("\r")) if seg), "")
        if shown or not piece:
            out.append(f"{prefix} {shown}")
    return out


def _machine_ids(job: Job) -> dict[str, str]:
    """Host name -> machine id of the job's planned machines."""
    return {m["name"]: m["id"] for m in (job.plan or {}).get("machines", [])}


def _lost(job: Job) -> None:
    job.state = "lost"
    job.reason = (
        f"the supervisor process (pid {job.supervisor_pid}) ended without reporting a "
        "result (killed, or the machine restarted)"
    )
    job.ended = time.time()
    job.root_cause = job.root_cause or {"message": job.reason}


def _apply(s: Any, job: Job, ev: LoggedEvent, machine_ids: dict[str, str]) -> None:
    """Fold one event into the job's rows."""
    data = ev.data
    kind = str(data.get("kind", ""))
    when = float(data.get("time") or time.time())
    if kind == "log":
        return
    if kind == "state":
        # the final state is taken from the finished/error event that follows, so the
        # job stays active (and ingested) until its result is in
        if str(data["state"]) not in TERMINAL_STATES:
            job.state = str(data["state"])
        job.reason = str(data.get("reason") or job.reason or "")
        job.attempt = int(data.get("attempt") or job.attempt)
    elif kind == "attempt_started":
        number = int(data["number"])
        job.attempt = number
        s.merge(
            Attempt(
                job_id=job.id,
                number=number,
                started=when,
                hosts=list(data["hosts"]),
                world_size=int(data.get("world_size") or 0),
                checkpoint=data.get("checkpoint"),
                record={},
                restart=False,
                decision="",
                workload_weights=[float(w) for w in data.get("workload_weights") or []] or None,
            )
        )
        job.world_size = int(data.get("world_size") or job.world_size)
        s.execute(delete(Node).where(Node.job_id == job.id))
        for i, host in enumerate(data["hosts"]):
            s.add(
                Node(
                    job_id=job.id,
                    host=host,
                    node_rank=i,
                    machine_id=machine_ids.get(host),
                    state="starting",
                    detail="",
                    started=when,
                )
            )
    elif kind == "attempt_ended":
        attempt = s.get(Attempt, (job.id, int(data["number"])))
        if attempt is not None:
            attempt.ended = when
            attempt.record = dict(data.get("record") or {})
            attempt.restart = bool(data.get("restart"))
            attempt.decision = str(data.get("decision") or "")
        if data.get("restart"):
            job.restarts += 1
    elif kind == "node":
        node = s.get(Node, (job.id, str(data["host"])))
        if node is None:
            node = Node(
                job_id=job.id,
                host=str(data["host"]),
                node_rank=0,
                machine_id=machine_ids.get(str(data["host"])),
                started=when,
            )
            s.add(node)
        node.state = str(data["state"])
        node.detail = str(data.get("detail") or "")
        if node.state in ("exited", "failed", "lost", "terminated"):
            node.ended = when
    elif kind == "progress":
        _progress(s, job, data, when)
    elif kind == "rank_exit":
        rank = s.get(Rank, (job.id, int(data["rank"])))
        if rank is None:
            rank = Rank(job_id=job.id, rank=int(data["rank"]), host=str(data["host"]), metrics={})
            s.add(rank)
        rank.code = data.get("code")
    elif kind == "finished":
        _finished(job, data, when)
    elif kind == "error":
        job.state = "failed"
        job.reason = str(data.get("message") or "")
        job.exit_code = int(data.get("exit_code") or 3)
        job.ended = when
        job.root_cause = {
            "type": data.get("type"),
            "message": data.get("message"),
            "details": data.get("details") or [],
        }
    s.add(
        Event(
            job_id=job.id,
            pos=ev.pos,
            time=when,
            kind=kind,
            data={k: v for k, v in data.items() if k not in ("kind", "time")},
        )
    )


def _progress(s: Any, job: Job, data: dict[str, Any], when: float) -> None:
    number = int(data["rank"])
    rank = s.get(Rank, (job.id, number))
    if rank is None:
        rank = Rank(job_id=job.id, rank=number, host=str(data["host"]), metrics={})
        s.add(rank)
    step = data.get("step")
    if step is not None and rank.step is not None and rank.updated and when > rank.updated:
        rate = (int(step) - rank.step) / (when - rank.updated)
        if rate >= 0:  # smoothed
            old = rank.steps_per_s
            rank.steps_per_s = rate if old is None else 0.7 * rate + 0.3 * old
    if step is not None:
        rank.step = int(step)
    if data.get("total") is not None:
        rank.total = int(data["total"])
    rank.metrics = dict(data.get("metrics") or {})
    rank.updated = when
    rank.host = str(data["host"])
    if number == 0 or not job.last_metrics:
        job.last_metrics = {
            "rank": number,
            "host": rank.host,
            "step": rank.step,
            "total": rank.total,
            "time": when,
            **rank.metrics,
        }


def _finished(job: Job, data: dict[str, Any], when: float) -> None:
    result = data.get("result") or {}
    job.state = str(data.get("state") or result.get("state") or "failed")
    job.exit_code = int(data.get("exit_code") or 0)
    job.ended = float(result.get("ended") or when)
    job.reason = str(result.get("reason") or ("" if job.state == "succeeded" else job.reason))
    failures = result.get("failures") or []
    if failures:
        cause = dict(failures[0])
        cause["log_tail"] = _log_tail(Path(job.run_dir), cause.get("host"), cause.get("rank"))
        job.root_cause = cause
    elif job.state != "succeeded":
        job.root_cause = {"message": job.reason}


def _log_tail(directory: Path, host: Any, rank: Any, lines: int = 30) -> list[str]:
    """The last lines a failed rank printed (its traceback, usually)."""
    if host is None or rank is None:
        return []
    path = directory / "logs" / f"{host}.{rank}.log"
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - 16384))
            text = fh.read().decode("utf-8", "replace")
    except OSError:
        return []
    return text.splitlines()[-lines:]


def _summary(r: Job) -> JobSummary:
    names = [m.get("name") for m in (r.plan or {}).get("machines", [])]
    end = r.ended or (time.time() if r.started and r.state in ACTIVE_STATES else None)
    return JobSummary(
        job_id=r.id,
        name=(r.request or {}).get("name"),
        script=(r.request or {}).get("script")
        or (r.request or {}).get("plugin_name")
        or (r.request or {}).get("command_template"),
        kind=r.kind,
        status=r.state,
        created=r.created,
        started=r.started,
        ended=r.ended,
        duration=(end - r.started) if end and r.started else None,
        exit_code=r.exit_code,
        machines=[str(n) for n in names],
        world_size=r.world_size,
        task_id=r.task_id,
    )


def _status(
    job: Job, nodes: Sequence[Node], ranks: Sequence[Rank], attempts: Sequence[Attempt]
) -> DistributedJobStatus:
    by_host: dict[str, list[Rank]] = {}
    for r in ranks:
        by_host.setdefault(r.host, []).append(r)
    plan_nodes = (job.plan or {}).get("nodes", [])
    machine_by_name = _machine_ids(job)
    out: list[NodeStatus] = []
    if nodes:
        for n in nodes:
            out.append(
                _node_status(
                    n.host,
                    n.machine_id,
                    n.node_rank,
                    n.state,
                    n.detail,
                    n.started,
                    n.ended,
                    by_host.get(n.host, []),
                )
            )
    else:
        for p in plan_nodes:
            out.append(
                _node_status(
                    p["host"],
                    machine_by_name.get(p["host"]),
                    p["node_rank"],
                    job.state,
                    "",
                    None,
                    None,
                    by_host.get(p["host"], []),
                    planned=p.get("ranks") or [],
                )
            )
    return DistributedJobStatus(
        job_id=job.id,
        name=(job.request or {}).get("name"),
        kind=job.kind,
        status=job.state,
        reason=job.reason,
        world_size=job.world_size,
        master=job.master,
        created=job.created,
        started=job.started,
        ended=job.ended,
        exit_code=job.exit_code,
        attempt=job.attempt,
        restarts=job.restarts,
        nodes=out,
        attempts=[
            {
                "number": a.number,
                "started": a.started,
                "ended": a.ended,
                "hosts": a.hosts,
                "world_size": a.world_size,
                "checkpoint": a.checkpoint,
                "restart": a.restart,
                "decision": a.decision,
                "cause": (a.record or {}).get("cause") or (a.record or {}).get("reason"),
                "record": a.record,
            }
            for a in attempts
        ],
        last_metrics=dict(job.last_metrics or {}),
        root_cause=job.root_cause,
        machines=[m["name"] for m in (job.plan or {}).get("machines", [])],
        task_id=job.task_id,
        workload_weights=_current_weights(job, attempts),
    )


def _current_weights(job: Job, attempts: Sequence[Attempt]) -> list[WorkloadWeight] | None:
    """Each rank's share in the latest attempt that recorded weights (``--rebalance``
    re-weighs at a restart; a restart without a lost host re-splits), else in the plan;
    None for an even split. An attempt's ranks are its hosts' planned ranks, in order."""
    planned = [
        WorkloadWeight.model_validate(w) for w in (job.plan or {}).get("workload_weights") or []
    ]
    per_host = Counter(row.host for row in planned)
    for attempt in sorted(attempts, key=lambda a: a.number, reverse=True):
        weights = attempt.workload_weights or []
        slots = [(str(h), per_host.get(str(h), 0)) for h in attempt.hosts or []]
        if not weights or sum(n for _, n in slots) != len(weights):
            continue
        places = [(h, node, local) for node, (h, n) in enumerate(slots) for local in range(n)]
        return [
            WorkloadWeight(host=h, node_rank=node, local_rank=local, weight=float(w))
            for (h, node, local), w in zip(places, weights, strict=True)
        ]
    return planned or None


def _node_status(
    host: str,
    machine_id: str | None,
    node_rank: int,
    state: str,
    detail: str,
    started: float | None,
    ended: float | None,
    ranks: Sequence[Rank],
    planned: Sequence[int] = (),
) -> NodeStatus:
    steps = [r.step for r in ranks if r.step is not None]
    rates = [r.steps_per_s for r in ranks if r.steps_per_s]
    totals = [r.total for r in ranks if r.total]
    step = min(steps) if steps else None
    total = max(totals) if totals else None
    rate = min(rates) if rates else None
    eta = (total - step) / rate if step is not None and total and rate else None
    first = min(ranks, key=lambda r: r.rank) if ranks else None
    progress = {
        "step": step,
        "total": total,
        "steps_per_s": rate,
        "eta_s": round(eta, 1) if eta is not None else None,
        "percent": round(100.0 * step / total, 1) if step is not None and total else None,
        "metrics": dict(first.metrics or {}) if first else {},
        "ranks": {
            str(r.rank): {
                "step": r.step,
                "total": r.total,
                "steps_per_s": r.steps_per_s,
                "code": r.code,
                "metrics": r.metrics,
            }
            for r in ranks
        },
    }
    return NodeStatus(
        host=host,
        machine_id=machine_id,
        node_rank=node_rank,
        ranks=sorted({r.rank for r in ranks} | set(planned)),
        status=state,
        detail=detail,
        start_time=started,
        end_time=ended,
        progress=progress,
    )
