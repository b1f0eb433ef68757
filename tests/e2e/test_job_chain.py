"""Jobs that follow jobs on a real ``corral serve``: ``corral job submit --after A``
waits in the queue (``waiting for job A to succeed``, in the CLI, the API and the job
page) and starts once A succeeded, a chain in order; a job waiting for one that was
cancelled is cancelled naming it; ``corral job resubmit`` and the job page's Resubmit
queue a finished job's request again, its Clone fills the new-job form with it (queued
from there with a priority and the job to start after). A stop
names who stopped the job and from where (``(cli)``, ``(api)``).

The jobs that run are stdlib scripts (``--launcher python``) on one local machine; the
ones that must wait are queued for an SSH machine nobody checked."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests import webkit
from tests.serverlib import TOKEN, LiveServer, live_server, wait_status
from tests.webkit import Shots, login, open_page

browser = webkit.browser  # fixtures
shots = webkit.shots

GATED = """\
import os, sys, time
gate = sys.argv[1]
for _ in range(600):
    if os.path.exists(gate):
        break
    time.sleep(0.1)
print("through the gate", flush=True)
"""
ENDED = ["succeeded", "failed", "cancelled", "lost", "timed_out"]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    root = tmp_path_factory.mktemp("job-chain")
    with live_server(root, args=["--health-interval", "0"]) as srv:
        with srv.client() as admin:
            for body in ({"name": "local1", "local": True}, {"name": "gpu1", "host": "10.9.9.9"}):
                made = admin.post("/api/network/machines", json=body)
                assert made.status_code == 201, made.text
        (root / "gated.py").write_text(GATED)
        yield srv


def _corral(server: LiveServer, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CORRAL_TOKEN": TOKEN, "COLUMNS": "400", "NO_COLOR": "1"}
    return subprocess.run(
        [sys.executable, "-m", "corral", "job", args[0], "--server", server.url, *args[1:]],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def _submit(server: LiveServer, *options: str, machine: str = "local1") -> tuple[str, str]:
    """Submit the gated script (it ends once the gate file exists): its id and stderr."""
    done = _corral(
        server,
        "submit",
        "--launcher",
        "python",
        "--nproc-per-node",
        "1",
        "--no-preflight",
        "--machine",
        machine,
        *options,
        "--",
        str(server.root / "gated.py"),
        str(server.root / "gate"),
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip(), done.stderr


def test_after_waits_starts_in_order_and_cancels_naming_the_job(server: LiveServer) -> None:
    first, _ = _submit(server)
    second, said = _submit(server, "--after", first)
    assert f"job {second} is queued: waiting for job {first} to succeed" in " ".join(said.split())
    third, _ = _submit(server, "--after", second)
    with server.client() as admin:
        status = admin.get(f"/api/jobs/{second}").json()
        assert (status["status"], status["after"]) == ("queued", [first])
        assert status["reason"] == f"waiting for job {first} to succeed"
        queue = {e["job_id"]: e["reason"] for e in admin.get("/api/queue").json()}
        assert queue[second] == status["reason"]
        assert queue[third] == f"waiting for job {second} to succeed"
    shown = _corral(server, "status", second)
    assert f"queued: waiting for job {first} to succeed" in shown.stdout, shown.stdout
    assert f"after {first} succeed" in shown.stdout, shown.stdout

    # a job waiting for one that is cancelled (by the CLI) is cancelled, naming it
    held, _ = _submit(server, "--queue", machine="gpu1")
    waiter, _ = _submit(server, "--after", held, machine="gpu1")
    stopped = _corral(server, "stop", held)
    assert stopped.returncode == 0, stopped.stderr
    with server.client() as admin:
        held_status = admin.get(f"/api/jobs/{held}").json()
        assert held_status["reason"] == "stopped by admin (cli) before it started", held_status
        waiter_status = wait_status(admin, waiter, ENDED)
    assert waiter_status["status"] == "cancelled"
    assert waiter_status["reason"] == f"not started: job {held}, which it waits for, cancelled"
    # one that could never start, or names no job, is refused
    refused = _corral(
        server, "submit", "--after", held, "--launcher", "python", "--", "gated.py", "x"
    )
    assert refused.returncode != 0 and f"job {held}, which it waits for, cancelled" in (
        " ".join(refused.stderr.split())
    )
    unknown = _corral(server, "submit", "--after", "nosuchjob", "--launcher", "python", "--", "x")
    assert unknown.returncode != 0 and "no job nosuchjob" in unknown.stderr, unknown.stderr

    # the gate opens: the chain runs in its order
    (server.root / "gate").write_text("")
    with server.client() as admin:
        ends = {j: wait_status(admin, j, ENDED) for j in (first, second, third)}
    assert [ends[j]["status"] for j in (first, second, third)] == ["succeeded"] * 3
    when = {j: (float(str(e["started"])), float(str(e["ended"]))) for j, e in ends.items()}
    assert when[first][1] <= when[second][0] <= when[second][1] <= when[third][0], when

    # corral job resubmit: a new job with the same request, queued, run
    again = _corral(server, "resubmit", first)
    assert again.returncode == 0, again.stderr
    new_id = again.stdout.strip()
    assert new_id != first
    with server.client() as admin:
        done = wait_status(admin, new_id, ENDED)
        assert (done["status"], done["owner"]) == ("succeeded", "admin")
        old_request = admin.get(f"/api/jobs/{first}/request").json()
        assert admin.get(f"/api/jobs/{new_id}/request").json() == old_request
        # an API stop says so; a job that ran with a secret is not resubmitted without it
        secret = admin.post(
            "/api/jobs/queue",
            json={
                "script": "x.py",
                "launcher": "python",
                "machine_selection": "manual",
                "selected_machines": ["gpu1"],
                "env": {"HF_TOKEN": "hf_abcdefghijklmnopqrstuvwxyz0123456789"},
            },
        ).json()["job_id"]
        assert admin.post(f"/api/network/distributed/stop/{secret}").status_code == 200
        assert admin.get(f"/api/jobs/{secret}").json()["reason"] == (
            "stopped by admin (api) before it started"
        )
        refused_again = admin.post(f"/api/jobs/{secret}/resubmit")
        assert refused_again.status_code == 409, refused_again.text
        assert "HF_TOKEN" in refused_again.json()["error"]["message"]


def test_the_job_page_resubmits_and_clones(
    server: LiveServer, browser: Any, shots: Shots, tmp_path: Path
) -> None:
    (server.root / "gate").write_text("")
    job_id, _ = _submit(server, "--name", "to-clone")
    with server.client() as admin:
        assert wait_status(admin, job_id, ENDED)["status"] == "succeeded"
    with open_page(browser, shots) as page:
        login(page, server, next_path=f"/jobs/{job_id}")
        page.locator("#job-status", has_text="succeeded").wait_for()
        page.locator("#clone:not([hidden])").click()
        page.wait_for_url(f"**/jobs/new?from={job_id}")
        page.locator("#name[value], #name").first.wait_for()
        page.wait_for_function("() => document.getElementById('name').value === 'to-clone'")
        assert page.input_value("#script") == str(server.root / "gated.py")
        assert page.input_value("#args") == str(server.root / "gate")
        assert page.is_checked("#selection-manual")
        # changed before it is queued: to start after the job, behind the others
        page.locator("details:has(#after) > summary").click()
        page.fill("#after", job_id)
        page.fill("#queue-priority", "-3")
        page.click("#queue")
        page.wait_for_url("**/jobs")
        with server.client() as admin:
            newest = admin.get("/api/jobs", params={"limit": 1}).json()["jobs"][0]
        clone = newest["job_id"]
        assert (newest["name"], newest["priority"]) == ("to-clone", -3), newest
        page.goto(f"{server.url}/jobs/{clone}")
        page.locator("#job-status", has_text="succeeded").wait_for(timeout=120_000)
        assert page.locator("dd[data-fact=after]").inner_text() == f"{job_id} succeed"
        assert page.locator("dd[data-fact=priority]").inner_text() == "-3"
        page.goto(f"{server.url}/jobs/{job_id}")
        page.locator("#resubmit:not([hidden])").click()
        page.wait_for_url(lambda url: job_id not in url and "/jobs/" in url)
        new_id = page.url.rsplit("/", 1)[-1]
        page.locator("#job-status", has_text="succeeded").wait_for(timeout=120_000)
    with server.client() as admin:
        status = admin.get(f"/api/jobs/{new_id}").json()
    assert (status["name"], status["owner"], status["status"]) == ("to-clone", "admin", "succeeded")
