"""``/api/tasks/*`` (saved job templates, the queue, machine suggestions) and
``/api/preferences``."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Security

from corral.api.auth import Caller, bearer, require_admin
from corral.api.hardening import bearer_only
from corral.api.routers.network import ERRORS
from corral.api.services import Services, services
from corral.service.machines import busy_machines
from corral.service.models import (
    JobRequest,
    Preferences,
    QueuedOut,
    ResourceRequirements,
    Suggestion,
    TaskIn,
    TaskOut,
)
from corral.service.planner import suggest
from corral.service.trust import mark_server_host

router = APIRouter(prefix="/api", tags=["tasks"], dependencies=[Security(bearer)])
Svc = Annotated[Services, Depends(services)]


@router.get("/tasks", summary="All tasks")
def list_tasks(svc: Svc) -> list[TaskOut]:
    return svc.tasks.list_tasks()


@router.post("/tasks", status_code=201, responses=ERRORS, summary="Save a task")
def create_task(body: TaskIn, svc: Svc, who: Caller) -> TaskOut:
    who.may_prioritise(body.priority)
    return svc.tasks.create(body, owner=who.name)


@router.get(
    "/tasks/distributed/suggest_machines",
    summary="Machines ranked for a distributed job",
    description="Score = 10 x free GPUs + smallest GPU memory (GiB) + (100 - CPU%)/10 "
    "+ (100 - memory%)/20 + 5 for a preferred machine; eligible machines (online, not "
    "busy, enough GPUs/GPU memory/slots) first. A local machine is not eligible for "
    "anyone but an admin (it runs jobs on the server's own host).",
)
def suggest_machines(
    svc: Svc,
    who: Caller,
    num_machines: Annotated[int, Query(ge=1, le=4096)] = 1,
    gpus_per_machine: Annotated[int, Query(ge=0, le=1024)] = 0,
    min_gpu_memory: Annotated[float, Query(ge=0, le=1e6, allow_inf_nan=False)] = 0,
    nproc_per_node: Annotated[int | None, Query(ge=1, le=1024)] = None,
) -> list[Suggestion]:
    from sqlalchemy import select

    from corral.store.models import Machine

    needs = ResourceRequirements(
        num_machines=num_machines, gpus_per_machine=gpus_per_machine, min_gpu_memory=min_gpu_memory
    )
    request = JobRequest.model_validate(
        {"script": "-", "nproc_per_node": nproc_per_node, "resource_requirements": needs}
    )
    with svc.store.session() as s:
        machines = list(s.scalars(select(Machine)).all())
    preferred = svc.tasks.preferences().preferred_machines
    ranked = suggest(machines, request, busy_machines(svc.store), preferred)
    return mark_server_host(ranked, machines, who.admin)


@router.get("/tasks/{task_id}", responses=ERRORS, summary="One task")
def get_task(task_id: str, svc: Svc) -> TaskOut:
    return svc.tasks.get(task_id)


QUEUE_ERRORS: dict[int | str, dict[str, Any]] = {
    **ERRORS,
    403: {"description": "The GET form with a web session (the page uses POST)."},
}


Priority = Annotated[
    int | None,
    Query(ge=-1_000_000, le=1_000_000, description="Default: the task's (above 0: admins)."),
]


def queue_distributed(task_id: str, svc: Svc, who: Caller, priority: Priority = None) -> QueuedOut:
    who.require_owner(svc.tasks.row(task_id).owner, f"queuing task {task_id}")
    who.may_prioritise(priority)
    return svc.tasks.queue(task_id, owner=who.name, priority=priority)


def queue_on_machine(
    task_id: str, machine_id: str, svc: Svc, who: Caller, priority: Priority = None
) -> QueuedOut:
    who.require_owner(svc.tasks.row(task_id).owner, f"queuing task {task_id}")
    who.may_prioritise(priority)
    return svc.tasks.queue(task_id, machine_id, owner=who.name, priority=priority)


# POST: what the web page (session cookie + CSRF token) and new clients use; the seed's
# GET form stays for bearer-token clients only (a session's CSRF check trusts GET)
router.add_api_route(
    "/tasks/{task_id}/queue_distributed",
    queue_distributed,
    methods=["POST"],
    responses=ERRORS,
    summary="Queue the task as a distributed job",
)
router.add_api_route(
    "/tasks/{task_id}/queue/{machine_id}",
    queue_on_machine,
    methods=["POST"],
    responses=ERRORS,
    summary="Queue the task to run on one machine",
)
router.add_api_route(
    "/tasks/{task_id}/queue_distributed",
    queue_distributed,
    methods=["GET"],
    responses=QUEUE_ERRORS,
    dependencies=[Depends(bearer_only)],
    operation_id="queue_distributed_get",
    deprecated=True,
    summary="Queue the task as a distributed job (the seed's GET; bearer token only)",
    description="Use POST: this GET changes state (it is audited like the POST).",
)
router.add_api_route(
    "/tasks/{task_id}/queue/{machine_id}",
    queue_on_machine,
    methods=["GET"],
    responses=QUEUE_ERRORS,
    dependencies=[Depends(bearer_only)],
    operation_id="queue_on_machine_get",
    deprecated=True,
    summary="Queue the task to run on one machine (the seed's GET; bearer token only)",
    description="Use POST: this GET changes state (it is audited like the POST).",
)


@router.get("/preferences", summary="Saved distributed-training preferences")
def get_preferences(svc: Svc) -> Preferences:
    return svc.tasks.preferences()


@router.put(
    "/preferences",
    responses=ERRORS,
    dependencies=[Depends(require_admin)],
    summary="Save preferences (admin)",
)
def put_preferences(body: Preferences, svc: Svc, who: Caller) -> Preferences:
    return svc.tasks.save_preferences(body, by=who.name)
