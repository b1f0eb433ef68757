"""What a team member's input can make the server tell or keep, over real HTTP (the
app of ``corral serve`` in a uvicorn thread, a SQLite store): secret env values found
by name *and* by value and never shown to a viewer nor stored; a calibration path that
tells nothing about the server's files; a machine ``host`` that is a host; answers
carrying a new token or session never cached; ``/docs`` served from this server."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from corral.sessions import LOGIN_COOKIE
from tests import webkit
from tests.e2e.test_api import Api, served
from tests.serverlib import LiveServer, live_server
from tests.webkit import Shots, login, open_page

browser = webkit.browser  # fixtures
shots = webkit.shots

SECRETS = {
    "DB_PASS": "pw-Zr4tq9-local",
    "HF_AUTH": "Basic-Qm9iOmh1bnRlcg",
    "DATABASE_URL": "postgresql://app:Kq7sEcReT@db.internal:5432/runs",
    "MODEL_HUB": "hf_" + "aB3dE5gH7jK9mN1pQ3sT5vX7z",
    "GIT_REMOTE": "ghp_" + "Zy8Xw6Vu4Ts2Rq0Po8Nm6Lk4Ji2Hg0Fe",
    "OPENAI": "sk-" + "proj-Wq2Er4Ty6Ui8Op0As2Df4Gh",
    "SLACK": "xoxb-" + "1234567890-0987654321-AbCdEfGhIjKl",
    "AWS_ID": "AKIA" + "IOSFODNN7EXAMPLE",
    "SESSION_JWT": "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJib2IifQ.c2lnbmF0dXJlLXZhbHVl",
    "ENDPOINT": "https://bob:tok-Vv81@example.org/api",
}
PLAIN = {"PLAIN": "visible-value", "MODEL_URL": "https://example.org/model.bin"}


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Api]:
    with served(tmp_path / "server") as served_api:
        yield served_api


def _viewer(api: Api) -> httpx.Client:
    made = api.client.post("/api/users", json={"name": "vic", "role": "viewer"})
    assert made.status_code == 201, made.text
    headers = {"Authorization": f"Bearer {made.json()['token']}"}
    return httpx.Client(base_url=api.url, headers=headers, timeout=60)


def test_secret_env_values_are_found_by_name_and_value_and_never_shown_or_stored(
    api: Api,
) -> None:
    api.add_machine("sim1", slots=1)
    env = {**SECRETS, **PLAIN}
    planned = api.plan(script=api.script(), env=env, nproc_per_node=1)
    assert planned.status_code == 200, planned.text
    job_id = planned.json()["job_id"]
    queued = api.client.post(
        "/api/jobs/queue",
        json={"script": api.script(), "launcher": "python", "preflight": False, "env": env},
    )
    assert queued.status_code == 201, queued.text
    queued_id = queued.json()["job_id"]
    shown = [planned.text, queued.text]
    with _viewer(api) as viewer:
        for path in (
            "/api/jobs",
            f"/api/jobs/{job_id}",
            f"/api/jobs/{queued_id}",
            f"/api/network/distributed/status/{job_id}",
            "/api/queue",
        ):
            answer = viewer.get(path)
            assert answer.status_code == 200, (path, answer.text)
            shown.append(answer.text)
    for text in shown:
        for key, value in SECRETS.items():
            assert value not in text, (key, text[:2000])
    assert any(PLAIN["PLAIN"] in text for text in shown)  # only the secrets are withheld
    stored = b"".join(p.read_bytes() for p in api.root.glob("corral.db*"))
    run_files = b"".join(p.read_bytes() for p in (api.root / "runs").rglob("*") if p.is_file())
    for key, value in SECRETS.items():
        assert value.encode() not in stored, key
        assert value.encode() not in run_files, key


def test_a_calibration_path_tells_nothing_about_the_servers_files(api: Api) -> None:
    api.add_machine("sim1", slots=1)
    binary = api.root / "model.bin"
    binary.write_bytes(bytes(range(256)) * 4)
    text = api.root / "notes.txt"
    text.write_text("root:x:0:0:root:/root:/bin/bash\n")
    other = api.root / "other.json"
    other.write_text('{"users": ["alice"]}')
    fifo = api.root / "pipe"
    os.mkfifo(fifo)
    messages = set()
    for path in (binary, text, other, fifo, api.root, api.root / "missing.json", "/dev/zero"):
        answer = api.plan(script=api.script(), calibration=str(path))
        assert answer.status_code == 422, (path, answer.text)
        error = answer.json()["error"]
        assert error["details"] == {"field": "calibration"}
        messages.add(error["message"].replace(repr(str(path)), "PATH"))
    assert len(messages) == 1, messages


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"host": "<img src=x onerror=alert(1)>"}, "body.host"),
        ({"host": "gpu1 -oProxyCommand=x"}, "body.host"),
        ({"host": "ml@gpu1"}, "body.host"),
        ({"host": "gpu1;reboot"}, "body.host"),
        ({"host": "gpu1", "user": "<b>ml</b>"}, "body.user"),
    ],
)
def test_a_machine_host_must_be_a_host(api: Api, body: dict[str, Any], field: str) -> None:
    answer = api.client.post("/api/network/machines", json={"name": "m1", **body})
    assert answer.status_code == 422, answer.text
    assert answer.json()["error"]["details"]["fields"][0]["field"] == field
    assert api.client.get("/api/network/machines").json() == []


def test_machine_hosts_that_are_hosts_are_accepted(api: Api) -> None:
    for i, host in enumerate(("gpu1.example.org", "10.0.0.7", "fe80::1", "gpu_rack-2", "h")):
        answer = api.client.post("/api/network/machines", json={"name": f"m{i}", "host": host})
        assert answer.status_code == 201, (host, answer.text)


def test_answers_with_a_new_token_or_session_are_never_cached(api: Api) -> None:
    made = api.client.post("/api/users", json={"name": "ned", "role": "user"})
    assert made.status_code == 201 and made.json()["token"]
    assert made.headers["cache-control"] == "no-store"
    with httpx.Client(base_url=api.url, timeout=60) as web:
        form = web.get("/login")
        assert form.headers["cache-control"] == "no-store"
        done = web.post(
            "/login",
            data={"token": made.json()["token"], "csrf_token": web.cookies[LOGIN_COOKIE]},
        )
        assert done.status_code == 303 and "corral_session" in done.headers["set-cookie"]
        assert done.headers["cache-control"] == "no-store"
        assert web.get("/api/me").headers["cache-control"] == "no-store"
        # the pages' own script may be kept
        assert "no-store" not in web.get("/static/corral.js").headers.get("cache-control", "")


def test_docs_are_served_from_this_server(api: Api) -> None:
    page = api.client.get("/docs")
    assert page.status_code == 200, page.text
    refs = re.findall(r'(?:src|href)="([^"]+)"', page.text)
    assert refs and all(r.startswith("/") and not r.startswith("//") for r in refs), refs
    for ref in refs:
        asset = api.client.get(ref)
        assert asset.status_code == 200 and len(asset.content) > 0, ref
    policy = page.headers["content-security-policy"]
    assert "script-src 'self';" in policy and "http" not in policy
    assert api.client.get("/redoc").status_code == 404
    assert api.client.get("/openapi.json").json()["info"]["title"] == "corral"
    assert httpx.get(api.url + "/docs").status_code == 401  # no token, no docs


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with live_server(tmp_path_factory.mktemp("docs")) as srv:
        yield srv


def test_the_docs_page_works_in_a_browser_loading_nothing_from_elsewhere(
    browser: Any, shots: Shots, server: LiveServer
) -> None:
    requested: list[str] = []
    refused: list[str] = []

    def console(message: Any) -> None:
        if "Content Security Policy" in message.text:
            refused.append(message.text)

    with open_page(browser, shots) as page:
        page.on("request", lambda r: requested.append(r.url))
        page.on("console", console)
        login(page, server)
        page.goto(server.url + "/docs")
        page.locator(".swagger-ui .info .title").filter(has_text="corral").wait_for()
        page.locator(".opblock-summary-path", has_text="/api/jobs/queue").first.wait_for()
        shots.take(page, "docs")
    assert not [u for u in requested if not u.startswith((server.url + "/", "data:"))]
    assert not refused, refused


CHECK_ENV = """\
import json, os
expected = json.loads(os.environ["EXPECTED"])
print("same:", all(os.environ.get(k) == v for k, v in expected.items()), flush=True)
"""


def test_a_job_still_gets_the_real_values_of_its_secrets(api: Api) -> None:
    api.add_machine("sim1", slots=1)
    script = api.root / "check_env.py"
    script.write_text(CHECK_ENV)
    # EXPECTED holds the values too, so it is redacted itself (its value looks secret)
    env = {**SECRETS, "EXPECTED": json.dumps(SECRETS)}
    status = api.run(script=str(script), env=env, nproc_per_node=1)
    assert status["status"] == "succeeded", status
    lines = api.client.get(f"/api/network/local_job_output/{status['job_id']}").json()["lines"]
    assert "[sim1:0] same: True" in lines, lines
