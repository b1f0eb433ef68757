"""Several jobs' metric series in one answer, for the compare page.

Each job's series come from its stored ``progress`` events (what ``corral.sdk.report``
sent, kept by the ingest as :class:`~corral.store.models.Event` rows): one series per
numeric metric, from the lowest rank that reported (rank 0 as a rule, so one line per
job), each point ``[step, seconds since the job started, value]`` (``step`` null when
the report had none). The answer is bounded: at most :data:`MAX_JOBS` jobs and
``points`` points per series (evenly spaced over the series, its first and last kept).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from pydantic import BaseModel, Field
from sqlalchemy import select

from corral.errors import Invalid, NotFound
from corral.job.events import Progress, decode_event
from corral.service.queries import display_name
from corral.store import Store
from corral.store.models import Event, Job, Task

#: The most jobs one comparison reads.
MAX_JOBS = 8
#: The bounds of the points per series (``points``), and the default.
MIN_POINTS = 2
MAX_POINTS = 2000
DEFAULT_POINTS = 500
#: The most metrics per job (the first ones it reported when it reports more).
MAX_METRICS = 32

Point = tuple[int | None, float, float]


class JobSeries(BaseModel):
    """One job's metric series."""

    job_id: str
    name: str | None = None
    status: str
    rank: int | None = Field(None, description="The rank whose reports these are.")
    series: dict[str, list[Point]] = Field(
        default_factory=dict, description="Metric -> points [step, seconds, value]."
    )
    reported: dict[str, int] = Field(
        default_factory=dict, description="Metric -> points before downsampling."
    )


class Comparison(BaseModel):
    """The jobs' series; ``shared``: the metrics every job reported."""

    jobs: list[JobSeries]
    shared: list[str]
    points: int = Field(description="The most points per series in this answer.")


def compare(
    store: Store,
    job_ids: Sequence[str],
    *,
    metrics: Sequence[str] = (),
    points: int = DEFAULT_POINTS,
) -> Comparison:
    """The series of ``job_ids`` (in that order, repeats dropped), only ``metrics`` when
    given; Invalid beyond the bounds, NotFound for an unknown job. The stored progress
    events are read as the engine's :class:`~corral.job.events.Progress` (the one
    decoder, :func:`~corral.job.events.decode_event`)."""
    ids = list(dict.fromkeys(job_ids))
    if not ids:
        raise Invalid("give at least one job (job_id=...)", details={"field": "job_id"})
    if len(ids) > MAX_JOBS:
        raise Invalid(
            f"at most {MAX_JOBS} jobs in one comparison ({len(ids)} given)",
            details={"field": "job_id", "max": MAX_JOBS},
        )
    if not MIN_POINTS <= points <= MAX_POINTS:
        raise Invalid(
            f"points must be {MIN_POINTS}..{MAX_POINTS} ({points} given)",
            details={"field": "points"},
        )
    wanted = set(metrics)
    out: list[JobSeries] = []
    with store.session() as s:
        rows = {j.id: j for j in s.scalars(select(Job).where(Job.id.in_(ids)))}
        missing = [i for i in ids if i not in rows]
        if missing:
            raise NotFound(f"no job {missing[0]!r}", details={"job_id": missing[0]})
        for job_id in ids:
            job = rows[job_id]
            rows_of = s.execute(
                select(Event.kind, Event.time, Event.data)
                .where(Event.job_id == job_id, Event.kind == Progress.kind)
                .order_by(Event.pos)
            ).all()
            reports = [
                event
                for kind, when, data in rows_of
                if isinstance(
                    event := decode_event({**(data or {}), "kind": kind, "time": when}, job_id),
                    Progress,
                )
            ]
            task = s.get(Task, job.task_id) if job.task_id else None
            shown = display_name(job, task.name if task else None)
            out.append(_series(job, shown, reports, wanted, points))
    shared = sorted(set.intersection(*(set(j.series) for j in out))) if out else []
    return Comparison(jobs=out, shared=shared, points=points)


def _series(
    job: Job, name: str | None, reports: Sequence[Progress], wanted: set[str], points: int
) -> JobSeries:
    """The job's series from its progress reports, the lowest rank's."""
    rank = min((r.rank for r in reports), default=None)
    start = job.started if job.started is not None else (reports[0].time if reports else 0.0)
    full: dict[str, list[Point]] = {}
    for report in reports:
        if report.rank != rank:
            continue
        step, when = report.step, report.time
        for key, value in report.metrics.items():
            if wanted and key not in wanted:
                continue
            if isinstance(value, bool) or not isinstance(value, int | float):
                continue
            if not math.isfinite(value):
                continue
            if key not in full and len(full) >= MAX_METRICS:
                continue
            full.setdefault(key, []).append((step, round(float(when) - start, 3), float(value)))
    return JobSeries(
        job_id=job.id,
        name=name,
        status=job.state,
        rank=rank,
        series={k: downsample(v, points) for k, v in sorted(full.items())},
        reported={k: len(v) for k, v in sorted(full.items())},
    )


def downsample(pts: list[Point], points: int) -> list[Point]:
    """At most ``points`` of ``pts``, evenly spaced, the first and last kept."""
    if len(pts) <= points:
        return pts
    last = len(pts) - 1
    return [pts[round(i * last / (points - 1))] for i in range(points)]
