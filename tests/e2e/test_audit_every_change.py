"""Every state-changing route of ``corral serve`` writes one audit entry naming the
change (issue 29 item 6): who, what (an action and its target) and, where meaningful,
the state before and after. The table below names each route's action; a route the
app has and the table lacks fails the first test, so a new route cannot ship with only
the middleware's plain entry unless it is exempted here with its reason.

The second test calls every route in the table over real HTTP (a live server, two
``local`` machines running ``command`` jobs, an SSH machine never checked where a
user's jobs stay queued) and reads each call's entry back from ``/api/audit``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
from fastapi.routing import APIRoute

from corral.api.app import create_app
from corral.api.services import Services
from corral.service.settings import ServerSettings
from corral.store import open_store
from tests.serverlib import TOKEN, live_server, wait_status

AUDITED: dict[tuple[str, str], tuple[str, ...]] = {
    ("POST", "/api/users"): ("user.add",),
    ("DELETE", "/api/users/{name}"): ("user.revoke",),
    ("PUT", "/api/users/{name}/limits"): ("user.limit",),
    ("POST", "/api/network/machines"): ("machine.add",),
    ("DELETE", "/api/network/machines/{machine_id}"): ("machine.remove",),
    ("DELETE", "/api/network/machines/by-name/{machine_name}"): ("machine.remove",),
    ("POST", "/api/network/distributed/plan"): ("job.plan",),
    ("POST", "/api/network/distributed_jobs/plan"): ("job.plan",),
    ("POST", "/api/network/distributed/dispatch"): ("job.dispatch",),
    ("POST", "/api/network/distributed_jobs/dispatch"): ("job.dispatch",),
    ("POST", "/api/network/machines/{machine_id}/dispatch_job"): ("job.plan", "job.dispatch"),
    ("POST", "/api/network/execute_job"): ("job.execute",),
    ("POST", "/api/network/distributed/stop/{job_id}"): ("job.stop",),
    ("POST", "/api/network/machines/{machine_id}/stop_job/{job_id}"): ("job.stop",),
    ("POST", "/api/network/prepare_dependencies"): ("machines.prepare",),
    ("POST", "/api/tasks"): ("task.create",),
    ("POST", "/api/tasks/{task_id}/queue_distributed"): ("job.queue",),
    ("GET", "/api/tasks/{task_id}/queue_distributed"): ("job.queue",),
    ("POST", "/api/tasks/{task_id}/queue/{machine_id}"): ("job.queue",),
    ("GET", "/api/tasks/{task_id}/queue/{machine_id}"): ("job.queue",),
    ("PUT", "/api/preferences"): ("preferences.set",),
    ("POST", "/api/queue/{job_id}/move"): ("queue.move",),
    ("POST", "/api/jobs/queue"): ("job.queue",),
    ("POST", "/api/jobs/{job_id}/resubmit"): ("job.resubmit",),
    ("DELETE", "/api/jobs/{job_id}"): ("job.delete",),
    ("POST", "/api/webhooks"): ("webhook.add",),
    ("DELETE", "/api/webhooks/{hook_id}"): ("webhook.remove",),
    ("POST", "/api/notifiers"): ("notifier.add",),
    ("DELETE", "/api/notifiers/{hook_id}"): ("notifier.remove",),
    ("PUT", "/api/notify/addresses"): ("notify.addresses",),
    ("POST", "/login"): ("login",),
}
"""(method, route) -> the actions of the entries one successful call writes. The GET
spellings are the seed's: they change state too."""

EXEMPT: dict[tuple[str, str], str] = {
    ("POST", "/logout"): "ends the caller's own web session: nothing shared changes",
    ("POST", "/api/network/machines/{machine_id}/ping"): "a measurement: records what a "
    "machine answered now, as the background health check does, and changes no setting",
    ("POST", "/api/network/health-check"): "a measurement of every machine (the background "
    "health check's, on demand): no setting changes",
    ("POST", "/api/network/links"): "a measurement of the links between machines: no "
    "setting changes",
}
"""State-changing routes with only the middleware's plain entry (who, method, path,
status), and why that is all they need."""

CHANGING = frozenset({"POST", "PUT", "PATCH", "DELETE"})


def _routes(routes: list[Any], prefix: str = "") -> Iterator[tuple[set[str], str]]:
    """(methods, path) of every API route of the app, inside included routers too."""
    for route in routes:
        inner = getattr(route, "original_router", None)  # FastAPI's included router
        if inner is not None:
            more = getattr(getattr(route, "include_context", None), "prefix", "") or ""
            yield from _routes(list(inner.routes), prefix + more)
        elif isinstance(route, APIRoute):
            yield set(route.methods or ()), prefix + route.path


def test_every_state_changing_route_has_an_audit_action_or_a_reason(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'corral.db'}")
    try:
        settings = ServerSettings(run_dir=tmp_path / "runs", health_interval=0)
        app = create_app(Services.build(store, settings), TOKEN, background=False)
        all_routes = {(m, path) for ms, path in _routes(list(app.router.routes)) for m in ms}
    finally:
        store.close()
    changing = {(method, path) for method, path in all_routes if method in CHANGING}
    assert len(changing) > 25  # the walk found the routers' routes
    assert changing - set(AUDITED) - set(EXEMPT) == set(), "a route without an audit action"
    assert set(AUDITED) | set(EXEMPT) <= all_routes, "the table names a route that is gone"
    assert not set(AUDITED) & set(EXEMPT)


class Calls:
    """Requests made through route templates, so each is checked against the table."""

    def __init__(self) -> None:
        self.made: list[tuple[str, str, str, httpx.Response]] = []

    def __call__(
        self, client: httpx.Client, method: str, route: str, expect: int = 200, **kw: Any
    ) -> Any:
        params = {k: kw.pop(k) for k in list(kw) if "{" + k + "}" in route}
        path = route.format(**params)
        answer = client.request(method, path, **kw)
        assert answer.status_code == expect, (method, path, answer.text)
        self.made.append((method, route, path, answer))
        return answer.json() if "json" in answer.headers.get("content-type", "") else None


COMMAND = {"launcher": "command", "preflight": False, "machine_selection": "manual"}


def _job(command: str, machine: str) -> dict[str, Any]:
    return COMMAND | {"command_template": command, "selected_machines": [machine]}


def _entries(admin: httpx.Client) -> list[dict[str, Any]]:
    page = admin.get("/api/audit", params={"limit": 1000})
    assert page.status_code == 200, page.text
    return list(reversed(page.json()["entries"]))


def test_every_change_over_http_is_one_entry_with_who_what_before_and_after(
    tmp_path: Path,
) -> None:
    tree = tmp_path / "code"
    tree.mkdir()
    (tree / "train.py").write_text("print('hi')\n")
    call = Calls()
    with live_server(tmp_path / "srv", args=["--health-interval", "0"]) as server:
        admin = server.client()
        alice_token = call(
            admin, "POST", "/api/users", 201, json={"name": "alice", "role": "user"}
        )["token"]
        alice = httpx.Client(
            base_url=server.url, timeout=60, headers={"Authorization": f"Bearer {alice_token}"}
        )
        call(admin, "PUT", "/api/users/{name}/limits", name="alice", json={"jobs": 5})
        machines = {}
        for body in (
            {"name": "m1", "local": True},
            {"name": "m2", "local": True},
            {"name": "gpu1", "host": "10.9.9.9"},  # never checked: alice's jobs stay queued
            {"name": "gone1", "host": "10.9.9.8"},
            {"name": "gone2", "host": "10.9.9.7"},
        ):
            made = call(admin, "POST", "/api/network/machines", 201, json=body)
            machines[body["name"]] = made["id"]
        call(admin, "DELETE", "/api/network/machines/{machine_id}", machine_id=machines["gone1"])
        call(
            admin,
            "DELETE",
            "/api/network/machines/by-name/{machine_name}",
            machine_name="gone2",
        )

        # a long job on m1: planned, dispatched, stopped while it runs
        plan = "/api/network/distributed/plan"
        long_id = call(admin, "POST", plan, json=_job("sleep 600", "m1"))["job_id"]
        call(admin, "POST", "/api/network/distributed/dispatch", json={"job_id": long_id})
        stopped = call(admin, "POST", "/api/network/distributed/stop/{job_id}", job_id=long_id)
        assert stopped["stopping"] is True
        # asked again (stopping, or ended by now): no change, only the middleware's entry
        assert admin.post(f"/api/network/distributed/stop/{long_id}").status_code == 200
        # planned on m2 by the older path, cancelled before it started, deleted
        old_plan = "/api/network/distributed_jobs/plan"
        cancel_id = call(admin, "POST", old_plan, json=_job("true", "m2"))["job_id"]
        call(
            admin,
            "POST",
            "/api/network/machines/{machine_id}/stop_job/{job_id}",
            machine_id=machines["m2"],
            job_id=cancel_id,
        )
        call(admin, "DELETE", "/api/jobs/{job_id}", job_id=cancel_id)
        # dispatched by the older path, on one machine, and on the server's own host
        quick_id = call(admin, "POST", old_plan, json=_job("true", "m2"))["job_id"]
        call(admin, "POST", "/api/network/distributed_jobs/dispatch", json={"job_id": quick_id})
        wait_status(admin, quick_id, ["succeeded"])
        single = call(
            admin,
            "POST",
            "/api/network/machines/{machine_id}/dispatch_job",
            machine_id=machines["m2"],
            json=COMMAND | {"command_template": "true"},
        )
        wait_status(admin, single["job_id"], ["succeeded"])
        here = call(
            admin, "POST", "/api/network/execute_job", json=COMMAND | {"command_template": "true"}
        )
        # queued by the admin on m2: the scheduler dispatches it
        by_scheduler = call(admin, "POST", "/api/jobs/queue", 201, json=_job("true", "m2"))
        wait_status(admin, by_scheduler["job_id"], ["succeeded"])
        call(
            admin,
            "POST",
            "/api/network/prepare_dependencies",
            json={"machine_ids": ["m1"], "source": str(tree), "requirements": None},
        )

        # alice's task and jobs wait for gpu1
        task = call(
            alice, "POST", "/api/tasks", 201, json={"name": "t", "request": _job("x", "gpu1")}
        )
        for method in ("POST", "GET"):
            call(alice, method, "/api/tasks/{task_id}/queue_distributed", task_id=task["id"])
            call(
                alice,
                method,
                "/api/tasks/{task_id}/queue/{machine_id}",
                task_id=task["id"],
                machine_id=machines["gpu1"],
            )
        queued = call(alice, "POST", "/api/jobs/queue", 201, json=_job("x", "gpu1"))["job_id"]
        call(admin, "POST", "/api/queue/{job_id}/move", job_id=queued, json={"priority": 5})
        again = call(alice, "POST", "/api/jobs/{job_id}/resubmit", 201, job_id=queued)
        call(admin, "PUT", "/api/preferences", json={"default_num_machines": 2})

        signed = {"url": "http://127.0.0.1:9/h", "secret": "a-secret-value"}
        hook = call(admin, "POST", "/api/webhooks", 201, json=signed)
        call(admin, "DELETE", "/api/webhooks/{hook_id}", hook_id=hook["id"])
        chat = call(admin, "POST", "/api/notifiers", 201, json={"url": "json://127.0.0.1:9/c"})
        call(admin, "DELETE", "/api/notifiers/{hook_id}", hook_id=chat["id"])
        call(admin, "PUT", "/api/notify/addresses", json={"allow": ["loopback", "private"]})
        with httpx.Client(base_url=server.url, follow_redirects=False) as browser:
            form = browser.get("/login").text
            nonce = form.split('name="csrf_token" value="', 1)[1].split('"', 1)[0]
            login = {"token": alice_token, "csrf_token": nonce}
            call(browser, "POST", "/login", 303, data=login)
        call(admin, "DELETE", "/api/users/{name}", name="alice")

        entries = _entries(admin)
        alice.close()
        admin.close()

    # every route of the table was called, and each call wrote its actions, once each
    assert {(m, r) for m, r, _, _ in call.made} == set(AUDITED)
    seen: set[int] = set()
    for method, route, path, answer in call.made:
        mine = [e for e in entries if (e["method"], e["path"]) == (method, path)]
        mine = [e for e in mine if e["id"] not in seen]
        actions = AUDITED[(method, route)]
        got = [e for e in mine if e["action"] in actions][: len(actions)]
        assert [e["action"] for e in got] == list(actions), (method, path, mine)
        for entry in got:
            seen.add(entry["id"])
            assert entry["status"] == answer.status_code
            assert entry["user"] in ("admin", "alice"), entry
            assert entry["target"], entry
            assert entry["before"] is not None or entry["after"] is not None, entry

    by_action: dict[tuple[str, str | None], list[dict[str, Any]]] = {}
    for e in entries:
        by_action.setdefault((e["action"], e["target"]), []).append(e)

    def one(action: str, target: str) -> dict[str, Any]:
        found = by_action.get((action, target), [])
        assert len(found) == 1, (action, target, found)
        return found[0]

    planned = one("job.plan", long_id)
    assert planned["before"] is None
    assert planned["after"] == {
        "state": "planned",
        "owner": "admin",
        "kind": "distributed",
        "machines": ["m1"],
    }
    dispatched = one("job.dispatch", long_id)
    assert dispatched["before"] == {"state": "planned"}
    assert dispatched["after"]["machines"] == ["m1"]
    assert dispatched["after"]["state"] in ("pending", "running")
    stop = one("job.stop", long_id)
    assert stop["before"]["state"] in ("pending", "running")
    assert stop["after"]["stopping"] is True and stop["after"]["force"] is False
    assert stop["after"]["reason"] == "stopped by admin (api)"
    cancelled = one("job.stop", cancel_id)
    assert cancelled["before"] == {"state": "planned"}
    assert cancelled["after"]["state"] == "cancelled"
    deleted = one("job.delete", cancel_id)
    assert deleted["before"] == {"state": "cancelled", "owner": "admin", "kind": "distributed"}
    assert deleted["after"] is None
    executed = one("job.execute", here["job_id"])
    assert executed["after"]["owner"] == "admin" and executed["after"]["machines"]
    scheduled = one("job.dispatch", by_scheduler["job_id"])
    assert scheduled["user"] == "scheduler"
    assert scheduled["before"] == {"state": "queued", "priority": 0}
    assert scheduled["after"]["machines"] == ["m2"]
    resubmitted = one("job.resubmit", again["job_id"])
    assert resubmitted["user"] == "alice"
    assert resubmitted["after"]["from"] == queued and resubmitted["after"]["owner"] == "alice"
    created = one("task.create", task["id"])
    assert created["after"] == {"name": "t", "kind": "distributed", "owner": "alice"}
    prepared = one("machines.prepare", "m1")
    assert prepared["after"]["machines"] == ["m1"] and prepared["after"]["source"] == str(tree)
