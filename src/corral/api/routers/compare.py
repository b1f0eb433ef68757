"""``/api/compare``: several jobs' metric series in one answer (the compare page)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query, Security

from corral.api.auth import bearer
from corral.api.routers.network import ERRORS
from corral.api.services import Services, services
from corral.errors import Invalid
from corral.service.compare import (
    DEFAULT_POINTS,
    MAX_JOBS,
    MAX_POINTS,
    MIN_POINTS,
    Comparison,
    compare,
)

router = APIRouter(prefix="/api/compare", tags=["jobs"], dependencies=[Security(bearer)])
Svc = Annotated[Services, Depends(services)]
MAX_NAME = 128


@router.get(
    "",
    responses=ERRORS,
    summary="Several jobs' metric series (loss curves) in one answer",
    description=f"Each job's numeric metrics from its progress reports (the lowest rank "
    f"that reported), each point `[step, seconds since the job started, value]`; "
    f"`shared`: the metrics every job reported. At most {MAX_JOBS} jobs (`job_id` "
    f"repeated) and `points` points per series (evenly spaced, first and last kept). "
    f"An unknown job is a 404.",
)
def compare_jobs(
    svc: Svc,
    job_id: Annotated[list[str], Query(description=f"A job (repeat: 1 to {MAX_JOBS}).")],
    metric: Annotated[
        list[str] | None, Query(description="Only these metrics (repeatable).")
    ] = None,
    points: Annotated[int, Query(ge=MIN_POINTS, le=MAX_POINTS)] = DEFAULT_POINTS,
) -> Comparison:
    for field, values in (("job_id", job_id), ("metric", metric or [])):
        if len(values) > 4 * MAX_JOBS:
            raise Invalid(f"too many {field} values ({len(values)})", details={"field": field})
        for value in values:
            if not 0 < len(value) <= MAX_NAME:
                raise Invalid(f"{field} must be 1..{MAX_NAME} characters", details={"field": field})
    for one in list(dict.fromkeys(job_id))[:MAX_JOBS]:
        svc.jobs.queries.ingest.catch_up(one)  # a running job's latest reports too
    return compare(svc.store, job_id, metrics=metric or (), points=points)
