"""The web page driving the netns testbed: real headless Chromium (Playwright),
a real ``corral serve --ssh-config`` and real sshd on tb1 and tb2.

Log in, add the machines through the form and health-check them; plan a
2-machine job from the form, launch it and follow its progress bars, live logs
and chart to ``succeeded``; a job failing on one rank shows that host and rank
as its root cause; "Stop all" cancels a long job and leaves no process on any
host (asked over SSH). Screenshots of each step go to the test's ``shots`` dir;
with ``CORRAL_UPDATE_SCREENSHOTS=1`` the README's ``docs/screenshots/machines.png``
and ``job.png`` are taken anew.

The job tests share one server with tb1 and tb2 registered and checked once (each
start costs ~1.7 CPU-s; issue 30), freed between tests; the machines test adds them
through the form, to a server of its own.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from corral.testbed import Testbed
from tests import webkit
from tests.serverlib import LiveServer, live_server
from tests.webkit import Shots, doc_screenshot, login, open_page

from ..conftest import REPO
from .conftest import shared_root

pytestmark = pytest.mark.netns

browser = webkit.browser  # fixtures
shots = webkit.shots

HOSTS = ("tb1", "tb2")
FINAL = ("succeeded", "failed", "timed_out", "cancelled", "lost")
#: A rank that prints a line and reports its step (with a loss) every PAUSE seconds;
#: the rank on host FAIL_ON raises at step 3. Any further argument is a marker that
#: only shows on the command line (found with pgrep on the hosts).
SCRIPT = """\
import os, socket, sys, time
sys.path.insert(0, {src!r})
from corral.sdk import report
total, pause, fail_on = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
host = socket.gethostname()
me = f"rank {{os.environ['RANK']}} on {{host}}"
step = 0
while step < total:
    step += 1
    print(f"{{me}} step {{step}}", flush=True)
    report(step, total, loss=1.0 / step)
    if host == fail_on and step == 3:
        raise RuntimeError(f"boom on {{host}}")
    time.sleep(pause)
print(f"{{me}} done", flush=True)
"""


@contextmanager
def _force_stop_after(srv: LiveServer) -> Iterator[None]:
    """On the way out: every job of ``srv`` not yet final is force-stopped, and the
    machines are free again (within a minute)."""
    try:
        yield
    finally:
        with srv.client() as client:
            left = [
                j["job_id"]
                for j in client.get("/api/jobs").json()["jobs"]
                if j["status"] not in FINAL
            ]
            for job_id in left:
                client.post(f"/api/network/distributed/stop/{job_id}", params={"force": "true"})
            deadline = time.monotonic() + 60
            while client.get("/api/network/status").json()["busy"]:
                if time.monotonic() > deadline:
                    break
                time.sleep(0.2)


@pytest.fixture
def fresh_server(testbed: Testbed, tmp_path: Path) -> Iterator[LiveServer]:
    """A ``corral serve`` of the test's own reaching the testbed (its ssh_config), with
    no machine registered."""
    ssh = ["--ssh-config", str(testbed.ssh_config)]
    with live_server(tmp_path / "srv", args=ssh) as srv, _force_stop_after(srv):
        yield srv


@pytest.fixture(scope="module")
def module_server(testbed: Testbed) -> Iterator[LiveServer]:
    """The job tests' ``corral serve`` reaching the testbed, tb1 and tb2 registered
    and checked online through the API (the form is tested once), in a directory
    every host sees (removed after)."""
    root = shared_root(testbed)
    root.mkdir(exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix="web-", dir=root))
    ssh = ["--ssh-config", str(testbed.ssh_config)]
    try:
        with live_server(path / "srv", args=ssh) as srv:
            with srv.client() as client:
                for name in HOSTS:
                    added = client.post("/api/network/machines", json={"name": name})
                    assert added.status_code == 201, added.text
                online = client.post("/api/network/health-check").json()["online"]
                assert online == len(HOSTS), client.get("/api/network/status").text
            yield srv
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def server(module_server: LiveServer) -> Iterator[LiveServer]:
    """The module's server, tb1 and tb2 online and free; the test's jobs stopped after."""
    with module_server.client() as client:
        status = client.get("/api/network/status").json()
    assert (status["total"], status["online"], status["busy"]) == (2, 2, 0), status
    with _force_stop_after(module_server):
        yield module_server


@pytest.fixture
def script(tmp_path: Path) -> str:
    """The rank script, where every host sees it."""
    path = tmp_path / "ranks.py"
    path.write_text(SCRIPT.format(src=str(REPO / "src")))
    return str(path)


def _launch_from_form(page: Any, server: LiveServer, script: str, *args: str) -> str:
    """Fill the new-job form (python launcher, 2 machines, 1 rank each), plan, check
    the plan, launch; the job id (the page is then the job's)."""
    page.goto(server.url + "/jobs/new")
    page.fill("#script", script)
    page.fill("#args", "\n".join(args))
    page.select_option("#launcher", "python")
    page.check("#distributed")
    page.fill("#num_machines", "2")
    page.fill("#nproc_per_node", "1")
    page.check("#selection-auto")
    page.uncheck("#preflight")  # quicker; the pre-flight has tests of its own
    page.click("#plan")
    plan = page.locator("#plan-view")
    plan.locator("[data-node=tb2]").wait_for()
    for host in HOSTS:
        assert plan.locator(f"[data-node={host}] pre.cmd").count() >= 1, plan.inner_text()
    assert script in plan.inner_text()
    assert page.locator("#plan-view [data-field=master]").inner_text().startswith("tb")
    job_id = str(plan.get_attribute("data-job-id"))
    with page.expect_navigation(url=f"**/jobs/{job_id}"):
        page.click("#launch")
    return job_id


@contextmanager
def _launched(
    browser: Any, shots: Shots, server: LiveServer, script: str, *args: str
) -> Iterator[tuple[Any, str]]:
    """Logged in (tb1 and tb2 registered), a job launched from the form: (page, job id)."""
    with open_page(browser, shots) as page:
        login(page, server)
        yield page, _launch_from_form(page, server, script, *args)


def _status_text(page: Any) -> str:
    return str(page.locator("#job-status").inner_text()).strip()


def _wait_status(page: Any, states: tuple[str, ...], timeout_s: float = 90) -> str:
    """Wait until ``#job-status`` names one of ``states``; that text."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        text = _status_text(page)
        if any(state in text for state in states):
            return text
        page.wait_for_timeout(200)
    raise AssertionError(f"job status still {_status_text(page)!r}, not one of {states}")


def _bars(page: Any) -> dict[str, float]:
    """Each node's progress bar value (0 before any)."""
    return {
        host: float(
            page.locator(f"#nodes [data-node={host}] progress").evaluate("e => e.value") or 0
        )
        for host in HOSTS
    }


def _wait_bars_above(page: Any, floor: dict[str, float], timeout_s: float = 60) -> dict[str, float]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        page.locator("#nodes [data-node=tb2] progress").wait_for()
        bars = _bars(page)
        if all(bars[h] > floor[h] for h in HOSTS):
            return bars
        page.wait_for_timeout(200)
    raise AssertionError(f"progress bars stuck at {_bars(page)} (after {floor})")


def _left_on(testbed: Testbed, marker: str, within: float) -> dict[str, str]:
    """Processes whose command line has ``marker``, per host, asked over SSH
    (``[x]yz`` so pgrep never matches the shell running it); polled until none."""
    pattern = f"[{marker[0]}]{marker[1:]}"
    deadline = time.monotonic() + within
    while True:
        found = {}
        for host in HOSTS:
            argv = testbed.ssh_argv(host, f"pgrep -af '{pattern}'")
            out = subprocess.run(argv, capture_output=True, text=True, timeout=30)
            assert out.returncode in (0, 1), (host, out.returncode, out.stderr)
            if out.stdout.strip():
                found[host] = out.stdout.strip()
        if not found or time.monotonic() >= deadline:
            return found
        time.sleep(0.5)


# -- machines ----------------------------------------------------------------------------


def test_login_add_machines_and_health_check(
    browser: Any, shots: Shots, fresh_server: LiveServer
) -> None:
    server = fresh_server
    with open_page(browser, shots) as page:
        page.goto(server.url + "/")
        assert urlsplit(page.url).path == "/login", page.url  # no session: the login page
        login(page, server)
        for name in HOSTS:
            page.fill("#machine_name", name)  # host defaults to the name (an ssh_config alias)
            page.click("#add-machine-submit")
            page.locator(f"[data-machine={name}]").wait_for()
        shots.take(page, "added")
        page.click("#health-check")
        for name in HOSTS:
            page.locator(f"#machines-body [data-machine={name}][data-status=online]").wait_for()
        with server.client() as client:
            machines = {m["name"]: m for m in client.get("/api/network/machines").json()}
        for name in HOSTS:
            row = page.locator(f"#machines-body [data-machine={name}]")
            assert "online" in row.locator(".c-status").inner_text()  # a word, not a colour
            cpus = machines[name]["capabilities"]["cpus"]
            assert cpus >= 1 and row.locator(".c-cpus").inner_text().strip() == str(cpus)
        shots.take(page, "online")
        doc_screenshot(page, "machines")

        # a state change with the session but without its CSRF token is refused
        forged = page.evaluate(
            """async () => (await fetch("/api/network/machines", {method: "POST",
                 headers: {"Content-Type": "application/json"},
                 body: JSON.stringify({name: "tb3"})})).status"""
        )
        assert forged == 403
        page.evaluate(
            "document.querySelector('form[action=\"/logout\"] [name=csrf_token]').remove()"
        )
        with page.expect_navigation():
            page.click("form[action='/logout'] [type=submit]")
        assert "CSRF" in page.content()  # the logout form without its token: 403
        page.goto(server.url + "/")
        assert urlsplit(page.url).path == "/", page.url  # still logged in
        for name in HOSTS:  # the rows are filled by the page's script: wait for them
            page.locator(f"#machines-body [data-machine={name}]").wait_for()
        assert page.locator("#machines-body tr").count() == len(HOSTS)  # no tb3


# -- jobs --------------------------------------------------------------------------------


def test_plan_launch_and_follow_a_job(
    browser: Any, shots: Shots, server: LiveServer, script: str
) -> None:
    with _launched(browser, shots, server, script, "40", "0.25", "-") as (page, job_id):
        first = _wait_bars_above(page, dict.fromkeys(HOSTS, 0.0))
        later = _wait_bars_above(page, {h: max(first[h], 14.0) for h in HOSTS})  # they advance
        assert "running" in _status_text(page), _status_text(page)
        for host in HOSTS:  # live lines from both hosts, while the job runs
            page.locator(f"#logs .line[data-host={host}]").first.wait_for()
        shots.take(page, "running")
        doc_screenshot(page, "job")
        assert all(later[h] < 40 for h in HOSTS), later  # seen mid-run

        assert "succeeded" in _wait_status(page, FINAL)
        for host in HOSTS:
            lines = page.locator(f"#logs .line[data-host={host}]")
            assert lines.filter(has_text="done").count() == 1, host
            assert page.locator(f"#chart svg path[data-node={host}]").count() == 1, host
            bar = page.locator(f"#nodes [data-node={host}] progress")
            assert bar.evaluate("e => [e.value, e.max]") == [40, 40]
        assert page.locator("#root-cause").is_hidden()
        assert page.locator("#stop-all").is_hidden()
        shots.take(page, "succeeded")
    with server.client() as client:
        assert client.get(f"/api/network/distributed/status/{job_id}").json()["status"] == (
            "succeeded"
        )


@pytest.mark.slow
def test_failed_rank_is_the_root_cause(
    browser: Any, shots: Shots, server: LiveServer, script: str
) -> None:
    with _launched(browser, shots, server, script, "1000", "0.2", "tb2") as (page, job_id):
        assert "failed" in _wait_status(page, FINAL)
        box = page.locator("#root-cause")
        box.wait_for()
        with server.client() as client:
            status = client.get(f"/api/network/distributed/status/{job_id}").json()
        rank = next(n["ranks"][0] for n in status["nodes"] if n["host"] == "tb2")
        assert box.locator("[data-field=host]").inner_text().strip() == "tb2"
        assert box.locator("[data-field=rank]").inner_text().strip() == str(rank)
        assert "boom on tb2" in box.inner_text(), box.inner_text()
        shots.take(page, "root-cause")


@pytest.mark.slow
def test_stop_all_leaves_nothing_on_the_hosts(
    browser: Any, shots: Shots, server: LiveServer, script: str, testbed: Testbed
) -> None:
    marker = f"web-stop-{uuid.uuid4().hex[:10]}"
    with _launched(browser, shots, server, script, "100000", "0.2", "-", marker) as (page, _):
        _wait_bars_above(page, dict.fromkeys(HOSTS, 0.0))
        assert set(_left_on(testbed, marker, within=0)) == set(HOSTS)  # running on both

        page.click("#stop-all")
        dialog = page.locator("dialog#stop-dialog")
        dialog.wait_for()
        shots.take(page, "stop-confirm", full_page=False)
        page.click("#stop-confirm")
        assert "cancelled" in _wait_status(page, FINAL, timeout_s=60)
        assert page.locator("#stop-all").is_hidden()
        shots.take(page, "cancelled")
    assert not _left_on(testbed, marker, within=30)
