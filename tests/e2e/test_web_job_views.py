"""One job shows the same in every view: the API's status and the web job page (real
headless Chromium against a real ``corral serve`` with one local machine) name a
failure's root cause (not ``failure``), give no ETA once the job ended, show the
pre-flight's warnings, name the job after its script, chart over steps, and a job
stopped from the page names who stopped it and from where: ``stopped by admin (web)``."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests import webkit
from tests.serverlib import LiveServer, live_server, wait_status
from tests.webkit import Shots, login, open_page

browser = webkit.browser  # fixtures
shots = webkit.shots

FAILS = """\
import sys, time
from corral import sdk
for step in range(1, 5):
    sdk.report(step, 16, loss=1.0 / step)
    time.sleep(0.2)
sys.exit(1)
"""
SLEEPS = """\
import time
from corral import sdk
sdk.report(1, 100)
print("sleeping", flush=True)
time.sleep(120)
"""
WARNING = {
    "name": "disk",
    "status": "warn",
    "warning": "only 3 GiB free in /tmp",
    "fix_command": "df -h /tmp",
}
ENDED = ["succeeded", "failed", "lost", "cancelled"]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with live_server(tmp_path_factory.mktemp("web-views")) as srv:
        with srv.client() as client:
            made = client.post("/api/network/machines", json={"name": "local1", "local": True})
            assert made.status_code == 201, made.text
        yield srv


def _submit(server: LiveServer, name: str, text: str) -> str:
    script = server.root / name
    script.write_text(text)
    body = {"script": str(script), "launcher": "python", "nproc_per_node": 1, "preflight": False}
    with server.client() as client:
        planned = client.post("/api/network/distributed/plan", json=body)
        assert planned.status_code == 200, planned.text
        job_id = str(planned.json()["job_id"])
        started = client.post("/api/network/distributed/dispatch", json={"job_id": job_id})
        assert started.status_code == 200, started.text
    return job_id


def _add_warning(server: LiveServer, job_id: str) -> None:
    """The job's pre-flight report with one warning, as its supervisor records it."""
    from corral.store import open_store
    from corral.store.models import Event

    with open_store(server.db_url) as store, store.session() as s:
        report = {"checks": [WARNING, {"name": "python", "status": "pass"}]}
        s.add(
            Event(
                job_id=job_id,
                pos=-1,
                time=time.time(),
                kind="checked",
                data={"blocking": False, "report": report},
            )
        )


def test_a_failed_job_reads_the_same_in_the_api_and_on_the_page(
    browser: Any, shots: Shots, server: LiveServer
) -> None:
    job_id = _submit(server, "fails.py", FAILS)
    with server.client() as client:
        done = wait_status(client, job_id, ENDED, 90)
        assert done["status"] == "failed", done
        _add_warning(server, job_id)
        status = client.get(f"/api/jobs/{job_id}").json()
        listed = client.get("/api/jobs").json()["jobs"]
    assert status["reason"] == "rank 0 on local1 exited with code 1", status["reason"]
    assert status["name"] == "fails.py"
    assert [j["name"] for j in listed if j["job_id"] == job_id] == ["fails.py"]
    assert status["master"] == "local1"
    progress = status["nodes"][0]["progress"]
    assert progress["step"] == 4 and progress["eta_s"] is None
    assert status["preflight"] == [
        {
            "name": "disk",
            "status": "warn",
            "message": "only 3 GiB free in /tmp",
            "fix_command": "df -h /tmp",
        }
    ]
    with open_page(browser, shots) as page:
        login(page, server, next_path=f"/jobs/{job_id}")
        page.locator("#preflight li").wait_for()
        assert page.locator("#preflight li.warn").inner_text() == (
            "pre-flight disk: only 3 GiB free in /tmp (fix: df -h /tmp)"
        )
        assert "rank 0 on local1 exited with code 1" in page.locator("#job-reason").inner_text()
        page.wait_for_function("() => document.querySelector('#chart svg path[data-node=local1]')")
        assert page.locator("#chart svg").get_attribute("data-x") == "step"
        # the node card follows the job's events as they stream in: its last step
        page.wait_for_function(
            "() => (document.querySelector('.node .prog-label')?.textContent || '')"
            ".includes('step 4 / 16')"
        )
        label = page.locator(".node .prog-label").inner_text()
        assert "step 4 / 16" in label and "ETA" not in label, label
        page.select_option("#chart-x", "time")
        assert page.locator("#chart svg").get_attribute("data-x") == "time"
        shots.take(page, "failed-job")


def test_a_job_stopped_from_the_page_names_who_and_where(
    browser: Any, shots: Shots, server: LiveServer
) -> None:
    job_id = _submit(server, "sleeps.py", SLEEPS)
    with open_page(browser, shots) as page:
        login(page, server, next_path=f"/jobs/{job_id}")
        page.locator(".logs .line", has_text="sleeping").wait_for(timeout=60_000)
        page.click("#stop-all")
        page.click("#stop-confirm")
        page.locator("#job-status", has_text="cancelled").wait_for(timeout=60_000)
        page.locator("#job-reason", has_text="stopped by admin (web)").wait_for()
        shots.take(page, "stopped-job")
    with server.client() as client:
        status = client.get(f"/api/jobs/{job_id}").json()
        lines = client.get(f"/api/network/local_job_output/{job_id}").json()["lines"]
    assert status["reason"] == "stopped by admin (web)", status["reason"]
    assert "[corral] stopped by admin (web): stopping every node" in lines, lines
    assert not any("Ctrl-C" in line for line in lines), lines
