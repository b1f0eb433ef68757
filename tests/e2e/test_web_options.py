"""The new-job form's option sections (generated from JobRequest's schema), in real
headless Chromium against a real ``corral serve`` (one local machine, local1): two
options changed in collapsed sections reach the planned job's stored request and job
options, nothing else is sent, a secret env value is never shown back, and the
server's error on an option opens its section and sits next to the field."""

from __future__ import annotations

from typing import Any

from tests import webkit
from tests.e2e import test_web_auth
from tests.serverlib import LiveServer
from tests.webkit import Shots, login, open_page

browser = webkit.browser  # fixtures
shots = webkit.shots
server = test_web_auth.server  # a server with one local machine, local1, checked

SECRET = "hunter2-not-for-eyes"


def test_changed_options_reach_the_planned_job(
    browser: Any, shots: Shots, server: LiveServer
) -> None:
    from corral.store import open_store
    from corral.store.models import Job

    script = server.root / "options.py"
    script.write_text("print('planned only')\n")
    with open_page(browser, shots) as page:
        login(page, server, next_path="/jobs/new")
        page.goto(server.url + "/jobs/new")
        assert page.locator("details.options-section[open]").count() == 0  # all collapsed
        assert not page.locator("#grace").is_visible()
        page.fill("#script", str(script))
        page.select_option("#launcher", "python")
        page.fill("#nproc_per_node", "1")
        page.fill("#env", f"HF_HUB_AUTH={SECRET}")

        page.click("#options-preflight > summary")
        page.check("#check_links")
        page.click("#options-launch > summary")
        assert page.input_value("#grace") == "10.0"  # the API's default, from the schema
        page.fill("#grace", "3")
        page.click("#options-advanced > summary")
        page.fill("#secret_env", "HF_HUB_AUTH")
        page.click("#options-launch > summary")  # closed again: the count still shows
        assert page.inner_text("[data-count=launch]") == "(1 changed)"
        assert page.inner_text("[data-count=preflight]") == "(1 changed)"
        assert page.inner_text("[data-count=network]") == ""

        with page.expect_request("**/api/network/distributed/plan") as sent:
            page.click("#plan")
        body: dict[str, Any] = sent.value.post_data_json or {}
        plan = page.locator("#plan-view")
        plan.locator("[data-node=local1]").wait_for()
        job_id = str(plan.get_attribute("data-job-id"))
        shown_options = plan.locator("[data-field=options]").inner_text()
        assert shown_options == "grace 3; check_links true; secret_env HF_HUB_AUTH"
        shots.take(page, "options-plan")
        # the secret value is in the env box the user typed it into, nowhere else
        shown = page.evaluate("() => document.body.innerText + document.documentElement.outerHTML")
        assert "HF_HUB_AUTH=" in plan.inner_text() and SECRET not in shown

    # only what was changed from the defaults was sent
    options = {n for n, _ in _generated()}
    assert {k: v for k, v in body.items() if k in options} == {
        "check_links": True,
        "grace": 3,
        "secret_env": ["HF_HUB_AUTH"],
    }
    with server.client() as client:  # the planned job, as the API lists it
        listed = client.get("/api/jobs", params={"status": "planned"}).json()
        assert job_id in [j["job_id"] for j in listed["jobs"]]
    # the API shows no planned job's request: its stored row does (the request redacted
    # as the API would return it, the job options the supervisor will run with)
    with open_store(server.db_url) as store, store.session() as s:
        row = s.get(Job, job_id)
        assert row is not None and row.state == "planned" and row.launch is not None
        assert row.request["check_links"] is True and row.request["grace"] == 3.0
        assert row.request["env"]["HF_HUB_AUTH"] != SECRET  # stored redacted
        stored = row.launch["options"]
        assert stored["check_links"] is True and stored["grace"] == 3.0
        assert stored["rdzv_timeout"] == 300.0  # untouched: the default
        assert SECRET not in str(row.request) + str(row.launch) + str(row.plan)


def test_a_bad_option_is_named_next_to_its_field(
    browser: Any, shots: Shots, server: LiveServer
) -> None:
    with open_page(browser, shots) as page:
        login(page, server, next_path="/jobs/new")
        page.goto(server.url + "/jobs/new")
        page.fill("#script", "train.py")
        page.click("#options-network > summary")
        page.fill("#nccl_interface", "eth0 eth1")  # no blank in an interface (the API's pattern)
        page.click("#options-network > summary")  # closed
        page.click("#plan")
        error = page.locator("#nccl_interface-error")
        error.wait_for()
        assert page.locator("#options-network").get_attribute("open") is not None
        assert page.locator("#nccl_interface").get_attribute("aria-invalid") == "true"
        assert "pattern" in error.inner_text()


def _generated() -> list[tuple[str, str]]:
    from corral.web.form import SECTIONS, section_fields

    return [f for section, _ in SECTIONS for f in section_fields(section)]
