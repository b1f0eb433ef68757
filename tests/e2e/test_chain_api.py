"""The API of jobs that follow jobs, in Starlette's TestClient over SQLite and
PostgreSQL (no background scheduler: a round is run by hand): ``after`` checked when
queued and at dispatch, a deleted dependency cancels its waiters (found by searching
the stored requests), the scheduler leaves a waiting job without holding the queue;
resubmit and a job's request for their owner and admins only, bad input a 4xx naming
the field."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from corral.api.app import create_app
from corral.api.services import Services
from corral.service.settings import ServerSettings
from corral.store import open_store

TOKEN = "chain-test-token-" + "Qw8eRt5yUi2oPa7sDf4gHj1kLz9xCv6b"
WAITS = {
    "script": "train.py",
    "launcher": "python",
    "preflight": False,
    "machine_selection": "manual",
    "selected_machines": ["gpu1"],
}


@pytest.fixture
def app(store_url: str, tmp_path: Path) -> Iterator[tuple[TestClient, Services]]:
    store = open_store(store_url)
    svc = Services.build(store, ServerSettings(run_dir=tmp_path / "runs", health_interval=0))
    try:
        with TestClient(create_app(svc, TOKEN, background=False)) as client:
            client.headers["Authorization"] = f"Bearer {TOKEN}"
            made = client.post("/api/network/machines", json={"name": "gpu1", "host": "10.9.9.9"})
            assert made.status_code == 201, made.text
            yield client, svc
    finally:
        store.close()


def _queue(client: TestClient, **body: Any) -> str:
    r = client.post("/api/jobs/queue", json={**WAITS, **body})
    assert r.status_code == 201, r.text
    return str(r.json()["job_id"])


def test_after_is_checked_and_a_deleted_dependency_cancels(
    app: tuple[TestClient, Services], tmp_path: Path
) -> None:
    client, svc = app
    first = _queue(client)
    second = _queue(client, after=[first])
    third = _queue(client, after=[second])
    # waiting for a job does not hold the queue: the scheduler passes it by
    svc.tasks.schedule_once()
    entries = {e["job_id"]: e["reason"] for e in client.get("/api/queue").json()}
    assert entries[second] == f"waiting for job {first} to succeed"
    assert entries[third] == f"waiting for job {second} to succeed"
    # bad names, unknown jobs
    r = client.post("/api/jobs/queue", json={**WAITS, "after": ["../etc"]})
    assert r.status_code == 422 and "after" in r.text, r.text
    r = client.post("/api/jobs/queue", json={**WAITS, "after": ["nosuchjob"]})
    assert r.status_code == 404 and "no job nosuchjob" in r.json()["error"]["message"]
    # a planned job that names an unfinished one is not dispatched (409: queue it)
    local = {"name": "local1", "local": True}
    assert client.post("/api/network/machines", json=local).status_code == 201
    script = tmp_path / "train.py"
    script.write_text("print('never run')\n")
    body = {**WAITS, "script": str(script), "selected_machines": ["local1"], "after": [first]}
    planned = client.post("/api/network/distributed/plan", json=body)
    assert planned.status_code == 200, planned.text
    job_id = planned.json()["job_id"]
    r = client.post("/api/network/distributed/dispatch", json={"job_id": job_id})
    assert r.status_code == 409 and "queue it" in r.json()["error"]["message"], r.text
    assert client.get(f"/api/jobs/{job_id}").json()["status"] == "planned"
    # the first is cancelled and deleted: its waiters are cancelled down the chain
    assert client.post(f"/api/network/distributed/stop/{first}").status_code == 200
    assert client.delete(f"/api/jobs/{first}").status_code == 200
    two, three = (client.get(f"/api/jobs/{j}").json() for j in (second, third))
    assert (two["status"], two["reason"]) == (
        "cancelled",
        f"not started: job {first}, which it waits for, cancelled",
    )
    assert (three["status"], three["reason"]) == (
        "cancelled",
        f"not started: job {second}, which it waits for, cancelled",
    )
    r = client.post("/api/jobs/queue", json={**WAITS, "after": [second]})
    assert r.status_code == 409 and "would never start" in r.json()["error"]["message"]


def test_resubmit_and_request_are_the_owners(app: tuple[TestClient, Services]) -> None:
    client, _ = app
    alice = client.post("/api/users", json={"name": "alice", "role": "user"}).json()["token"]
    bob = client.post("/api/users", json={"name": "bob", "role": "user"}).json()["token"]
    as_alice = {"Authorization": f"Bearer {alice}"}
    as_bob = {"Authorization": f"Bearer {bob}"}
    r = client.post("/api/jobs/queue", json={**WAITS, "name": "hers"}, headers=as_alice)
    job_id = r.json()["job_id"]
    r = client.post(f"/api/network/distributed/stop/{job_id}", headers=as_alice)
    assert r.status_code == 200
    assert client.get(f"/api/jobs/{job_id}").json()["reason"] == (
        "stopped by alice (api) before it started"
    )
    assert client.get(f"/api/jobs/{job_id}/request", headers=as_bob).status_code == 403
    assert client.post(f"/api/jobs/{job_id}/resubmit", headers=as_bob).status_code == 403
    r = client.post(f"/api/jobs/{job_id}/resubmit", params={"priority": 5}, headers=as_alice)
    assert r.status_code == 403 and r.json()["error"]["details"]["field"] == "priority"
    r = client.post(f"/api/jobs/{job_id}/resubmit", params={"after": "bad/id"}, headers=as_alice)
    assert r.status_code == 422 and "after" in r.json()["error"]["message"], r.text
    r = client.post(f"/api/jobs/{job_id}/resubmit", params={"priority": -1}, headers=as_alice)
    assert r.status_code == 201, r.text
    again = r.json()
    assert (again["owner"], again["priority"], again["status"]) == ("alice", -1, "queued")
    request = client.get(f"/api/jobs/{again['job_id']}/request", headers=as_alice).json()
    assert request == client.get(f"/api/jobs/{job_id}/request", headers=as_alice).json()
    assert request["name"] == "hers"
