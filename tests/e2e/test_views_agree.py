"""Every view of ``corral serve`` tells the same: one real server, jobs read through the
CLI (``corral job queue``, ``corral job status``), the API and the web pages (real
headless Chromium) must agree on owner, priority, state, who stopped a job and from
where, the queue's order and reasons, and every node's ranks and progress of an
in-place job (whose replica groups each count their ranks from 0). Also: a failed
job's node cards show no steps/s the throughput chart does not have, and
``/compare?job_id=A&job_id=B`` (as the docs write it) compares.

The in-place and failed jobs are planned by the API and their supervisor's events
written to their events files (the seam the supervisor process writes through); the
queued jobs wait for an SSH machine nobody checked."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from corral.job.events import AttemptStarted, Finished, JobEvent, Progress, json_of
from corral.job.states import JobState
from corral.service.eventlog import EVENTS_FILE, append_event
from corral.store import open_store
from corral.store.models import Job
from tests import webkit
from tests.serverlib import TOKEN, LiveServer, live_server, wait_status
from tests.webkit import Shots, login, open_page

browser = webkit.browser  # fixtures
shots = webkit.shots

WAITS = {
    "script": "train.py",
    "launcher": "python",
    "preflight": False,
    "machine_selection": "manual",
    "selected_machines": ["gpu1"],
}
"""A job that waits: its machine was never health-checked."""
SIMS = ["sim1", "sim2", "sim3"]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    root = tmp_path_factory.mktemp("views-agree")
    with live_server(root, args=["--health-interval", "0"]) as srv:
        with srv.client() as admin:
            for name in SIMS:
                made = admin.post(
                    "/api/network/machines", json={"name": name, "local": True, "slots": 1}
                )
                assert made.status_code == 201, made.text
            made = admin.post("/api/network/machines", json={"name": "gpu1", "host": "10.9.9.9"})
            assert made.status_code == 201, made.text
        yield srv


def _user(server: LiveServer, name: str) -> str:
    with server.client() as admin:
        made = admin.post("/api/users", json={"name": name, "role": "user"})
    assert made.status_code == 201, made.text
    return str(made.json()["token"])


def _as(server: LiveServer, token: str) -> httpx.Client:
    return httpx.Client(
        base_url=server.url, timeout=60, headers={"Authorization": f"Bearer {token}"}
    )


def _cli(server: LiveServer, *args: str, token: str = TOKEN) -> str:
    env = {**os.environ, "CORRAL_TOKEN": token, "COLUMNS": "400", "NO_COLOR": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "corral", "job", *args, "--server", server.url],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode in (0, 1, 130), done.stderr
    return done.stdout


def _rows(table: str) -> list[list[str]]:
    """The cells of a rich table's rows."""
    return [
        [c.strip() for c in line.split("│")[1:-1]] for line in table.splitlines() if "│" in line
    ]


def _planned(server: LiveServer, body: dict[str, Any]) -> str:
    with server.client() as admin:
        planned = admin.post("/api/network/distributed/plan", json=body)
    assert planned.status_code == 200, planned.text
    return str(planned.json()["job_id"])


def _script(server: LiveServer) -> str:
    """A script on the server's (local) machines; never run: the events are written."""
    path = server.root / "train.py"
    path.write_text("print('never run')\n")
    return str(path)


def _supervised(server: LiveServer, job_id: str, events: list[JobEvent]) -> None:
    """The planned job runs, and its supervisor wrote ``events``."""
    with open_store(server.db_url) as store, store.session() as s:
        row = s.get(Job, job_id)
        assert row is not None
        row.state, row.started = "running", time.time()
        path = Path(row.run_dir) / EVENTS_FILE
    for event in events:
        append_event(path, json_of(event))


def _in_place_job(server: LiveServer) -> tuple[str, list[JobEvent]]:
    """Three replica groups (one rank each, every one rank 0) that reached step 150."""
    job_id = _planned(
        server,
        {
            "script": _script(server),
            "launcher": "torchrun",
            "nproc_per_node": 1,
            "recovery": "in-place",
            "preflight": False,
            "resource_requirements": {"num_machines": 3},
            "machine_selection": "manual",
            "selected_machines": SIMS,
        },
    )
    t0 = time.time()
    events: list[JobEvent] = [AttemptStarted(job_id=job_id, number=1, hosts=SIMS, world_size=3)]
    for step in (100, 150):
        for host in SIMS:
            events.append(
                Progress(
                    job_id=job_id,
                    time=t0 + step / 100,
                    host=host,
                    rank=0,
                    step=step,
                    total=150,
                    metrics={"loss": 1.0 / step},
                )
            )
    events.append(Finished(job_id=job_id, state=JobState.SUCCEEDED, exit_code=0, result=None))
    return job_id, events


def _failed_after_a_burst(server: LiveServer) -> tuple[str, list[JobEvent]]:
    """One rank that reported two steps half a millisecond apart, then failed."""
    body = {"script": _script(server), "launcher": "python", "preflight": False}
    body["nproc_per_node"] = 1
    job_id = _planned(
        server, {**body, "machine_selection": "manual", "selected_machines": ["sim1"]}
    )
    t0 = time.time()
    return (
        job_id,
        [
            AttemptStarted(job_id=job_id, number=1, hosts=["sim1"], world_size=1),
            Progress(job_id=job_id, time=t0, host="sim1", rank=0, step=1, metrics={"loss": 2.0}),
            Progress(
                job_id=job_id, time=t0 + 0.0005, host="sim1", rank=0, step=2, metrics={"loss": 1.5}
            ),
            Finished(job_id=job_id, state=JobState.FAILED, exit_code=1, result=None),
        ],
    )
    return job_id


def _settled_queue(client: httpx.Client) -> list[dict[str, Any]]:
    """The queue once a scheduler round has left it as it is."""
    last: list[dict[str, Any]] = []
    for _ in range(60):
        now: list[dict[str, Any]] = client.get("/api/queue").json()
        if now == last:
            return now
        last = now
        time.sleep(1.5)
    raise AssertionError(f"the queue never settled: {last}")


def test_cli_api_and_page_agree_on_one_job(server: LiveServer, browser: Any, shots: Shots) -> None:
    alice, bob = _user(server, "alice"), _user(server, "bob")
    queued: dict[str, str] = {}
    for name, token in (("a1", alice), ("a2", alice), ("b1", bob)):
        with _as(server, token) as client:
            answer = client.post("/api/jobs/queue", json={**WAITS, "name": name})
        assert answer.status_code == 201, answer.text
        queued[name] = answer.json()["job_id"]
    with server.client() as admin:
        moved = admin.post(f"/api/queue/{queued['b1']}/move", json={"priority": 1})
        assert moved.status_code == 200, moved.text
    in_place, in_place_events = _in_place_job(server)
    failed, failed_events = _failed_after_a_burst(server)
    _supervised(server, in_place, in_place_events)
    _supervised(server, failed, failed_events)

    with open_page(browser, shots) as page:
        # alice stops her own queued a2 from its page
        login(page, server, alice, next_path=f"/jobs/{queued['a2']}")
        page.locator("#stop-all:not([hidden])").click()
        page.locator("#stop-confirm").click()
        page.locator("#job-status", has_text="cancelled").wait_for()

    with server.client() as admin:
        for job_id, state in ((in_place, "succeeded"), (failed, "failed")):
            wait_status(admin, job_id, [state])
        entries = _settled_queue(admin)
        api = {j: admin.get(f"/api/jobs/{j}").json() for j in [*queued.values(), in_place]}
    order = [queued["b1"], queued["a1"]]
    assert [e["job_id"] for e in entries] == order, entries
    assert [(e["owner"], e["priority"]) for e in entries] == [("bob", 1), ("alice", 0)]
    reasons = {e["job_id"]: e["reason"] for e in entries}
    assert reasons[queued["b1"]].startswith("waiting for gpu1"), reasons
    assert reasons[queued["a1"]] == f"waiting behind job {queued['b1']} (queued first)", reasons
    # the API's status of a queued job gives the queue's reason (one function)
    for job_id in order:
        assert api[job_id]["reason"] == reasons[job_id], (api[job_id], reasons)
    stopped = api[queued["a2"]]
    assert stopped["status"] == "cancelled"
    assert stopped["reason"] == "stopped by alice (web) before it started", stopped
    nodes = api[in_place]["nodes"]
    assert [(n["host"], n["ranks"], n["progress"]["step"]) for n in nodes] == [
        (host, [0], 150) for host in SIMS
    ], nodes

    # the CLI
    queue_rows = [r for r in _rows(_cli(server, "queue")) if r and r[1] in order]
    assert [(r[1], r[3], r[4], r[6]) for r in queue_rows] == [
        (e["job_id"], str(e["priority"]), e["owner"], e["reason"]) for e in entries
    ], queue_rows
    for job_id in [*order, queued["a2"]]:
        text = _cli(server, "status", job_id)
        first = text.splitlines()[0]
        assert first.endswith(f": {api[job_id]['status']}: {api[job_id]['reason']}"), text
        assert f"owner {api[job_id]['owner']}, priority {api[job_id]['priority']}" in text, text
    node_rows = [r for r in _rows(_cli(server, "status", in_place)) if r and r[1] in SIMS]
    assert [(r[1], r[2], r[4]) for r in node_rows] == [
        (host, "0", "step 150/150 loss=0.006667") for host in SIMS
    ], node_rows

    # the pages
    with open_page(browser, shots) as page:
        login(page, server, next_path="/jobs")
        rows = page.locator("#queue-body tr")
        rows.nth(len(order) - 1).wait_for()
        assert rows.count() == len(order)
        for index, entry in enumerate(entries):
            cells = rows.nth(index).locator("td")
            assert rows.nth(index).get_attribute("data-job") == entry["job_id"]
            assert cells.nth(3).inner_text() == str(entry["priority"])
            assert cells.nth(4).inner_text() == entry["owner"]
            assert cells.nth(7).inner_text() == entry["reason"]
        for job_id in [*order, queued["a2"]]:
            page.goto(f"{server.url}/jobs/{job_id}")
            page.locator("#job-status", has_text=api[job_id]["status"]).wait_for()
            assert page.locator("#job-reason").inner_text() == f"— {api[job_id]['reason']}"
            assert page.locator("dd[data-fact=owner]").inner_text() == api[job_id]["owner"]
            assert page.locator("dd[data-fact=priority]").inner_text() == str(
                api[job_id]["priority"]
            )
        page.goto(f"{server.url}/jobs/{in_place}")
        page.locator("#job-status", has_text="succeeded").wait_for()
        page.locator("#topology", has_text="3 nodes").wait_for()
        assert "3 nodes · 3 ranks" in page.locator("#topology").inner_text()
        for host in SIMS:
            card = page.locator(f"article[data-node={host}]")
            card.locator(".prog-label", has_text="step 150 / 150").wait_for()
            assert "ranks 0" in card.inner_text(), card.inner_text()

        # a failed job's cards and its throughput chart: one source for steps/s
        page.goto(f"{server.url}/jobs/{failed}")
        page.locator("#job-status", has_text="failed").wait_for()
        label = page.locator("article[data-node=sim1] .prog-label")
        label.filter(has_text="step 2").wait_for()
        page.locator("#throughput-chart", has_text="no progress reported").wait_for()
        assert "steps/s" not in label.inner_text(), label.inner_text()

        # /compare as the docs write it (?job_id=), and as the page links it (?job=)
        for key in ("job_id", "job"):
            page.goto(f"{server.url}/compare?{key}={in_place}&{key}={failed}")
            for job_id in (in_place, failed):
                page.locator(f"#compare-chart path[data-job='{job_id}']").first.wait_for()
    assert re.match(r"\d{8}-", in_place)
