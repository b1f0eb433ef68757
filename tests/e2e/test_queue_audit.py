"""The queue's per-user cap and the audit log of ``corral serve`` over real HTTP: a
429 naming the cap, one entry per privileged change with who, what, before and
after (the CLI's ``serve user`` commands as ``cli:<os user>``, a login, a GET-spelled
queue route), limits changed one at a time, and requests without a valid token
counted per source instead of one row each.

The machine is an SSH host never health-checked (``--health-interval 0``): a queued
job waits, nothing is started."""

from __future__ import annotations

import getpass
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx

from tests.serverlib import TOKEN, LiveServer, live_server

REQUEST = {"script": "train.py", "launcher": "python", "preflight": False}


def _corral(server: LiveServer, *args: str) -> subprocess.CompletedProcess[str]:
    db = ["--db", server.db_url, "--token-file", str(server.token_file)]
    return subprocess.run(
        [sys.executable, "-m", "corral", "serve", *args, *db],
        capture_output=True,
        text=True,
        check=False,
    )


def _entries(admin: httpx.Client, **params: Any) -> list[dict[str, Any]]:
    page = admin.get("/api/audit", params={"limit": 1000, **params})
    assert page.status_code == 200, page.text
    return list(page.json()["entries"])


def _as(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_the_queued_cap_the_cli_and_every_change_in_the_audit_log(tmp_path: Path) -> None:
    args = ["--health-interval", "0", "--max-queued", "2"]
    with live_server(tmp_path / "srv", args=args) as server, server.client() as admin:
        cli = f"cli:{getpass.getuser()}"
        # `corral serve user add|limit|revoke` go through the API's service functions:
        # one entry each, as the OS user who ran them, with what changed
        added = _corral(server, "user", "add", "alice", "--role", "user")
        assert added.returncode == 0, added.stderr
        alice = added.stdout.strip()
        assert _corral(server, "user", "add", "bob", "--role", "viewer").returncode == 0
        limited = _corral(server, "user", "limit", "alice", "--machines", "4")
        assert limited.returncode == 0, limited.stderr
        limited = _corral(server, "user", "limit", "alice", "--jobs", "3")
        assert limited.returncode == 0, limited.stderr
        assert "jobs 3, machines 4" in limited.stdout  # --jobs did not clear the machines
        assert _corral(server, "user", "revoke", "bob").returncode == 0
        bad = _corral(server, "user", "limit", "alice", "--jobs", "many")
        assert bad.returncode != 0 and "--jobs" in bad.stderr
        changes = [
            (e["user"], e["method"], e["action"], e["target"], e["before"], e["after"])
            for e in reversed(_entries(admin))
        ]
        assert changes == [
            (cli, "CLI", "user.add", "alice", None, {"role": "user", "revoked": None}),
            (cli, "CLI", "user.add", "bob", None, {"role": "viewer", "revoked": None}),
            (
                cli,
                "CLI",
                "user.limit",
                "alice",
                {"jobs": None, "machines": None, "queued": None},
                {"jobs": None, "machines": 4, "queued": None},
            ),
            (
                cli,
                "CLI",
                "user.limit",
                "alice",
                {"jobs": None, "machines": 4, "queued": None},
                {"jobs": 3, "machines": 4, "queued": None},
            ),
            (
                cli,
                "CLI",
                "user.revoke",
                "bob",
                {"role": "viewer", "revoked": None},
                {"role": "viewer", "revoked": changes[-1][5]["revoked"]},
            ),
        ]
        assert changes[-1][5]["revoked"] > 0
        # the server's machine reads the same log: corral serve audit
        shown = subprocess.run(
            [sys.executable, "-m", "corral", "serve", "audit", "--user", cli, "--limit", "2"],
            capture_output=True,
            text=True,
            check=False,
            env={**os.environ, "CORRAL_DB": server.db_url},
        )
        assert shown.returncode == 0, shown.stderr
        lines = shown.stdout.splitlines()
        assert f"{cli}" in lines[0] and "user.revoke bob  [0]" in lines[0], lines
        assert '{"jobs": null, "machines": 4, "queued": null} -> {"jobs": 3' in lines[1], lines
        assert lines[-1] == "2 of 5 entries"
        # the API's limit route changes only the limits given, too
        put = admin.put("/api/users/alice/limits", json={"jobs": 2})
        assert (put.json()["max_jobs"], put.json()["max_machines"]) == (2, 4)

        machine = admin.post("/api/network/machines", json={"name": "gpu1", "host": "10.9.9.9"})
        assert machine.status_code == 201, machine.text
        # a user may have --max-queued jobs queued; one more is a 429 naming the cap
        first = admin.post("/api/jobs/queue", json=REQUEST, headers=_as(alice))
        assert first.status_code == 201, first.text
        task = admin.post("/api/tasks", json={"name": "t", "request": REQUEST}, headers=_as(alice))
        assert task.status_code == 201, task.text
        # the seed's GET spelling queues a job: audited like the POST
        by_get = admin.get(f"/api/tasks/{task.json()['id']}/queue_distributed", headers=_as(alice))
        assert by_get.status_code == 200, by_get.text
        over = admin.post("/api/jobs/queue", json=REQUEST, headers=_as(alice))
        assert over.status_code == 429, over.text
        error = over.json()["error"]
        assert error["type"] == "too_many"
        assert error["message"].startswith("alice has 2 jobs queued, the limit is 2 per user")
        assert error["details"] == {"owner": "alice", "queued": 2, "limit": 2}
        # an admin raises alice's own cap (only that limit changes): one more fits
        raised = admin.put("/api/users/alice/limits", json={"queued": 3}).json()
        assert (raised["max_jobs"], raised["max_machines"], raised["max_queued"]) == (2, 4, 3)
        assert admin.post("/api/jobs/queue", json=REQUEST, headers=_as(alice)).status_code == 201
        assert admin.post("/api/jobs/queue", json=REQUEST, headers=_as(alice)).status_code == 429

        moved = admin.post(f"/api/queue/{first.json()['job_id']}/move", json={"priority": -3})
        assert moved.status_code == 200, moved.text

        # a webhook's entry carries its URL with the credentials masked, never the secret
        url = "http://bot:hunter2@127.0.0.1:9/hook?token=sekret&team=ml"
        hook = admin.post("/api/webhooks", json={"url": url, "secret": "s3cr3t-value"})
        assert hook.status_code == 201, hook.text
        assert admin.delete(f"/api/webhooks/{hook.json()['id']}").status_code == 200

        # a web login is recorded as the user who logged in
        with httpx.Client(base_url=server.url, follow_redirects=False) as browser:
            form = browser.get("/login")
            nonce = re.search(r'name="csrf_token" value="([^"]+)"', form.text)
            assert nonce is not None
            done = browser.post("/login", data={"token": alice, "csrf_token": nonce.group(1)})
            assert done.status_code == 303 and done.headers["location"] == "/", done.text

        alices = _entries(admin, user="alice")
        mine = {(e["action"], e["method"], e["path"], e["status"]): e for e in alices}
        queued = [e for e in alices if e["action"] == "job.queue"]
        assert sorted((e["method"], e["status"]) for e in queued) == [
            ("GET", 200),
            ("POST", 201),
            ("POST", 201),
        ]
        assert all(e["after"]["priority"] == 0 and e["after"]["owner"] == "alice" for e in queued)
        refused = mine[(None, "POST", "/api/jobs/queue", 429)]  # refused: one plain entry
        assert refused["before"] is None and refused["source"] == "127.0.0.1"
        login = mine[("login", "POST", "/login", 303)]
        assert login["target"] == "alice" and login["source"] == "127.0.0.1"
        every = _entries(admin)
        move = next(e for e in every if e["action"] == "queue.move")
        assert (move["user"], move["target"], move["before"], move["after"]) == (
            "admin",
            first.json()["job_id"],
            {"priority": 0},
            {"priority": -3},
        )
        limits = [e for e in every if e["action"] == "user.limit" and e["user"] == "admin"]
        assert [(e["before"]["queued"], e["after"]["queued"]) for e in limits] == [
            (None, 3),
            (None, None),
        ]
        added = next(e for e in every if e["action"] == "machine.add")
        assert (added["user"], added["target"], added["before"]) == (
            "admin",
            machine.json()["id"],
            None,
        )
        assert added["after"]["name"] == "gpu1" and added["after"]["host"] == "10.9.9.9"
        hooks = [e for e in every if e["action"] in ("webhook.add", "webhook.remove")]
        assert [(e["action"], e["target"], e["method"]) for e in hooks] == [
            ("webhook.remove", hook.json()["id"], "DELETE"),
            ("webhook.add", hook.json()["id"], "POST"),
        ]
        shown = hooks[0]["before"]
        assert shown == hooks[1]["after"] and shown["signed"] is True
        assert "team=ml" in shown["url"] and "127.0.0.1:9/hook" in shown["url"]
        assert not any(word in str(every) for word in ("hunter2", "sekret", "s3cr3t-value"))
        # exactly one entry per request: no change recorded twice
        assert len({e["id"] for e in every}) == len(every)
        assert [e["action"] for e in every if e["path"].endswith("/move")] == ["queue.move"]


def test_requests_without_a_valid_token_are_counted_not_stored_one_by_one(
    tmp_path: Path,
) -> None:
    with live_server(tmp_path / "srv", args=["--health-interval", "0"]) as server:
        with httpx.Client(base_url=server.url) as anonymous:
            for i in range(40):
                wrong = {"Authorization": f"Bearer wrong-{i}"} if i % 2 else {}
                r = anonymous.post(f"/api/jobs/queue?n={i}", json=REQUEST, headers=wrong)
                assert r.status_code == 401
            for _ in range(5):
                assert anonymous.post("/login", data={"token": "x"}).status_code == 303
        with server.client() as admin:
            entries = _entries(admin)
        anonymous_rows = [e for e in entries if e["user"] is None]
        assert len(anonymous_rows) == 1, anonymous_rows
        row = anonymous_rows[0]
        assert (row["action"], row["source"], row["count"]) == ("unauthenticated", "127.0.0.1", 45)
        assert (row["method"], row["path"], row["status"]) == ("POST", "/api/jobs/queue", 401)
        assert TOKEN not in str(entries)
