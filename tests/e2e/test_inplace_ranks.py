"""An in-place job's replica groups each number their ranks from 0: the status keeps
every node's ranks and progress apart (``corral job status`` and the job page read
it), and ``/metrics`` labels them as the groups do. The app in Starlette's TestClient
over SQLite; the supervisor's events written to the job's events file."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console

from corral.api.app import create_app
from corral.api.services import Services
from corral.cli.jobview import print_status
from corral.job.events import AttemptStarted, JobEvent, Progress, RankExited, json_of
from corral.service.eventlog import EVENTS_FILE, append_event
from corral.service.settings import ServerSettings
from corral.store import open_store
from corral.store.models import Job
from tests.serverlib import TOKEN

AUTH = {"Authorization": f"Bearer {TOKEN}"}
HOSTS = ["sim1", "sim2"]


@pytest.fixture
def api(tmp_path: Path) -> Iterator[tuple[TestClient, Any]]:
    store = open_store(f"sqlite:///{tmp_path / 'corral.db'}")
    settings = ServerSettings(run_dir=tmp_path / "runs", health_interval=0)
    app = create_app(Services.build(store, settings), TOKEN, background=False)
    try:
        with TestClient(app, base_url="http://127.0.0.1") as client:
            for name in HOSTS:
                body = {"name": name, "local": True, "slots": 2}
                made = client.post("/api/network/machines", headers=AUTH, json=body)
                assert made.status_code == 201, made.text
            yield client, store
    finally:
        store.close()


def test_each_groups_ranks_are_kept_apart(api: tuple[TestClient, Any], tmp_path: Path) -> None:
    client, store = api
    script = tmp_path / "train.py"
    script.write_text("print('never run')\n")
    body = {
        "script": str(script),
        "launcher": "torchrun",
        "nproc_per_node": 2,
        "recovery": "in-place",
        "preflight": False,
        "resource_requirements": {"num_machines": 2},
    }
    planned = client.post("/api/network/distributed/plan", headers=AUTH, json=body)
    assert planned.status_code == 200, planned.text
    job_id = planned.json()["job_id"]
    with store.session() as s:
        row = s.get(Job, job_id)
        row.state, row.started = "running", time.time()
        path = Path(row.run_dir) / EVENTS_FILE
    t0 = time.time()
    events: list[JobEvent] = [AttemptStarted(job_id=job_id, number=1, hosts=HOSTS, world_size=4)]
    steps = {("sim1", 0): 40, ("sim1", 1): 41, ("sim2", 0): 30, ("sim2", 1): 31}
    for (host, rank), step in steps.items():
        events.append(Progress(job_id=job_id, time=t0, host=host, rank=rank, step=step, total=100))
    events.append(RankExited(job_id=job_id, host="sim2", rank=1, code=-9))
    for event in events:
        append_event(path, json_of(event))
    # the second batch, in a later ingest round, lands on the same rows
    late = Progress(job_id=job_id, time=t0 + 1, host="sim2", rank=0, step=35, total=100)
    assert client.get(f"/api/jobs/{job_id}", headers=AUTH).status_code == 200  # one round
    append_event(path, json_of(late))
    status = client.get(f"/api/jobs/{job_id}", headers=AUTH).json()
    nodes = {n["host"]: n for n in status["nodes"]}
    assert {h: n["ranks"] for h, n in nodes.items()} == {"sim1": [0, 1], "sim2": [0, 1]}
    assert nodes["sim1"]["progress"]["step"] == 40  # its slowest rank
    assert nodes["sim2"]["progress"]["step"] == 31
    assert {r: v["step"] for r, v in nodes["sim2"]["progress"]["ranks"].items()} == {
        "0": 35,
        "1": 31,
    }
    assert nodes["sim2"]["progress"]["ranks"]["1"]["code"] == -9
    assert nodes["sim1"]["progress"]["ranks"]["1"]["code"] is None
    console = Console(width=200, record=True, color_system=None)
    print_status(status, console)
    text = console.export_text()
    for host in HOSTS:
        assert any(host in line and "0-1" in line for line in text.splitlines()), text
    labels = {
        (s.labels["host"], s.labels["rank"]): s.value
        for family in text_string_to_metric_families(client.get("/metrics", headers=AUTH).text)
        for s in family.samples
        if s.name == "corral_rank_step" and s.labels["job_id"] == job_id
    }
    assert labels == {
        ("sim1", "0"): 40.0,
        ("sim1", "1"): 41.0,
        ("sim2", "0"): 35.0,
        ("sim2", "1"): 31.0,
    }
