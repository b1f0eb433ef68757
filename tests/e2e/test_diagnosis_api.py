"""Stragglers and the hang report over the API: the events a supervisor writes go
through the server's ingest into the job's status (``stragglers``, ``hang``) and
``/metrics`` (``corral_rank_straggler_ratio``, the current attempt of active jobs).
The app runs in Starlette's TestClient over SQLite (the in-place tests' fixture)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from corral.job.events import (
    AttemptStarted,
    HangReported,
    JobEvent,
    OddRank,
    Progress,
    StragglerFound,
    json_of,
)
from corral.service.eventlog import EVENTS_FILE, append_event
from corral.store.models import Job
from tests.e2e import test_inplace_api

api = test_inplace_api.api  # the fixture: the app with machines sim1-3, and its store
AUTH = test_inplace_api.AUTH


def _write(path: Path, *events: JobEvent) -> None:
    for event in events:
        append_event(path, json_of(event))


def _ratios(client: TestClient, job_id: str) -> dict[tuple[str, str, str], float]:
    body = client.get("/metrics", headers=AUTH).text
    return {
        (s.labels["host"], s.labels["rank"], s.labels["section"]): float(s.value)
        for family in text_string_to_metric_families(body)
        for s in family.samples
        if s.name == "corral_rank_straggler_ratio" and s.labels["job_id"] == job_id
    }


def test_stragglers_and_the_hang_report_show_in_status_and_metrics(
    api: tuple[TestClient, Any],
) -> None:
    client, store = api
    planned = test_inplace_api._plan(client)
    assert planned.status_code == 200, planned.text
    job_id = str(planned.json()["job_id"])
    with store.session() as s:
        row = s.get(Job, job_id)
        row.state, row.started = "running", time.time()
        path = Path(row.run_dir) / EVENTS_FILE
    t0 = time.time()
    hosts = ["sim1", "sim2", "sim3"]
    slow = StragglerFound(
        job_id=job_id,
        time=t0 + 2,
        host="sim2",
        rank=1,
        section="compute",
        ratio=5.1,
        basis="median",
        span=20,
        step=31,
        text="straggler: rank 1 on sim2, compute 5.1x the median for 20 steps",
    )
    _write(
        path,
        AttemptStarted(job_id=job_id, time=t0, number=1, hosts=hosts, world_size=3),
        *(
            Progress(job_id=job_id, time=t0 + 1, host=h, rank=r, step=30, total=100)
            for r, h in enumerate(hosts)
        ),
        slow,
    )
    status = client.get(f"/api/network/distributed/status/{job_id}", headers=AUTH)
    assert status.status_code == 200, status.text
    named = status.json()["stragglers"]
    assert [(x["host"], x["rank"], x["section"], x["ratio"], x["span"]) for x in named] == [
        ("sim2", 1, "compute", 5.1, 20)
    ]
    assert named[0]["text"] == slow.text and status.json()["hang"] is None
    assert _ratios(client, job_id) == {("sim2", "1", "compute"): 5.1}
    # the job hangs: the report's summary reaches the status
    hang = HangReported(
        job_id=job_id,
        time=t0 + 3,
        summary="odd one out: rank 2 on sim3 at skip (train.py:9); the others are at "
        "all_reduce (train.py:20)",
        message="no rank made progress for 5 s",
        odd=[OddRank(host="sim3", rank=2, where="skip (train.py:9)", frames=["skip"])],
        report=f"{Path(path).parent}/hang/report.md",
    )
    _write(path, hang)
    got = client.get(f"/api/jobs/{job_id}", headers=AUTH).json()["hang"]
    assert got["summary"] == hang.summary and got["message"] == hang.message
    assert got["odd"] == [
        {
            "host": "sim3",
            "rank": 2,
            "where": "skip (train.py:9)",
            "frames": ["skip"],
            "waiting": False,
        }
    ]
    assert got["collective"] is None and got["report"] == hang.report
    # a restart: the gauge is the current attempt's (none named yet), the status keeps them
    _write(path, AttemptStarted(job_id=job_id, time=t0 + 4, number=2, hosts=hosts, world_size=3))
    status = client.get(f"/api/jobs/{job_id}", headers=AUTH).json()
    assert [x["rank"] for x in status["stragglers"]] == [1]
    assert _ratios(client, job_id) == {}
