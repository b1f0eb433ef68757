"""The pages' own scripts, split by feature (chart.js, job_logs.js, job_report.js,
job.js; compare.js), load and work together: real headless Chromium against a real
``corral serve`` with one local machine shows a failed job's merged log (filtered and
searched), its charts, attempts, root cause and files, and the compare page draws the
job, with no script error on either page."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests import webkit
from tests.serverlib import LiveServer, live_server, wait_status
from tests.webkit import Shots, login, open_page

browser = webkit.browser  # fixtures
shots = webkit.shots

FAILS = """\
import sys
from corral import sdk
for step in range(1, 4):
    print(f"step {step} of 3", flush=True)
    sdk.report(step, 3, loss=1.0 / step)
print("about to fail", flush=True)
sys.exit(3)
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with live_server(tmp_path_factory.mktemp("web-scripts")) as srv:
        with srv.client() as client:
            made = client.post("/api/network/machines", json={"name": "local1", "local": True})
            assert made.status_code == 201, made.text
        yield srv


def test_the_job_and_compare_pages_scripts_work_together(
    browser: Any, shots: Shots, server: LiveServer
) -> None:
    script = server.root / "fails.py"
    script.write_text(FAILS)
    body = {"script": str(script), "launcher": "python", "nproc_per_node": 1, "preflight": False}
    with server.client() as client:
        job_id = str(client.post("/api/network/distributed/plan", json=body).json()["job_id"])
        started = client.post("/api/network/distributed/dispatch", json={"job_id": job_id})
        assert started.status_code == 200, started.text
        assert (
            wait_status(client, job_id, ["failed", "succeeded", "lost"], 90)["status"] == "failed"
        )
    errors: list[str] = []
    with open_page(browser, shots) as page:
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        login(page, server, next_path=f"/jobs/{job_id}")
        # the log (job_logs.js): every line, prefixed; a search marks its matches
        page.wait_for_function(
            "() => [...document.querySelectorAll('#logs .line')]"
            ".some((l) => l.textContent.includes('about to fail'))"
        )
        assert page.locator("#logs .line", has_text="[local1:0] step 2 of 3").count() == 1
        page.fill("#log-search", "step ")
        page.wait_for_function("() => document.querySelector('#search-count').textContent")
        assert page.locator("#search-count").inner_text() == "1/3"
        # the charts (chart.js): the node's line over steps, its legend
        page.wait_for_function("() => document.querySelector('#chart svg path[data-node=local1]')")
        assert page.locator("#chart .legend li").inner_text().startswith("local1")
        # the report (job_report.js): the attempt, the root cause with its exit, the files
        page.wait_for_function("() => document.querySelector('#attempts tr[data-attempt]')")
        assert "exit 3" in page.locator("#attempts tr[data-attempt]").inner_text()
        page.locator("#root-cause-body [data-field=exit]").wait_for()
        assert page.locator("#root-cause-body [data-field=exit]").inner_text() == "exit code 3"
        page.locator("#files .rank-logs a").first.wait_for()
        shots.take(page, "job-page-scripts")
        # the compare page (chart.js + compare.js)
        page.goto(f"{server.url}/compare?job_id={job_id}")
        page.wait_for_function(
            f"() => document.querySelector('#compare-chart svg path[data-job=\"{job_id}\"]')"
        )
        assert page.locator("#compare-legend li").count() == 1
    assert errors == []
