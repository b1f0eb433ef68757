"""Workload weights on the web page, in real headless Chromium against a real ``corral
serve`` with two local machines (local1, local2): the new-job form's calibration file,
the plan's weights, the job page's weights, and a file that does not fit."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest

from tests import webkit
from tests.e2e import test_web_auth
from tests.serverlib import LiveServer, live_server, wait_status
from tests.unit.test_service_planner import calibration_file
from tests.webkit import PHONE, Shots, login, open_page

if TYPE_CHECKING:  # collecting imports no playwright (issue 30)
    from playwright.sync_api import Page

browser = webkit.browser  # fixtures
shots = webkit.shots

WEIGHTS = """\
import os
print("weights", os.environ["CORRAL_WORKLOAD_WEIGHTS"], flush=True)
"""
ROWS = "els => els.map(r => [r.dataset.host, r.querySelector('[data-field=weight]').innerText])"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """A server with two local machines, local1 and local2, checked."""
    with live_server(tmp_path_factory.mktemp("web-weights")) as srv:
        with srv.client() as client:
            for name in ("local1", "local2"):
                made = client.post("/api/network/machines", json={"name": name, "local": True})
                assert made.status_code == 201, made.text
            assert client.post("/api/network/health-check").status_code == 200
        yield srv


def _form(page: Page, server: LiveServer, calibration: str) -> None:
    login(page, server, next_path="/jobs/new")
    page.goto(server.url + "/jobs/new")
    script = server.root / "weights.py"
    script.write_text(WEIGHTS)
    page.fill("#script", str(script))
    page.select_option("#launcher", "python")
    page.fill("#num_machines", "2")
    page.fill("#nproc_per_node", "1")
    page.uncheck("#preflight")
    page.fill("#calibration", calibration)
    page.locator("#job-form[data-ready=true]").wait_for()
    assert page.locator("#num_machines").input_value() == "2"


def test_saved_preferences_never_overwrite_what_was_typed_before_they_arrived(
    browser: Any, shots: Shots, server: LiveServer
) -> None:
    """The preferences answer is held back until the user has typed the number of
    machines (what a slow server does): the prefill leaves the typed value alone."""
    held: list[Any] = []
    with open_page(browser, shots) as page:
        login(page, server, next_path="/jobs/new")
        page.route("**/api/preferences", lambda route: held.append(route))
        page.goto(server.url + "/jobs/new")
        page.wait_for_function("() => document.readyState === 'complete'")
        page.fill("#num_machines", "2")
        page.wait_for_function("() => true")  # let the route handler run
        assert held, "the page never asked for the saved preferences"
        held[0].continue_()
        page.locator("#job-form[data-ready=true]").wait_for()
        assert page.locator("#num_machines").input_value() == "2"
        assert page.locator("#gpus_per_machine").input_value() == "0"  # untouched: prefilled


def test_the_plan_and_the_job_page_show_the_weights(
    browser: Any, shots: Shots, server: LiveServer
) -> None:
    cal = calibration_file(server.root / "cal.json", {"local1": [30.0], "local2": [90.0]})
    with open_page(browser, shots) as page:
        _form(page, server, str(cal))
        assert page.locator("label[for=calibration]").inner_text().startswith("Calibration file")
        page.click("#plan")
        table = page.locator("#plan-weights")
        table.wait_for()
        rows = table.locator("tbody tr").evaluate_all(ROWS)
        assert sorted(rows) == [["local1", "0.250"], ["local2", "0.750"]]
        job_id = str(page.locator("#plan-view").get_attribute("data-job-id"))
        shots.take(page, "plan-weights")
        with page.expect_navigation(url=f"**/jobs/{job_id}"):
            page.click("#launch")
        section = page.locator("#weights")
        page.locator("#job-weights").wait_for()
        assert section.is_visible()
        assert "Workload split" in section.inner_text()
        rows = page.locator("#job-weights tbody tr").evaluate_all(ROWS)
        assert sorted(rows) == [["local1", "0.250"], ["local2", "0.750"]]
        meter = page.locator("#job-weights tr[data-host=local2] meter")
        assert meter.get_attribute("aria-label") == "local2 rank 0: 75.0%"
        shots.take(page, "job-weights")
    with server.client() as client:
        done = wait_status(client, job_id, ["succeeded", "failed", "lost", "cancelled"], 90)
        assert done["status"] == "succeeded", done
        lines = client.get(f"/api/network/local_job_output/{job_id}").json()["lines"]
        assert sum("weights " in line for line in lines) == 2, lines
    with open_page(browser, shots, viewport=PHONE) as page:
        login(page, server, next_path=f"/jobs/{job_id}")
        page.locator("#job-weights").wait_for()
        width = page.evaluate("document.documentElement.scrollWidth")
        assert width <= PHONE["width"] + 2


FITS = "els => els.map(r => [r.dataset.host, r.querySelector('[data-field=fits]').innerText])"


def test_a_calibration_with_memory_fits_shows_them_beside_the_weights(
    browser: Any, shots: Shots, server: LiveServer
) -> None:
    from corral.throughput.model import load_calibration, save_calibration

    path = calibration_file(server.root / "cal-fits.json", {"local1": [30.0], "local2": [90.0]})
    cal = load_calibration(path)
    ranks = [r.model_copy(update={"fits": 48 if r.host == "local2" else None}) for r in cal.ranks]
    save_calibration(cal.model_copy(update={"ranks": ranks}), path)
    with open_page(browser, shots) as page:
        _form(page, server, str(path))
        page.click("#plan")
        table = page.locator("#plan-weights")
        table.wait_for()
        assert "Fits" in table.locator("thead").inner_text()
        rows = table.locator("tbody tr").evaluate_all(FITS)
        assert sorted(rows) == [["local1", "no limit"], ["local2", "48"]]
        job_id = str(page.locator("#plan-view").get_attribute("data-job-id"))
        with page.expect_navigation(url=f"**/jobs/{job_id}"):
            page.click("#launch")
        page.locator("#job-weights").wait_for()
        rows = page.locator("#job-weights tbody tr").evaluate_all(FITS)
        assert sorted(rows) == [["local1", "no limit"], ["local2", "48"]]
    with server.client() as client:
        done = wait_status(client, job_id, ["succeeded", "failed", "lost", "cancelled"], 90)
        assert done["status"] == "succeeded", done


def test_a_job_without_weights_hides_the_section(
    browser: Any, shots: Shots, server: LiveServer
) -> None:
    script = server.root / "hello.py"
    script.write_text(test_web_auth.HELLO)
    body = {"script": str(script), "launcher": "python", "nproc_per_node": 1, "preflight": False}
    with server.client() as client:
        planned = client.post("/api/network/distributed/plan", json=body)
        assert planned.status_code == 200, planned.text
        job_id = planned.json()["job_id"]
    with open_page(browser, shots) as page:
        login(page, server, next_path=f"/jobs/{job_id}")
        page.wait_for_function("() => document.querySelector('#job-facts dd')")
        assert page.locator("#weights").is_hidden()
        assert page.locator("#job-weights").count() == 0
    with server.client() as client:
        assert client.post(f"/api/network/distributed/stop/{job_id}").status_code == 200


def test_a_calibration_that_does_not_fit_is_shown_next_to_its_field(
    browser: Any, shots: Shots, server: LiveServer
) -> None:
    cal = calibration_file(server.root / "other.json", {"gpu7": [10.0], "gpu8": [20.0]})
    with open_page(browser, shots) as page:
        _form(page, server, str(cal))
        page.click("#plan")
        error = page.locator("#calibration-error")
        error.wait_for()
        assert "is not in the calibration" in error.inner_text()
        assert page.locator("#calibration").get_attribute("aria-invalid") == "true"
        assert "calibration-error" in str(
            page.locator("#calibration").get_attribute("aria-describedby")
        )
        assert page.locator("#plan-view").is_hidden()
