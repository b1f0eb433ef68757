"""``/api/network/*``: machines, health, distributed jobs, single-machine jobs, job data."""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request, Security
from fastapi.responses import FileResponse

from corral.api.auth import Caller, acting, bearer, require_admin
from corral.api.services import Services, services
from corral.fleet.capabilities import local_health
from corral.service.links import LinksIn, LinksOut, measure_machines
from corral.service.models import (
    DispatchIn,
    DistributedJobStatus,
    JobRequest,
    MachineIn,
    MachineOut,
    NetworkStatus,
    OutputPage,
    PlanOut,
    PrepareIn,
    StopOut,
)
from corral.service.prepare import prepare_dependencies
from corral.service.trust import refuse_server_host, shown_status
from corral.service.users import Principal, Role

router = APIRouter(prefix="/api/network", tags=["network"], dependencies=[Security(bearer)])
Svc = Annotated[Services, Depends(services)]
ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"description": "Missing or wrong bearer token (nothing about the resource)."},
    403: {
        "description": "The caller's role may not do this, it is another user's job, or it "
        "would run on the server's own host (admins only)."
    },
    404: {"description": "Unknown machine or job."},
    409: {"description": "Conflicts with the current state (duplicate, busy, too few machines)."},
    413: {"description": "Body larger than the server's limit (--max-request-bytes)."},
    422: {"description": "Invalid body or parameter (names the field)."},
}


# -- machines ------------------------------------------------------------------------------


@router.get("/machines", summary="List all registered machines")
def list_machines(svc: Svc) -> list[MachineOut]:
    return svc.machines.list_all()


@router.post(
    "/machines",
    status_code=201,
    responses=ERRORS,
    dependencies=[Depends(require_admin)],
    summary="Add a machine (admin)",
)
def add_machine(body: MachineIn, svc: Svc, who: Caller) -> MachineOut:
    return _audited(svc, who, "machine.add", svc.machines.add(body))


@router.get("/machines/{machine_id}", responses=ERRORS, summary="One machine")
def get_machine(machine_id: str, svc: Svc) -> MachineOut:
    return svc.machines.get(machine_id)


@router.delete(
    "/machines/by-name/{machine_name}",
    responses=ERRORS,
    dependencies=[Depends(require_admin)],
    summary="Remove a machine by name (admin)",
)
def delete_machine_by_name(machine_name: str, svc: Svc, who: Caller) -> MachineOut:
    return _audited(svc, who, "machine.remove", svc.machines.delete_by_name(machine_name))


@router.delete(
    "/machines/{machine_id}",
    responses=ERRORS,
    dependencies=[Depends(require_admin)],
    summary="Remove a machine (admin)",
)
def delete_machine(machine_id: str, svc: Svc, who: Caller) -> MachineOut:
    return _audited(svc, who, "machine.remove", svc.machines.delete(machine_id))


AUDITED_MACHINE = ("name", "host", "port", "user", "key_path", "password_env", "slots", "labels")
"""What a machine's audit entry records (its registration; never a secret: a key's
path and a password's variable name only)."""


def _audited(svc: Services, who: Principal, action: str, machine: MachineOut) -> MachineOut:
    """``machine`` after the audit entry of its addition or removal."""
    values = {key: getattr(machine, key) for key in AUDITED_MACHINE} | {"local": machine.local}
    svc.audit.added_or_removed(
        who.name, action, machine.id, values, removed=action.endswith("remove")
    )
    return machine


# -- health --------------------------------------------------------------------------------


@router.get("/status", summary="Aggregated status of all machines")
def network_status(svc: Svc) -> NetworkStatus:
    return svc.machines.status()


@router.post("/machines/{machine_id}/ping", responses=ERRORS, summary="Check one machine now")
async def ping_machine(machine_id: str, svc: Svc) -> MachineOut:
    return await svc.machines.ping(machine_id)


@router.post("/health-check", summary="Check every machine in parallel")
async def health_check(
    svc: Svc,
    deadline: Annotated[
        float | None, Query(gt=0, le=600, allow_inf_nan=False, description="Seconds.")
    ] = None,
) -> NetworkStatus:
    return await svc.machines.health_check(deadline)


@router.get("/capabilities", summary="Capabilities and load of the server's machine")
async def capabilities() -> dict[str, Any]:
    return (await asyncio.to_thread(local_health, "localhost")).to_dict()


# -- distributed jobs ----------------------------------------------------------------------


@router.post("/distributed/plan", responses=ERRORS, summary="Plan a distributed job")
def plan(body: JobRequest, svc: Svc, who: Caller) -> PlanOut:
    who.require(Role.USER, "planning a job")
    return svc.jobs.planning.plan(body, owner=who.name)


@router.post(
    "/distributed/dispatch",
    responses=ERRORS,
    summary="Start a planned job (pre-flight checklist first)",
)
def dispatch(body: DispatchIn, svc: Svc, who: Caller) -> DistributedJobStatus:
    row = svc.jobs.row(body.job_id)
    who.require_owner(row.owner, f"dispatching job {row.id}")
    svc.tasks.check_limit(row.owner, len(row.machine_ids or []))
    return svc.jobs.dispatch(body, by=who.name)


@router.get("/distributed/status/{job_id}", responses=ERRORS, summary="Distributed job status")
def status(job_id: str, svc: Svc, who: Caller) -> DistributedJobStatus:
    return shown_status(svc.jobs.status(job_id), who)


@router.post(
    "/distributed/stop/{job_id}", responses=ERRORS, summary="Stop a job on every node (idempotent)"
)
def stop(
    job_id: str,
    request: Request,
    svc: Svc,
    who: Caller,
    force: Annotated[bool, Query(description="Kill now instead of a graceful stop.")] = False,
) -> StopOut:
    who.require_owner(svc.jobs.row(job_id).owner, f"stopping job {job_id}")
    return svc.jobs.stop(job_id, force=force, by=acting(request), who=who.name)


# the seed's first spellings
router.add_api_route(
    "/distributed_jobs/plan",
    plan,
    methods=["POST"],
    responses=ERRORS,
    summary="Plan a distributed job (older path)",
)
router.add_api_route(
    "/distributed_jobs/dispatch",
    dispatch,
    methods=["POST"],
    responses=ERRORS,
    summary="Start a planned job (older path)",
)


@router.get(
    "/distributed_jobs/{job_id}/status",
    responses=ERRORS,
    summary="Distributed job status (older path)",
)
def status_old(job_id: str, svc: Svc, who: Caller) -> DistributedJobStatus:
    return shown_status(svc.jobs.status(job_id), who)


# -- single-machine jobs -------------------------------------------------------------------


@router.post(
    "/machines/{machine_id}/dispatch_job",
    responses=ERRORS,
    summary="Run a whole job on one machine",
)
def dispatch_job(machine_id: str, body: JobRequest, svc: Svc, who: Caller) -> DistributedJobStatus:
    svc.tasks.check_limit(who.name, 1)
    machine = svc.machines.row(machine_id)
    request = body.model_copy(
        update={
            "machine_selection": "manual",
            "selected_machines": [machine.id],
            "resource_requirements": body.resource_requirements.model_copy(
                update={"num_machines": 1}
            ),
        }
    )
    planned = svc.jobs.planning.plan(request, kind="single", owner=who.name)
    return svc.jobs.dispatch(DispatchIn(job_id=planned.job_id), by=who.name)


def _job_on(svc: Services, machine_id: str, job_id: str) -> None:
    machine = svc.machines.row(machine_id)
    if machine.id not in (svc.jobs.row(job_id).machine_ids or []):
        from corral.errors import NotFound

        raise NotFound(
            f"job {job_id} does not run on machine {machine.name}",
            details={"job_id": job_id, "machine_id": machine.id},
        )


@router.get(
    "/machines/{machine_id}/job_status/{job_id}",
    responses=ERRORS,
    summary="Status of a job on a machine",
)
def machine_job_status(machine_id: str, job_id: str, svc: Svc, who: Caller) -> DistributedJobStatus:
    _job_on(svc, machine_id, job_id)
    return shown_status(svc.jobs.status(job_id), who)


@router.post(
    "/machines/{machine_id}/stop_job/{job_id}", responses=ERRORS, summary="Stop a job on a machine"
)
def machine_stop_job(
    machine_id: str, job_id: str, request: Request, svc: Svc, who: Caller
) -> StopOut:
    _job_on(svc, machine_id, job_id)
    who.require_owner(svc.jobs.row(job_id).owner, f"stopping job {job_id}")
    return svc.jobs.stop(job_id, by=acting(request), who=who.name)


# -- job data ------------------------------------------------------------------------------


@router.post(
    "/prepare_dependencies",
    responses=ERRORS,
    summary="Sync a code tree to machines and pip-install its requirements (admin)",
    description="Reads a tree of the server's own filesystem (and on a local machine runs "
    "pip as the server's user): an admin's only, a 403 for anyone else.",
)
async def prepare(body: PrepareIn, svc: Svc, who: Caller) -> dict[str, Any]:
    if not who.admin:
        raise refuse_server_host(who.name, "prepare_dependencies reads and installs a code tree")
    machines = svc.machines.rows(body.machine_ids)
    done = await prepare_dependencies(
        machines,
        svc.settings,
        source=body.source,
        dest=body.dest,
        requirements=body.requirements,
        python=body.python,
    )
    what = {"source": body.source, "dest": done.get("dest"), "requirements": body.requirements}
    await asyncio.to_thread(
        svc.audit.change,
        who.name,
        "machines.prepare",
        ",".join(m.name for m in machines),
        after=what | {"machines": [m.name for m in machines], "ok": done.get("ok")},
    )
    return done


@router.post(
    "/execute_job",
    responses=ERRORS,
    summary="Run a job on the server's machine (admin)",
    description="The job runs as the server's OS user, next to its token and store: an "
    "admin's only, a 403 for anyone else.",
)
def execute_job(body: JobRequest, svc: Svc, who: Caller) -> DistributedJobStatus:
    svc.tasks.check_limit(who.name, 1)
    return svc.jobs.execute_here(body, owner=who.name)


@router.get("/local_job_status/{job_id}", responses=ERRORS, summary="A job's status")
def local_job_status(job_id: str, svc: Svc, who: Caller) -> DistributedJobStatus:
    return shown_status(svc.jobs.status(job_id), who)


@router.get(
    "/local_job_output/{job_id}",
    responses=ERRORS,
    summary="Merged [host:rank] output, paged by byte offset",
)
def local_job_output(
    job_id: str,
    svc: Svc,
    offset: Annotated[int, Query(ge=0, le=2**62)] = 0,
    limit: Annotated[int, Query(ge=1, le=100_000)] = 1000,
    *,
    who: Caller,
) -> OutputPage:
    who.require_reader(svc.jobs.row(job_id).owner, f"reading job {job_id}'s output")
    return svc.jobs.output(job_id, offset, limit)


@router.get(
    "/local_job_file/{job_id}/{key:path}",
    responses={
        **ERRORS,
        403: {"description": "Outside the job's run dir."},
        200: {"content": {"application/octet-stream": {}}},
    },
    response_class=FileResponse,
    summary="A file of the job's run dir (logs, result.json, plan)",
)
def local_job_file(job_id: str, key: str, svc: Svc, who: Caller) -> FileResponse:
    who.require_reader(svc.jobs.row(job_id).owner, f"reading job {job_id}'s files")
    path = svc.jobs.file(job_id, key)
    media = "application/json" if path.suffix == ".json" else "text/plain"
    return FileResponse(path, media_type=media, filename=path.name)


# -- links ---------------------------------------------------------------------------------


@router.get("/links", summary="The last link matrix measured between machines")
def last_links(request: Request) -> LinksOut:
    found: LinksOut | None = getattr(request.app.state, "links", None)
    return found or LinksOut(measured=False)


@router.post(
    "/links",
    responses=ERRORS,
    summary="Measure the link matrix between machines (bandwidth, round trip, heatmap)",
)
async def measure_links_now(request: Request, body: LinksIn, svc: Svc) -> LinksOut:
    ids = body.machine_ids or [m.id for m in svc.machines.list_all()]
    machines = svc.machines.rows(ids)
    result = await measure_machines(machines, svc.settings, body)
    request.app.state.links = result
    return result
