"""Users, roles, the audit log and the queue of ``corral serve``: the app in Starlette's
TestClient (the whole middleware stack, no background scheduler) over SQLite and
PostgreSQL, and one real ``corral serve`` for the CLI (``serve user``, ``job queue``).

The machines are SSH hosts never health-checked: a job queued for them waits (its
reason says why) and nothing is started."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from corral.api.app import create_app
from corral.api.services import Services
from corral.service.settings import ServerSettings
from corral.store import open_store
from corral.store.models import Job
from tests.serverlib import live_server

TOKEN = "users-test-token-" + "Qw8eRt5yUi2oPa7sDf4gHj1kLz9xCv6b"
REQUEST = {"script": "train.py", "launcher": "python", "preflight": False}


def _as(client: TestClient, token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
def app(store_url: str, tmp_path: Path) -> Iterator[tuple[TestClient, Services]]:
    store = open_store(store_url)
    svc = Services.build(store, ServerSettings(run_dir=tmp_path / "runs", health_interval=0))
    try:
        with TestClient(create_app(svc, TOKEN, background=False)) as client:
            client.headers["Authorization"] = f"Bearer {TOKEN}"
            for name in ("gpu1", "gpu2"):
                r = client.post("/api/network/machines", json={"name": name, "host": "10.9.9.9"})
                assert r.status_code == 201, r.text
            yield client, svc
    finally:
        store.close()


def _add(client: TestClient, name: str, role: str) -> str:
    r = client.post("/api/users", json={"name": name, "role": role})
    assert r.status_code == 201, r.text
    assert r.json()["role"] == role
    return str(r.json()["token"])


def _queue(client: TestClient, token: str, **params: Any) -> dict[str, Any]:
    r = client.post("/api/jobs/queue", json=REQUEST, params=params, headers=_as(client, token))
    assert r.status_code == 201, r.text
    return dict(r.json())


def test_roles_owners_revoke_and_the_audit_log(
    app: tuple[TestClient, Services], store_url: str
) -> None:
    client, _ = app
    alice, bob, vic = (
        _add(client, n, r) for n, r in (("alice", "user"), ("bob", "user"), ("vic", "viewer"))
    )
    assert client.get("/api/me", headers=_as(client, vic)).json() == {
        "name": "vic",
        "role": "viewer",
    }

    # a viewer reads, and every state change is a 403 naming the role
    assert client.get("/api/jobs", headers=_as(client, vic)).status_code == 200
    refused = client.post("/api/jobs/queue", json=REQUEST, headers=_as(client, vic))
    assert refused.status_code == 403 and "viewer" in refused.json()["error"]["message"]
    # a user manages neither machines, users, preferences nor the audit log
    for method, path, body in (
        ("POST", "/api/network/machines", {"name": "x", "host": "10.0.0.1"}),
        ("DELETE", "/api/network/machines/by-name/gpu1", None),
        ("POST", "/api/users", {"name": "eve"}),
        ("PUT", "/api/preferences", {}),
        ("GET", "/api/audit", None),
        ("GET", "/api/users", None),
    ):
        r = client.request(method, path, json=body, headers=_as(client, alice))
        assert r.status_code == 403, (method, path, r.text)
        assert r.json()["error"]["details"]["needed"] == "admin"

    # jobs record their owner; "mine" filters; only the owner or an admin stops/deletes
    mine = _queue(client, alice)["job_id"]
    theirs = _queue(client, bob)["job_id"]
    listed = client.get("/api/jobs", params={"mine": "true"}, headers=_as(client, alice)).json()
    assert [(j["job_id"], j["owner"]) for j in listed["jobs"]] == [(mine, "alice")]
    assert client.get(f"/api/jobs/{theirs}").json()["owner"] == "bob"
    assert (
        client.post(
            f"/api/network/distributed/stop/{theirs}", headers=_as(client, alice)
        ).status_code
        == 403
    )
    assert client.delete(f"/api/jobs/{theirs}", headers=_as(client, alice)).status_code == 403
    assert (
        client.post(f"/api/network/distributed/stop/{mine}", headers=_as(client, alice)).status_code
        == 200
    )
    assert client.delete(f"/api/jobs/{mine}", headers=_as(client, alice)).status_code == 200
    assert client.post(f"/api/network/distributed/stop/{theirs}").status_code == 200  # admin

    # revoked: the token is dead at once; the jobs stay bob's
    assert client.delete("/api/users/bob").json()["revoked"] is not None
    assert client.get("/api/jobs", headers=_as(client, bob)).status_code == 401
    assert client.get(f"/api/jobs/{theirs}").json()["owner"] == "bob"
    assert client.delete("/api/users/admin").status_code == 422  # the server's own token

    # the audit log: every state change with its outcome, no GET, admins only
    audit = client.get("/api/audit", params={"limit": 500}).json()
    seen = [(e["user"], e["method"], e["path"], e["status"]) for e in audit["entries"]]
    assert ("vic", "POST", "/api/jobs/queue", 403) in seen
    assert ("alice", "DELETE", f"/api/jobs/{mine}", 200) in seen
    assert ("admin", "DELETE", "/api/users/bob", 200) in seen
    assert (None, "GET", "/api/jobs", 401) not in seen
    assert all(e["method"] != "GET" for e in audit["entries"])
    assert audit["total"] == len(seen)
    page = client.get("/api/audit", params={"limit": 2, "offset": 1}).json()
    assert [e["id"] for e in page["entries"]] == [e["id"] for e in audit["entries"][1:3]]

    # tokens are stored only as hashes
    if store_url.startswith("sqlite"):
        raw = b"".join(p.read_bytes() for p in Path(store_url[10:]).parent.glob("corral.db*"))
        for token in (TOKEN, alice, vic):
            assert token.encode() not in raw


def test_priority_fifo_limits_and_reordering(app: tuple[TestClient, Services]) -> None:
    client, svc = app
    alice, bob = _add(client, "alice", "user"), _add(client, "bob", "user")
    first = _queue(client, alice)["job_id"]
    second = _queue(client, bob)["job_id"]
    urgent = _queue(client, TOKEN, priority=5)["job_id"]
    assert (
        client.post(
            "/api/jobs/queue", json=REQUEST, params={"priority": 5}, headers=_as(client, bob)
        ).status_code
        == 403
    )

    queue = client.get("/api/queue", headers=_as(client, alice)).json()
    assert [(e["job_id"], e["priority"], e["owner"]) for e in queue] == [
        (urgent, 5, "admin"),
        (first, 0, "alice"),
        (second, 0, "bob"),
    ]
    assert queue[0]["reason"].startswith("waiting for 1 machine: gpu1 never health-checked")

    # reordering: admins only; --top puts a job ahead of every other
    move = f"/api/queue/{second}/move"
    assert client.post(move, json={"top": True}, headers=_as(client, bob)).status_code == 403
    assert client.post(move, json={"top": True}).json()["priority"] == 6
    assert (
        client.post(f"/api/queue/{first}/move", json={"top": True, "priority": 1}).status_code
        == 422
    )
    assert [e["job_id"] for e in client.get("/api/queue").json()] == [second, urgent, first]

    # a per-user limit: the reason names it, the job waits (and does not start)
    client.put("/api/users/alice/limits", json={"jobs": 1, "machines": 1})
    with svc.store.session() as s:
        s.add(Job(id="j-run", state="running", created=1.0, owner="alice", machine_ids=["m"]))
    assert _queue(client, alice)["reason"] == "alice has 1 running, limit 1"
    svc.tasks.schedule_once()
    reasons = {e["job_id"]: e["reason"] for e in client.get("/api/queue").json()}
    assert reasons[first] == "alice has 1 running, limit 1"
    # a job over the machine limit can never run: refused at once, with the reason
    over = client.post(
        "/api/jobs/queue",
        json={**REQUEST, "resource_requirements": {"num_machines": 2}},
        headers=_as(client, alice),
    )
    assert over.status_code == 409
    assert over.json()["error"]["message"] == "it needs 2 machines and alice's limit is 1"


def test_serve_user_cli_and_job_queue(tmp_path: Path) -> None:
    with live_server(tmp_path / "srv") as server:
        base = [sys.executable, "-m", "corral"]
        db = ["--db", server.db_url, "--token-file", str(server.token_file)]
        added = subprocess.run(
            [*base, "serve", "user", "add", "alice", "--role", "user", *db],
            capture_output=True,
            text=True,
            check=True,
        )
        alice = added.stdout.strip()
        assert len(alice) >= 43 and alice not in added.stderr
        listed = subprocess.run(
            [*base, "serve", "user", "list", *db], capture_output=True, text=True, check=True
        )
        assert "alice" in listed.stdout and "admin" in listed.stdout and alice not in listed.stdout
        with server.client() as admin:
            assert (
                admin.post(
                    "/api/network/machines", json={"name": "gpu1", "host": "10.9.9.9"}
                ).status_code
                == 201
            )
        env = {**os.environ, "CORRAL_TOKEN": alice}
        common = ["--server", server.url]
        script = tmp_path / "train.py"
        script.write_text("print('hi')\n")
        submitted = subprocess.run(
            [*base, "job", "submit", *common, "--queue", "--launcher", "python", "--", str(script)],
            capture_output=True,
            text=True,
            env=env,
        )
        assert submitted.returncode == 0, submitted.stderr
        job_id = submitted.stdout.strip()
        shown = subprocess.run(
            [*base, "job", "queue", *common], capture_output=True, text=True, env=env
        )
        assert shown.returncode == 0, shown.stderr
        assert job_id in shown.stdout and "alice" in shown.stdout and "gpu1" in shown.stdout
        moved = subprocess.run(
            [*base, "job", "queue", *common, "--move", job_id, "--top"],
            capture_output=True,
            text=True,
            env=env,
        )
        assert moved.returncode != 0 and "admin" in moved.stderr
        subprocess.run(
            [*base, "serve", "user", "revoke", "alice", *db], check=True, capture_output=True
        )
        refused = subprocess.run(
            [*base, "job", "list", *common], capture_output=True, text=True, env=env
        )
        assert refused.returncode != 0
