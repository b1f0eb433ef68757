"""``/api/queue``: the queued jobs in order, with why each waits; reordering (admin)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query, Security

from corral.api.auth import Caller, bearer, require_admin
from corral.api.routers.users import FORBIDDEN
from corral.api.services import Services, services
from corral.service.models import QueueEntry, QueueMove

router = APIRouter(prefix="/api/queue", tags=["queue"], dependencies=[Security(bearer)])
Svc = Annotated[Services, Depends(services)]


@router.get(
    "",
    summary="The queue: higher priority first, then first in first out",
    description="Each entry's `reason` says what it waits for (`waiting for 2 machines: "
    "gpu1 busy with J, gpu3 offline`; `alice has 2 running, limit 2`).",
)
def list_queue(
    svc: Svc,
    limit: Annotated[int | None, Query(ge=1, le=100_000, description="Default: all.")] = None,
    offset: Annotated[int, Query(ge=0, le=2**31)] = 0,
) -> list[QueueEntry]:
    return svc.tasks.list_queue(limit, offset)


@router.post(
    "/{job_id}/move",
    responses=FORBIDDEN,
    dependencies=[Depends(require_admin)],
    summary="Give a queued job a new priority, or move it to the top (admin)",
)
def move(job_id: str, body: QueueMove, svc: Svc, who: Caller) -> QueueEntry:
    return svc.tasks.move(job_id, body, by=who.name)
