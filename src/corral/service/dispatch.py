"""Dispatching a planned job: the claim, its supervisor process, and stopping it.

Dispatch runs the job description stored when the job was planned
(:mod:`corral.service.planning`), never a new plan: when a machine of the plan
was removed or edited since, or is busy with another job, it refuses (Conflict,
with the reason) and the job stays ``planned``. The supervisor is
``python -m corral.service.launch`` in its own session, handed that description
as is over stdin, its secret env values beside it (never in argv or a file).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
from sqlalchemy import select

from corral.contract import SERVER_TOKEN_ENV
from corral.errors import ConfigError, Conflict
from corral.job.describe import JobDescription
from corral.job.logfiles import OUTPUT_LIMIT_ENV
from corral.job.states import TERMINAL_STATES, WAITING_STATES, JobState
from corral.private import append_private, private_dir
from corral.service.chain import Chain
from corral.service.jobrows import job_row, move, set_values
from corral.service.launch import handover, job_dir, request_stop, stored_description
from corral.service.machines import busy_machines
from corral.service.models import DispatchIn, StopOut
from corral.service.planning import machine_changes
from corral.service.settings import ServerSettings
from corral.service.trust import (
    admit_tracking,
    check_machines,
    check_server_paths,
    is_trusted,
    refuse_server_host,
)
from corral.store import Store
from corral.store.models import Job, Machine

SERVER_ONLY_ENV = (SERVER_TOKEN_ENV, "CORRAL_TOKEN_FILE", "CORRAL_DB")
"""Variables of the server that its jobs' supervisors never inherit (its token, where
the token is, its store's URL)."""
SUPERVISOR_UMASK = 0o077
"""What a job's supervisor (and a local job's processes) create on the server's host
is its user's only: tracking stores and event files 0600, directories 0700."""
JOB_OUTPUT_LIMIT = 1 << 30
"""Bytes of output a job keeps on the server (its ranks are whoever submitted it: one
printing without end must not fill the server's disk); the server's environment's
``CORRAL_JOB_OUTPUT_LIMIT`` sets another."""


@dataclass
class SupervisorProcess:
    """A job's supervisor process: its pid and start time (a reused pid is not it)."""

    pid: int
    started: float
    proc: subprocess.Popen[bytes] | None = None


def alive(pid: int | None, started: float | None) -> bool:
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


def spawn_supervisor(description: JobDescription) -> SupervisorProcess:
    """Start ``python -m corral.service.launch`` for ``description`` (it and its
    secret values on its stdin, its output in the job dir's ``supervisor.log``),
    without the server's secrets in its environment, with umask 077."""
    options = description.options
    assert options.job_id is not None  # the planner gives every job its id
    directory = private_dir(job_dir(options.run_dir, options.job_id))
    env = {k: v for k, v in os.environ.items() if k not in SERVER_ONLY_ENV}
    env.setdefault(OUTPUT_LIMIT_ENV, str(JOB_OUTPUT_LIMIT))  # any user's ranks print here
    with append_private(directory / "supervisor.log") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "corral.service.launch"],
            stdin=subprocess.PIPE,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # a signal to the server never reaches the job
            close_fds=True,
            umask=SUPERVISOR_UMASK,
            env=env,
        )
    assert proc.stdin is not None
    try:
        proc.stdin.write(handover(description))
    finally:
        proc.stdin.close()
    try:
        started = psutil.Process(proc.pid).create_time()
    except psutil.Error:
        started = time.time()
    return SupervisorProcess(proc.pid, started, proc)


class Dispatch:
    """Claims, supervisor processes and stop requests."""

    def __init__(
        self,
        store: Store,
        settings: ServerSettings,
        launches: dict[str, JobDescription],
        notify: Callable[[str], None],
        spawn: Callable[[JobDescription], SupervisorProcess] = spawn_supervisor,
    ) -> None:
        self.store = store
        self.settings = settings
        self.launches = launches
        self.notify = notify
        self.spawn = spawn  # the seam a test replaces
        self.children: dict[str, subprocess.Popen[bytes]] = {}
        self.stop_sent: set[str] = set()
        self.chain = Chain(store, notify)  # the jobs' ``after``

    # -- dispatch ------------------------------------------------------------------------

    def dispatch(self, body: DispatchIn) -> None:
        """Start a planned job's supervisor. Conflict when it is not ``planned``, the
        dispatch body disagrees with its plan, or its machines changed or are busy."""
        row = job_row(self.store, body.job_id)
        if row.state not in WAITING_STATES:
            raise Conflict(
                f"job {row.id} is {row.state}: only a planned job can be dispatched",
                details={"job_id": row.id, "status": row.state},
            )
        check_seed_fields(row, body)
        self.start(row)

    def planned_launch(self, row: Job) -> JobDescription:
        """The job description the job was planned with (Conflict when the server no
        longer has it whole, or cannot read the stored one)."""
        launch = self.launches.get(row.id)
        if launch is not None:
            return launch
        if row.launch is None:
            raise Conflict(
                f"job {row.id} has no stored job description (it was planned by an older "
                "corral serve): plan the job again",
                details={"job_id": row.id},
            )
        try:
            launch = stored_description(row.launch)
        except ConfigError as exc:
            raise Conflict(
                f"job {row.id}'s stored plan cannot be run: {exc}. Plan the job again",
                details={"job_id": row.id},
            ) from exc
        if launch.withheld:
            raise Conflict(
                f"job {row.id} was planned with secret env values, which the server keeps "
                "only in memory and lost when it restarted: plan the job again",
                details={"job_id": row.id, "withheld": list(launch.withheld)},
            )
        return launch

    def start(self, row: Job) -> None:
        """Run the job's stored description: refused (Conflict, the job stays as it
        is) when its machines changed since the plan or are busy, or a job it is to
        start after has not succeeded; else claim the job (planned/queued -> pending,
        once) and start its supervisor."""
        launch = self.planned_launch(row)
        self.chain.require_met(row.request, f"job {row.id}")
        ids = list(row.machine_ids or [])
        with self.store.session() as s:
            current = {m.id: m for m in s.scalars(select(Machine).where(Machine.id.in_(ids)))}
        self._still_trusted(row, launch, list(current.values()))
        changes = machine_changes(launch, ids, current, self.settings)
        if changes:
            raise Conflict(
                f"job {row.id}'s machines changed since it was planned: "
                f"{'; '.join(changes)}. Plan the job again",
                details={"job_id": row.id, "changed": changes},
            )
        busy = busy_machines(self.store)
        taken = {current[i].name: busy[i] for i in ids if busy.get(i)}
        if taken:
            raise Conflict(
                "machines are busy: "
                + "; ".join(f"{n} with {', '.join(j)}" for n, j in taken.items()),
                details={"busy": taken},
            )
        self.claim(row.id)
        self.launch(row.id, launch)

    def _still_trusted(self, row: Job, launch: JobDescription, machines: list[Machine]) -> None:
        """Forbidden when the job's owner may not now run what was planned: a plan made
        while its owner was an admin (or under a name since re-added as a user) does
        not run on the server's own host, read a server tree or track out of bounds
        (:mod:`corral.service.trust`); the job stays planned."""
        if is_trusted(self.store, row.owner):
            return
        if row.kind == "local":
            raise refuse_server_host(row.owner, f"job {row.id} runs on the server's machine")
        check_machines(machines, row.owner, trusted=False)
        options = launch.options
        check_server_paths(options.sync, options.code_dir, None, self.settings.run_dir, row.owner)
        admit_tracking(
            options.track,
            job_dir=str(Path(row.run_dir).resolve()),
            allow=self.settings.tracking_allow,
            trusted=False,
        )

    def claim(self, job_id: str) -> None:
        """planned/queued -> pending, exactly once (a second dispatch is a Conflict)."""
        if not move(
            self.store,
            job_id,
            JobState.PENDING,
            only_from=WAITING_STATES,
            started=time.time(),
            reason="",
        ):
            raise Conflict(f"job {job_id} was dispatched already", details={"job_id": job_id})

    def launch(self, job_id: str, launch: JobDescription) -> None:
        """Start the claimed job's supervisor (the job fails when it cannot start)."""
        try:
            sup = self.spawn(launch)
        except OSError as exc:
            move(
                self.store,
                job_id,
                JobState.FAILED,
                reason=f"could not start the supervisor: {exc}",
                ended=time.time(),
            )
            raise
        if sup.proc is not None:
            self.children[job_id] = sup.proc
        self.launches.pop(job_id, None)
        set_values(self.store, job_id, supervisor_pid=sup.pid, supervisor_started=sup.started)

    def reap(self) -> None:
        """Collect the exit status of our own supervisor children that ended."""
        for job_id, proc in list(self.children.items()):
            if proc.poll() is not None:
                self.children.pop(job_id, None)

    # -- stop ----------------------------------------------------------------------------

    def stop(self, job_id: str, *, force: bool = False, by: str = "the API") -> StopOut:
        """Stop a job: a planned or queued one is cancelled; a running one's supervisor
        is asked to tear every node down (``force``: kill now); a finished one is left
        as it is (idempotent). ``by``: who stopped it and from where (``alice (web)``),
        named by the job's reason in every view: ``stopped by alice (web)``."""
        row = job_row(self.store, job_id)
        if row.state in TERMINAL_STATES:
            return StopOut(
                job_id=job_id,
                status=row.state,
                stopping=False,
                message=f"job {job_id} already {row.state}",
            )
        if row.state in WAITING_STATES:
            cancelled = JobState.CANCELLED
            if move(
                self.store,
                job_id,
                cancelled,
                only_from=WAITING_STATES,
                reason=f"stopped by {by} before it started",
                ended=time.time(),
            ):
                self.launches.pop(job_id, None)
                self.notify(job_id)
                self.chain.ended(job_id)  # the jobs waiting for it to succeed
                return StopOut(
                    job_id=job_id,
                    status=cancelled.value,
                    stopping=False,
                    message=f"job {job_id} cancelled before it started",
                )
            return self.stop(job_id, force=force, by=by)
        if not alive(row.supervisor_pid, row.supervisor_started):
            return StopOut(
                job_id=job_id,
                status=row.state,
                stopping=False,
                message=f"job {job_id}'s supervisor is gone; it will be marked lost",
            )
        if job_id in self.stop_sent and not force:
            return StopOut(
                job_id=job_id,
                status=row.state,
                stopping=True,
                message=f"job {job_id} is already stopping (force=true kills now)",
            )
        assert row.supervisor_pid is not None
        if row.run_dir:
            with contextlib.suppress(OSError):
                request_stop(Path(row.run_dir), by)
        with contextlib.suppress(ProcessLookupError):
            os.kill(row.supervisor_pid, signal.SIGTERM)
            if force and job_id in self.stop_sent:
                os.kill(row.supervisor_pid, signal.SIGTERM)  # a second stop kills
        self.stop_sent.add(job_id)
        return StopOut(
            job_id=job_id,
            status=row.state,
            stopping=True,
            message=f"job {job_id} is stopping: every node is being torn down",
        )


def check_seed_fields(row: Job, body: DispatchIn) -> None:
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
