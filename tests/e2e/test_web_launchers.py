"""The new-job page with the launchers beyond torchrun/python, in real headless
Chromium against a real ``corral serve`` (one local machine, local1): the command launcher
swaps the script for a template, the plan shows it, and the launched job runs it."""

from __future__ import annotations

from typing import Any

from tests import webkit
from tests.e2e import test_web_auth
from tests.serverlib import LiveServer, wait_status
from tests.webkit import Shots, login, open_page

browser = webkit.browser  # fixtures
shots = webkit.shots
server = test_web_auth.server  # a server with one local machine, local1, checked


def test_the_launcher_select_offers_every_served_launcher(
    browser: Any, shots: Shots, server: LiveServer
) -> None:
    with open_page(browser, shots) as page:
        login(page, server, next_path="/jobs/new")
        page.goto(server.url + "/jobs/new")
        options = page.locator("#launcher option").evaluate_all("os => os.map(o => o.value)")
        assert options == ["torchrun", "python", "accelerate", "mlx", "command"]
        assert page.locator("#script").is_visible()
        assert not page.locator("#command_template").is_visible()
        page.select_option("#launcher", "mlx")
        assert page.locator("#script").is_visible()


def test_a_command_job_from_the_form(browser: Any, shots: Shots, server: LiveServer) -> None:
    template = "echo node {node_rank} of {nnodes} on {host}"
    with open_page(browser, shots) as page:
        login(page, server, next_path="/jobs/new")
        page.goto(server.url + "/jobs/new")
        page.select_option("#launcher", "command")
        assert page.locator("#command_template").is_visible()
        assert not page.locator("#script").is_visible() and not page.locator("#args").is_visible()
        page.check("#distributed")
        page.fill("#num_machines", "1")
        page.fill("#nproc_per_node", "1")
        page.uncheck("#preflight")

        page.click("#plan")  # no template yet: the form says so next to the field
        error = page.locator(".field-error")
        error.first.wait_for()
        assert "needs a command template" in error.first.inner_text()

        page.fill("#command_template", "echo {rank}")  # the server names the field
        page.click("#plan")
        page.wait_for_function(
            "() => [...document.querySelectorAll('.field-error')]"
            ".some(e => e.innerText.includes('unknown placeholder {rank}'))"
        )

        page.fill("#command_template", template)
        page.click("#plan")
        plan = page.locator("#plan-view")
        plan.locator("[data-node=local1]").wait_for()
        assert template in plan.inner_text()
        assert (
            "echo node 0 of 1 on local1" in plan.locator("[data-node=local1] pre.cmd").inner_text()
        )
        job_id = str(plan.get_attribute("data-job-id"))
        shots.take(page, "command-plan")
        with page.expect_navigation(url=f"**/jobs/{job_id}"):
            page.click("#launch")
    with server.client() as client:
        done = wait_status(client, job_id, ["succeeded", "failed", "lost", "cancelled"], 90)
        assert done["status"] == "succeeded", done
        output = client.get(f"/api/network/local_job_output/{job_id}").json()
        assert "[local1] node 0 of 1 on local1" in output["lines"]
