"""``collective_timeout`` (``--collective-timeout``), the option the one schema added
end to end, against a real ``corral serve`` over HTTP (one local machine): the API's
request sets every rank's CORRAL_DIST_TIMEOUT, its default is the schema's, a bad value
is a 422 naming the field, and the new-job page (a signed-in session) offers it with
the schema's default (and the state vocabulary its scripts read)."""

from __future__ import annotations

import html
import re
from typing import Any

import httpx

from tests.e2e import test_web_auth
from tests.serverlib import TOKEN, LiveServer, wait_status

server = test_web_auth.server  # a server with one local machine, local1, checked

PRINT_IT = "import os\nprint('dist-timeout', os.environ.get('CORRAL_DIST_TIMEOUT'))\n"


def _run(server: LiveServer, **options: Any) -> list[str]:
    """Plan and dispatch the script with ``options``; the lines it printed."""
    script = server.root / "dist_timeout.py"
    script.write_text(PRINT_IT)
    body = {"script": str(script), "launcher": "python", "nproc_per_node": 1, "preflight": False}
    with server.client() as client:
        planned = client.post("/api/network/distributed/plan", json={**body, **options})
        assert planned.status_code == 200, planned.text
        job_id = str(planned.json()["job_id"])
        sent = client.post("/api/network/distributed/dispatch", json={"job_id": job_id})
        assert sent.status_code == 200, sent.text
        done = wait_status(client, job_id, ["succeeded", "failed", "lost", "cancelled"], 90)
        assert done["status"] == "succeeded", done
        page = client.get(f"/api/network/local_job_output/{job_id}")
        assert page.status_code == 200, page.text
        return [line for line in page.json()["lines"] if "dist-timeout" in line]


def test_the_request_sets_every_ranks_collective_timeout(server: LiveServer) -> None:
    assert _run(server, collective_timeout=45) == ["[local1:0] dist-timeout 45"]
    assert _run(server) == ["[local1:0] dist-timeout 1800"]  # the schema's default


def test_a_bad_collective_timeout_is_a_422_naming_it(server: LiveServer) -> None:
    with server.client() as client:
        answer = client.post(
            "/api/network/distributed/plan", json={"script": "t.py", "collective_timeout": 0}
        )
    assert answer.status_code == 422, answer.text
    assert "collective_timeout" in answer.text


def test_the_new_job_page_offers_it_with_the_schemas_default(server: LiveServer) -> None:
    with httpx.Client(base_url=server.url, timeout=30) as browser:
        login = browser.get("/login")
        found = re.search(r'name="csrf_token" value="([^"]+)"', login.text)
        assert found is not None, login.text
        signed = browser.post(
            "/login", data={"token": TOKEN, "csrf_token": found.group(1), "next": "/jobs/new"}
        )
        assert signed.status_code == 303, signed.text
        page = browser.get("/jobs/new")
    assert page.status_code == 200, page.text
    tag = re.search(r'<input id="collective_timeout"[^>]*>', page.text)
    assert tag is not None, "no collective_timeout input on /jobs/new"
    assert 'data-default="1800.0"' in tag.group(0) and 'value="1800.0"' in tag.group(0)
    assert 'min="0"' in tag.group(0)  # gt 0, as the API checks
    states = re.search(r'<body [^>]*data-states="([^"]+)"', page.text)
    assert states is not None and "timed_out" in html.unescape(states.group(1))
