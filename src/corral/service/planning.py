"""Planning a server's job: machines chosen, the job description fixed, stored ``planned``.

The job description built here (:class:`~corral.job.describe.JobDescription`, by
:func:`~corral.service.planner.job_description`; what the supervisor process runs)
is the plan the user confirms: its JSON is stored with the job (secret env values
never in it; the real ones stay in the server's memory) and dispatch runs exactly
it (:mod:`corral.service.dispatch`), or refuses with the reason when the machines
changed since (:func:`machine_changes`).
"""

from __future__ import annotations

import dataclasses
import socket
import time
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import select

from corral.cluster.model import Host
from corral.errors import Conflict, Invalid
from corral.job.describe import JobDescription
from corral.job.ids import new_job_id
from corral.job.states import JobState, job_sources
from corral.service.audit import record_change
from corral.service.launch import job_dir
from corral.service.machines import MachineService, busy_machines, machine_host, machines_ssh
from corral.service.models import JobRequest, PlanOut
from corral.service.planner import (
    Selection,
    execution_plan,
    job_description,
    select_machines,
    stored_request,
)
from corral.service.settings import ServerSettings
from corral.service.trust import (
    admit_tracking,
    check_machines,
    check_server_paths,
    is_trusted,
    refuse_server_host,
)
from corral.store import Store
from corral.store.models import Job, Machine, Preference


def stored_launch(description: JobDescription) -> dict[str, Any]:
    """The job description as stored with the job (its JSON: secret env values are
    never in it, only their names)."""
    return description.to_dict()


def machine_changes(
    description: JobDescription,
    machine_ids: Sequence[str],
    current: Mapping[str, Machine],
    settings: ServerSettings,
) -> list[str]:
    """How the job's machines differ from when it was planned: removed, or another
    address, port, user, slots, interpreter, labels or SSH key (empty: unchanged).
    ``current``: the registered machines by id."""
    changes: list[str] = []
    now: list[Machine] = []
    for host, machine_id in zip(description.cluster.hosts, machine_ids, strict=False):
        machine = current.get(machine_id)
        if machine is None:
            changes.append(f"machine {host.name} was removed")
            continue
        now.append(machine)
        later = machine_host(machine)
        diffs = [
            f"{f.name} {_shown(host, f.name)!r} -> {_shown(later, f.name)!r}"
            for f in dataclasses.fields(host)
            if getattr(host, f.name) != getattr(later, f.name)
        ]
        if diffs:
            changes.append(f"machine {host.name} changed ({', '.join(diffs)})")
    if not changes and now:
        try:
            ssh = machines_ssh(now, settings)
        except Conflict as exc:
            changes.append(str(exc))
        else:
            if ssh != description.ssh:
                changes.append("the machines' SSH key or password variable changed")
    return changes


def _shown(host: Host, name: str) -> object:
    """A host's field as a change names it: as the machine is registered (a local
    machine has no address), its frozen mappings as dicts."""
    if name == "address" and host.local:
        return ""
    value = getattr(host, name)
    return dict(value) if isinstance(value, Mapping) else value


class Planning:
    """Machine selection and the stored plan of a job."""

    def __init__(
        self,
        store: Store,
        settings: ServerSettings,
        machines: MachineService,
        launches: dict[str, JobDescription],
    ) -> None:
        self.store = store
        self.settings = settings
        self.machines = machines
        self.launches = launches  # planned jobs' descriptions, secret values included

    def _preferred(self) -> list[str]:
        with self.store.session() as s:
            pref = s.get(Preference, "distributed")
        return list((pref.value if pref else {}).get("preferred_machines", []))

    def select(
        self,
        request: JobRequest,
        busy: dict[str, list[str]] | None = None,
        *,
        owner: str | None = None,
    ) -> Selection:
        """The machines ``request`` would run on now (Conflict when it cannot). For an
        ``owner`` who is not an admin, local machines are never picked automatically
        and naming one is Forbidden (:mod:`corral.service.trust`)."""
        busy = busy_machines(self.store) if busy is None else busy
        trusted = is_trusted(self.store, owner)
        with self.store.session() as s:
            machines = list(s.scalars(select(Machine).order_by(Machine.name)).all())
        if not trusted:
            machines = [m for m in machines if not m.local]
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
            check_machines(chosen, owner, trusted)
        return select_machines(machines, request, busy, self._preferred(), chosen)

    def plan(
        self,
        request: JobRequest,
        *,
        kind: str = "distributed",
        task_id: str | None = None,
        job_id: str | None = None,
        owner: str | None = None,
    ) -> PlanOut:
        """Choose machines, fix the job description and the execution plan, and store
        the job as ``planned`` (a queued job ``job_id`` moves to ``planned``; ``owner``:
        the user it is planned for, a queued job keeps its own)."""
        if owner is None and job_id is not None:
            with self.store.session() as s:
                queued = s.get(Job, job_id)
            owner = queued.owner if queued is not None else None
        self.admit(request, owner)
        selection = self.select(request, owner=owner)
        job_id = job_id or new_job_id()
        launch = self._bounded(
            job_description(job_id, request, selection.chosen, self.settings, owner=owner),
            request,
            owner,
        )
        plan = execution_plan(launch, selection)
        with self.store.session() as s:
            row = s.get(Job, job_id)
            new = row is None
            if row is None:
                row = Job(id=job_id, created=time.time(), state=JobState.PLANNED.value)
                s.add(row)
            elif JobState(row.state) not in job_sources(JobState.PLANNED):
                raise Conflict(
                    f"job {job_id} is {row.state}: it cannot be planned",
                    details={"job_id": job_id, "status": row.state},
                )
            row.kind = kind
            row.state = JobState.PLANNED.value
            row.request = stored_request(request)
            row.plan = plan
            row.launch = stored_launch(launch)
            row.machine_ids = [m.id for m in selection.chosen]
            row.master = plan["master"]["host"]
            row.world_size = int(plan["world_size"])
            row.task_id = task_id
            row.run_dir = str(job_dir(self.settings.run_dir, job_id))
            if owner is not None:
                row.owner = owner
            if new:  # a queued job planned by the scheduler: its dispatch is the entry
                names = [m.name for m in selection.chosen]
                after = {"state": row.state, "owner": row.owner, "kind": kind, "machines": names}
                record_change(s, owner or "server", "job.plan", job_id, after=after)
        self.launches[job_id] = launch
        return PlanOut(job_id=job_id, status=JobState.PLANNED.value, execution_plan=plan)

    def plan_here(self, request: JobRequest, owner: str | None = None) -> str:
        """Plan ``owner``'s job on the server's own machine (one local node), stored
        ``planned`` with kind ``local``; its id. Forbidden unless ``owner`` is an admin
        (:mod:`corral.service.trust`)."""
        if not is_trusted(self.store, owner):
            raise refuse_server_host(owner, "execute_job runs the job on the server's machine")
        self.admit(request, owner)
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
        launch = self._bounded(
            job_description(job_id, request, [here], self.settings, owner=owner), request, owner
        )
        plan = execution_plan(launch, selection)
        with self.store.session() as s:
            s.add(
                Job(
                    id=job_id,
                    kind="local",
                    state=JobState.PLANNED.value,
                    request=stored_request(request),
                    plan=plan,
                    launch=stored_launch(launch),
                    machine_ids=[],
                    master=name,
                    world_size=int(plan["world_size"]),
                    created=time.time(),
                    run_dir=str(job_dir(self.settings.run_dir, job_id)),
                    owner=owner,
                )
            )
        self.launches[job_id] = launch
        return job_id

    # -- the trust boundary (corral.service.trust) ---------------------------------------

    def admit(self, request: JobRequest, owner: str | None) -> None:
        """Forbidden when ``owner`` may not submit ``request`` at all: a local machine
        named, a tree of the server's filesystem pushed or read, or a tracking target
        out of bounds (for a non-admin; a metadata address for anyone)."""
        trusted = is_trusted(self.store, owner)
        if not trusted:
            check_server_paths(
                request.sync, request.code_dir, request.calibration, self.settings.run_dir, owner
            )
            if request.machine_selection == "manual" and request.selected_machines:
                names = set(request.selected_machines)
                with self.store.session() as s:
                    local = list(
                        s.scalars(
                            select(Machine).where(
                                Machine.local.is_(True),
                                Machine.id.in_(names) | Machine.name.in_(names),
                            )
                        ).all()
                    )
                check_machines(local, owner, trusted)
        admit_tracking(
            request.track,
            # a relative path lands in the job's run dir (its id is not drawn yet)
            job_dir=str(job_dir(self.settings.run_dir.resolve(), "new-job")),
            allow=self.settings.tracking_allow,
            trusted=trusted,
        )

    def _bounded(
        self, launch: JobDescription, request: JobRequest, owner: str | None
    ) -> JobDescription:
        """The description as the trust boundary runs it: tracking paths made absolute
        under the job's run dir (and checked), no tree of the server's own filesystem
        for a non-admin's consistency check."""
        options = launch.options
        assert options.job_id is not None
        trusted = is_trusted(self.store, owner)
        track = admit_tracking(
            request.track,
            job_dir=str(job_dir(self.settings.run_dir, options.job_id).resolve()),
            allow=self.settings.tracking_allow,
            trusted=trusted,
        )
        changes: dict[str, Any] = {"track": track}
        if not trusted:
            changes["code_dir"] = None
        return dataclasses.replace(launch, options=dataclasses.replace(options, **changes))
