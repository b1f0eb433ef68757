"""``recovery`` and ``spares`` of a job request (``--recovery in-place`` from the API):
accepted, refused with the field named, and carried into the stored job description
that the supervisor process runs. The app runs in Starlette's TestClient over SQLite."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from corral.api.app import create_app
from corral.api.services import Services
from corral.job.build import policies
from corral.job.describe import JobDescription
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
        ({"spares": 1}, "spares", "needs recovery in-place"),
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
