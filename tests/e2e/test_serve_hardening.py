"""``corral serve`` probed as an attacker would: state-changing GETs with a browser
session, file modes of the SQLite store, bad input that must be a 4xx naming the
field (on SQLite and a real PostgreSQL), request-size limits and bounds, security
headers, the bind/TLS/token rules of the command, ``/metrics`` without ``_created``.

The app runs in Starlette's TestClient (the whole middleware stack, no socket);
the cases about the command itself start the real ``corral serve``.
"""

from __future__ import annotations

import json
import logging
import os
import re
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import text
from sqlalchemy.exc import DataError, DBAPIError, OperationalError

from corral.api.app import create_app
from corral.api.hardening import CSP
from corral.api.services import Services
from corral.service.settings import ServerSettings
from corral.service.users import hash_token
from corral.sessions import CSRF_HEADER, SESSION_COOKIE, Sessions
from corral.store import open_store
from tests.serverlib import TOKEN, free_port, live_server

AUTH = {"Authorization": f"Bearer {TOKEN}"}
TEMPLATES = Path(__file__).resolve().parents[2] / "src" / "corral" / "web" / "templates"


def _client(db_url: str, tmp_path: Path, **app_args: Any) -> Iterator[TestClient]:
    store = open_store(db_url)
    settings = ServerSettings(run_dir=tmp_path / "runs", health_interval=0)
    app = create_app(Services.build(store, settings), TOKEN, background=False, **app_args)
    try:
        with TestClient(app, base_url="http://127.0.0.1") as client:
            yield client
    finally:
        store.close()


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    """The app over a SQLite store, with no client credentials set."""
    yield from _client(f"sqlite:///{tmp_path / 'corral.db'}", tmp_path)


@pytest.fixture
def any_store_client(store_url: str, tmp_path: Path) -> Iterator[TestClient]:
    """The app over SQLite and over a real PostgreSQL database."""
    yield from _client(store_url, tmp_path)


def _error(r: httpx.Response, status: int) -> dict[str, Any]:
    assert r.status_code == status, r.text
    error: dict[str, Any] = r.json()["error"]
    return error


def _task(client: TestClient) -> str:
    made = client.post(
        "/api/tasks",
        headers=AUTH,
        json={"name": "t", "request": {"script": "train.py", "launcher": "python"}},
    )
    assert made.status_code == 201, made.text
    return str(made.json()["id"])


def _queued(client: TestClient) -> int:
    return int(client.get("/api/jobs?status=queued", headers=AUTH).json()["total"])


# -- state-changing GETs -------------------------------------------------------------------


def test_queue_gets_refuse_a_cookie_session_and_posts_need_its_csrf(client: TestClient) -> None:
    task = _task(client)
    sessions: Sessions = client.app.state.sessions  # type: ignore[attr-defined]
    sid, session = sessions.create("admin", hash_token(TOKEN))
    cookie = {"Cookie": f"{SESSION_COOKIE}={sid}"}
    for path in (f"/api/tasks/{task}/queue_distributed", f"/api/tasks/{task}/queue/m1"):
        assert _error(client.get(path, headers=cookie), 403)["type"] == "forbidden"
        assert _error(client.post(path, headers=cookie), 403)["type"] == "csrf"
    assert _queued(client) == 0  # nothing was queued by any of them
    posted = client.post(
        f"/api/tasks/{task}/queue_distributed", headers={**cookie, CSRF_HEADER: session.csrf}
    )
    assert posted.status_code == 200, posted.text
    assert _queued(client) == 1
    # the seed's GET stays for bearer-token clients, the POST works for them too
    assert client.get(f"/api/tasks/{task}/queue_distributed", headers=AUTH).status_code == 200
    assert client.post(f"/api/tasks/{task}/queue_distributed", headers=AUTH).status_code == 200
    assert _queued(client) == 3


# -- the store's file modes ----------------------------------------------------------------


def test_an_existing_sqlite_file_and_its_wal_and_shm_become_0600(tmp_path: Path) -> None:
    db = tmp_path / "corral.db"
    open_store(f"sqlite:///{db}").close()
    companions = [db, Path(f"{db}-wal"), Path(f"{db}-shm")]
    for path in companions:
        path.touch()
        path.chmod(0o644)
    store = open_store(f"sqlite:///{db}")
    try:
        with store.session() as s:  # a write: SQLite (re)makes -wal and -shm
            s.execute(text("CREATE TABLE IF NOT EXISTS probe (x INTEGER)"))
        for path in companions:
            if path.exists():
                assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
        assert stat.S_IMODE(db.stat().st_mode) == 0o600
    finally:
        store.close()


# -- bad input: 4xx naming the field, on SQLite and PostgreSQL -----------------------------


def _nested(depth: int) -> dict[str, Any]:
    value: dict[str, Any] = {}
    for _ in range(depth):
        value = {"a": value}
    return value


@pytest.mark.parametrize("where", ["task", "plan"])
def test_a_deeply_nested_config_is_422(any_store_client: TestClient, where: str) -> None:
    request = {"script": "train.py", "launcher": "python", "config": _nested(300)}
    if where == "task":
        r = any_store_client.post(
            "/api/tasks", headers=AUTH, json={"name": "deep", "request": request}
        )
    else:
        r = any_store_client.post("/api/network/distributed/plan", headers=AUTH, json=request)
    error = _error(r, 422)
    assert "nested deeper than" in error["message"]
    assert error["details"]["fields"][0]["field"] in ("body.request", "body.config")


@pytest.mark.parametrize(
    ("path", "field"),
    [
        ("/api/jobs/a%00b", "path.job_id"),
        ("/api/jobs?status=a%00b", "query.status"),
        ("/api/jobs?machine=m%00", "query.machine"),
        ("/api/tasks/t%00", "path.task_id"),
        ("/api/network/machines/m%00x", "path.machine_id"),
        ("/api/network/local_job_file/J/logs%00x", "path.key"),
        ("/static/corral%00.js", "path"),
    ],
)
def test_a_nul_in_the_path_or_query_is_422_naming_it(
    any_store_client: TestClient, path: str, field: str
) -> None:
    error = _error(any_store_client.get(path, headers=AUTH), 422)
    assert error["details"]["fields"][0]["field"] == field
    assert field in error["message"]


@pytest.mark.parametrize(
    ("route", "body", "field"),
    [
        ("/api/tasks", {"name": "t\u0000", "request": {"script": "x.py"}}, "body.name"),
        ("/api/tasks", {"name": "t", "request": {"script": "x\u0000.py"}}, "body.request"),
        ("/api/network/machines", {"name": "m1", "host": "h\u0000"}, "body.host"),
        ("/api/network/distributed/plan", {"script": "x.py", "args": ["a\u0000"]}, "body.args"),
        (
            "/api/network/distributed/plan",
            {"script": "x.py", "config": {"k\u0000": 1}},
            "body.config",
        ),
    ],
)
def test_a_nul_in_a_body_is_422_naming_the_field(
    any_store_client: TestClient, route: str, body: dict[str, Any], field: str
) -> None:
    error = _error(any_store_client.post(route, headers=AUTH, json=body), 422)
    assert error["details"]["fields"][0]["field"] == field
    assert "NUL" in error["message"]


@pytest.mark.parametrize("number", ["1e999", "-1e999", "Infinity", "NaN"])
@pytest.mark.parametrize("field", ["config", "timeout"])
def test_non_finite_numbers_are_422_and_never_stored(
    any_store_client: TestClient, number: str, field: str
) -> None:
    value = f'{{"lr": {number}}}' if field == "config" else number
    raw = f'{{"name": "t", "request": {{"script": "x.py", "{field}": {value}}}}}'
    r = any_store_client.post(
        "/api/tasks", headers={**AUTH, "Content-Type": "application/json"}, content=raw
    )
    error = _error(r, 422)
    assert error["details"]["fields"][0]["field"] == "body.request"
    assert "finite" in error["message"]
    assert any_store_client.get("/api/tasks", headers=AUTH).json() == []
    suggest = any_store_client.get(
        f"/api/tasks/distributed/suggest_machines?min_gpu_memory={number}", headers=AUTH
    )
    assert _error(suggest, 422)["details"]["fields"][0]["field"] == "query.min_gpu_memory"


def test_a_refused_statement_never_shows_its_parameters(postgres_url: str) -> None:
    store = open_store(postgres_url, migrate=False)
    try:
        with pytest.raises(DataError) as caught, store.session() as s:
            s.execute(text("SELECT :v"), {"v": "secret-parameter-value\x00"})
        assert "secret-parameter-value" not in str(caught.value)
    finally:
        store.close()


@pytest.mark.parametrize(("error", "status"), [(DataError, 422), (OperationalError, 500)])
def test_database_errors_are_logged_without_the_request_values(
    client: TestClient, caplog: pytest.LogCaptureFixture, error: type[DBAPIError], status: int
) -> None:
    def boom() -> None:
        orig = Exception('invalid input syntax for type integer: "secret-value"')
        raise error("SELECT CAST(%(v)s AS integer)", {"v": "secret-value"}, orig)

    client.app.add_api_route("/api/boom", boom)  # type: ignore[attr-defined]
    answering = TestClient(client.app, raise_server_exceptions=False)  # a 500, as served
    with caplog.at_level(logging.INFO, logger="corral.serve"):
        r = answering.get("/api/boom", headers=AUTH)
    assert r.status_code == status, r.text
    assert "secret-value" not in r.text
    assert "secret-value" not in caplog.text
    assert "/api/boom" in caplog.text


# -- size limits and bounds ----------------------------------------------------------------


def test_a_body_over_the_limit_is_413(tmp_path: Path) -> None:
    big = {"name": "big", "request": {"script": "x.py", "config": {"blob": "x" * 30_000}}}

    def chunks() -> Iterator[bytes]:  # no Content-Length: counted as it comes
        yield json.dumps(big).encode()

    for client in _client(f"sqlite:///{tmp_path / 'c.db'}", tmp_path, max_request_bytes=20_000):
        r = client.post("/api/tasks", headers=AUTH, json=big)
        assert _error(r, 413)["details"]["max_bytes"] == 20_000

        r = client.post(
            "/api/tasks",
            headers={**AUTH, "Content-Type": "application/json"},
            content=chunks(),
        )
        assert r.status_code == 413, r.text
        assert client.get("/api/tasks", headers=AUTH).json() == []
        small = {"name": "small", "request": {"script": "x.py", "config": {"blob": "x" * 100}}}
        assert client.post("/api/tasks", headers=AUTH, json=small).status_code == 201


def test_the_default_limit_refuses_a_5_mb_task(client: TestClient) -> None:
    big = {"name": "big", "request": {"script": "x.py", "args": ["x" * 60_000] * 90}}
    assert _error(client.post("/api/tasks", headers=AUTH, json=big), 413)


PLAN = "/api/network/distributed/plan"
MACHINES = "/api/network/machines"
TOO_MANY = [
    (MACHINES, "post", {"name": "m", "labels": {f"k{i}": "v" for i in range(65)}}, "body.labels"),
    (MACHINES, "post", {"name": "m", "labels": {"k" * 64: "v"}}, f"body.labels.{'k' * 64}.[key]"),
    ("/api/preferences", "put", {"preferred_machines": ["m"] * 5000}, "body.preferred_machines"),
    (PLAN, "post", {"script": "x", "args": ["a"] * 5000}, "body.args"),
    (PLAN, "post", {"script": "x", "env": {f"K{i}": "v" for i in range(1025)}}, "body.env"),
    (PLAN, "post", {"script": "x", "selected_machines": ["m" * 256]}, "body.selected_machines.0"),
]


@pytest.mark.parametrize(("route", "method", "body", "field"), TOO_MANY)
def test_lists_labels_and_preferences_are_bounded(
    client: TestClient, route: str, method: str, body: dict[str, Any], field: str
) -> None:
    r = getattr(client, method)(route, headers=AUTH, json=body)
    assert _error(r, 422)["details"]["fields"][0]["field"] == field


@pytest.mark.parametrize("field", ["host", "user"])
def test_a_machine_host_or_user_starting_with_a_dash_is_422(client: TestClient, field: str) -> None:
    body = {"name": "m1", field: "-oProxyCommand=touch /tmp/pwned"}
    r = client.post("/api/network/machines", headers=AUTH, json=body)
    assert _error(r, 422)["details"]["fields"][0]["field"] == f"body.{field}"
    assert client.get("/api/network/machines", headers=AUTH).json() == []


# -- security headers, /metrics ------------------------------------------------------------


def test_pages_and_api_answers_carry_the_security_headers(client: TestClient) -> None:
    answers = [
        client.get("/login"),
        client.get("/", follow_redirects=False),
        client.get("/api/jobs"),  # a 401
        client.get("/api/jobs", headers=AUTH),
        client.get("/static/corral.js"),
    ]
    for r in answers:
        assert r.headers["x-frame-options"] == "DENY", r.url
        assert r.headers["x-content-type-options"] == "nosniff"
        assert r.headers["referrer-policy"] == "no-referrer"
        csp = r.headers["content-security-policy"]
        assert csp == CSP
    assert "'unsafe-inline'" not in CSP and "frame-ancestors 'none'" in CSP
    assert re.search(r"script-src 'self'(;|$)", CSP)


def test_no_template_has_an_inline_script_or_style() -> None:
    for template in TEMPLATES.glob("*.html"):
        html = template.read_text()
        for tag in re.findall(r"<script\b[^>]*>", html):
            assert "src=" in tag, (template.name, tag)
        assert not re.search(r"<style\b|\sstyle=|\son[a-z]+=", html), template.name


def test_metrics_have_no_created_series(client: TestClient) -> None:
    client.get("/api/jobs", headers=AUTH)
    body = client.get("/metrics", headers=AUTH).text
    assert "corral_http_request_duration_seconds_count" in body
    assert "_created" not in body


# -- the command: bind, TLS proxy, token strength ------------------------------------------


def _serve(tmp_path: Path, *args: str, token: str = TOKEN) -> subprocess.CompletedProcess[str]:
    token_file = tmp_path / "token"
    token_file.write_text(token + "\n")
    token_file.chmod(0o600)
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "corral",
            "serve",
            "--port",
            str(free_port()),
            "--db",
            f"sqlite:///{tmp_path / 'corral.db'}",
            "--token-file",
            str(token_file),
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env={**os.environ, "COLUMNS": "200"},
    )


def test_a_public_bind_without_tls_is_refused(tmp_path: Path) -> None:
    proc = _serve(tmp_path, "--host", "0.0.0.0")
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "Traceback" not in out
    assert "--insecure-http" in out and "--host" in out


@pytest.mark.parametrize("token", ["abc", "x" * 80, "test-token-" + "x" * 20])
def test_a_weak_token_file_is_refused(tmp_path: Path, token: str) -> None:
    proc = _serve(tmp_path, "--print-token", token=token)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "too weak" in out and "--token-file" in out
    assert token not in out
    assert "Traceback" not in out


def test_behind_a_tls_proxy_the_session_cookie_is_secure(tmp_path: Path) -> None:
    args = ["--host", "0.0.0.0", "--insecure-http", "--forwarded-allow-ips", "127.0.0.1"]
    with live_server(tmp_path / "proxied", args=args) as server:
        forwarded = httpx.get(f"{server.url}/login", headers={"X-Forwarded-Proto": "https"})
        plain = httpx.get(f"{server.url}/login")
    assert "secure" in forwarded.headers["set-cookie"].lower()
    assert "secure" not in plain.headers["set-cookie"].lower()


def test_forwarded_headers_from_untrusted_addresses_are_ignored(tmp_path: Path) -> None:
    with live_server(tmp_path / "direct") as server:
        r = httpx.get(f"{server.url}/login", headers={"X-Forwarded-Proto": "https"})
    assert "secure" not in r.headers["set-cookie"].lower()
