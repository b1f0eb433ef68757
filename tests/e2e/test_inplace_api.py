"""``recovery`` and ``spares`` of a job request (``--recovery in-place`` from the API):
accepted, refused with the field named, and carried into the stored job description
that the supervisor process runs; the replica groups' changes a supervisor writes
shown by the status, ``/metrics`` (participants gauge) and ``corral job status``.
The app runs in Starlette's TestClient over SQLite."""

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
from corral.job.build import policies
from corral.job.describe import JobDescription
from corral.job.events import AttemptStarted, GroupChanged, JobEvent, json_of
from corral.service.eventlog import EVENTS_FILE, append_event
from corral.service.settings import ServerSettings
from corral.store import open_store
from corral.store.models import Job
from tests.serverlib import TOKEN

AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def api(tmp_path: Path) -> Iterator[tuple[TestClient, Any]]:
    """The app over SQLite with three local machines, and its store."""
    store = open_store(f"sqlite:///{tmp_path / 'corral.db'}")
    settings = ServerSettings(run_dir=tmp_path / "runs", health_interval=0)
    app = create_app(Services.build(store, settings), TOKEN, background=False)
    try:
        with TestClient(app, base_url="http://127.0.0.1") as client:
            for name in ("sim1", "sim2", "sim3"):
                made = client.post(
                    "/api/network/machines",
                    headers=AUTH,
                    json={"name": name, "local": True, "slots": 1},
                )
                assert made.status_code in (200, 201), made.text
            yield client, store
    finally:
        store.close()


def _plan(client: TestClient, **extra: Any) -> Any:
    body = {
        "script": "examples/train_ft.py",
        "launcher": "torchrun",
        "nproc_per_node": 1,
        "resource_requirements": {"num_machines": 3},
        "preflight": False,
        **extra,
    }
    return client.post("/api/network/distributed/plan", headers=AUTH, json=body)


def test_an_in_place_plan_stores_recovery_and_spares(api: tuple[TestClient, Any]) -> None:
    client, store = api
    r = _plan(client, recovery="in-place", spares=1)
    assert r.status_code == 200, r.text
    answer = r.json()
    ft = answer["execution_plan"]["fault_tolerance"]
    assert (ft["recovery"], ft["spares"]) == ("in-place", 1)
    with store.session() as s:
        row = s.get(Job, answer["job_id"])
        assert row is not None
        assert (row.request["recovery"], row.request["spares"]) == ("in-place", 1)
        description = JobDescription.from_dict(row.launch)
    # what the supervisor process builds from the stored description
    assert (description.options.recovery, description.options.spares) == ("in-place", 1)
    made = policies(description.options)
    assert made.recovery.in_place and made.recovery.spares == 1


def test_a_plan_without_them_keeps_restart(api: tuple[TestClient, Any]) -> None:
    client, _ = api
    r = _plan(client)
    assert r.status_code == 200, r.text
    ft = r.json()["execution_plan"]["fault_tolerance"]
    assert (ft["recovery"], ft["spares"]) == ("restart", 0)


@pytest.mark.parametrize(
    ("extra", "field", "words"),
    [
        ({"recovery": "elastic"}, "recovery", "in-place"),
        ({"spares": -1}, "spares", "greater than or equal"),
        ({"spares": 1}, "spares", "needs --recovery in-place"),  # the builder's rule
        ({"recovery": "in-place", "launcher": "accelerate"}, "recovery", "launcher"),
        ({"recovery": "in-place", "spares": 2}, "recovery", "at least 2 nodes"),
        ({"recovery": "in-place", "spares": 3}, "spares", "leave no host"),
        (
            {"recovery": "in-place", "resource_requirements": {"num_machines": 1}},
            "recovery",
            "at least 2 nodes",
        ),
    ],
)
def test_bad_recovery_requests_are_4xx_naming_the_field(
    api: tuple[TestClient, Any], extra: dict[str, Any], field: str, words: str
) -> None:
    client, _ = api
    r = _plan(client, **extra)
    assert r.status_code == 422, r.text
    error = r.json()["error"]
    assert field in error["message"] and words in error["message"], error


# -- group changes: the status, /metrics, corral job status ---------------------------------


def _running_in_place(client: TestClient, store: Any) -> str:
    """An in-place job planned on sim1-3 (sim3 spare) whose supervisor wrote: attempt 1
    on sim1, sim2; sim2's group lost, restarted on sim3, rejoined healed from sim1."""
    r = _plan(client, recovery="in-place", spares=1)
    assert r.status_code == 200, r.text
    job_id = str(r.json()["job_id"])
    with store.session() as s:
        row = s.get(Job, job_id)
        row.state, row.started = "running", time.time()
        path = Path(row.run_dir) / EVENTS_FILE
    events: list[JobEvent] = [
        AttemptStarted(job_id=job_id, number=1, hosts=["sim1", "sim2"], world_size=2),
        GroupChanged(
            job_id=job_id,
            host="sim2",
            group=1,
            change="lost",
            participants=1,
            step=57,
            detail="rank 0 on sim2 was killed by SIGKILL",
        ),
        GroupChanged(
            job_id=job_id,
            host="sim3",
            group=1,
            change="restarting",
            participants=1,
            detail="sim2 does not answer: on spare sim3",
        ),
    ]
    for event in events:
        append_event(path, json_of(event))
    return job_id


def _participants(client: TestClient, job_id: str) -> float | None:
    body = client.get("/metrics", headers=AUTH).text
    for family in text_string_to_metric_families(body):
        for sample in family.samples:
            if sample.name == "corral_job_participants" and sample.labels["job_id"] == job_id:
                return float(sample.value)
    return None


def test_group_changes_show_in_status_metrics_and_job_status(
    api: tuple[TestClient, Any],
) -> None:
    client, store = api
    job_id = _running_in_place(client, store)
    status = client.get(f"/api/network/distributed/status/{job_id}", headers=AUTH)
    assert status.status_code == 200, status.text
    groups = status.json()["groups"]
    assert [(g["host"], g["change"], g["participants"]) for g in groups] == [
        ("sim2", "lost", 1),
        ("sim3", "restarting", 1),
    ]
    assert groups[0]["step"] == 57 and "SIGKILL" in groups[0]["detail"]
    assert _participants(client, job_id) == 1.0
    # the lost group rejoins: the gauge follows the last change
    with store.session() as s:
        path = Path(s.get(Job, job_id).run_dir) / EVENTS_FILE
    rejoined = GroupChanged(
        job_id=job_id,
        host="sim3",
        group=1,
        change="rejoined",
        participants=2,
        step=71,
        healed_from="sim1",
    )
    append_event(path, json_of(rejoined))
    status = client.get(f"/api/network/distributed/status/{job_id}", headers=AUTH).json()
    assert status["groups"][-1]["healed_from"] == "sim1"
    assert _participants(client, job_id) == 2.0
    # corral job status renders them
    console = Console(width=200, record=True, color_system=None)
    print_status(status, console)
    text = console.export_text()
    assert "node sim2 (group 1) lost at step 57; 1 group training (rank 0 on sim2" in text
    assert "node sim3 (group 1) rejoined at step 71, healed from sim1; 2 groups training" in text


def test_an_in_place_job_counts_its_groups_before_any_change(
    api: tuple[TestClient, Any],
) -> None:
    client, store = api
    r = _plan(client, recovery="in-place")
    job_id = str(r.json()["job_id"])
    other = str(_plan(client).json()["job_id"])  # a restart job: no gauge
    for planned in (job_id, other):
        with store.session() as s:
            row = s.get(Job, planned)
            row.state, row.started = "running", time.time()
            path = Path(row.run_dir) / EVENTS_FILE
        started = AttemptStarted(
            job_id=planned, number=1, hosts=["sim1", "sim2", "sim3"], world_size=3
        )
        append_event(path, json_of(started))
        client.get(f"/api/network/distributed/status/{planned}", headers=AUTH)
    assert _participants(client, job_id) == 3.0
    assert _participants(client, other) is None
