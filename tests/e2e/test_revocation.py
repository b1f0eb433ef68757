"""A revoked grant stays revoked, over real HTTP (uvicorn, background tasks on): a web
session dies with the token it was made from (re-adding the name does not bring it
back), and an open event stream ends once its token or session is revoked."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from corral.sessions import LOGIN_COOKIE, SESSION_COOKIE
from tests.e2e.test_notify import Api, running_job, served, until
from tests.unit.test_service_jobs import write_events


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Api]:
    with served(tmp_path / "server") as served_api:
        yield served_api


def _add(api: Api, name: str, role: str) -> str:
    made = api.client.post("/api/users", json={"name": name, "role": role})
    assert made.status_code == 201, made.text
    return str(made.json()["token"])


def _login(api: Api, token: str) -> httpx.Client:
    """A browser-like client logged in with ``token`` (the session cookie only)."""
    web = httpx.Client(base_url=str(api.client.base_url), timeout=20)
    web.get("/login")
    nonce = web.cookies[LOGIN_COOKIE]
    done = web.post("/login", data={"token": token, "csrf_token": nonce, "next": "/"})
    assert done.status_code == 303 and SESSION_COOKIE in web.cookies, done.text
    return web


def test_a_session_dies_with_its_grant_and_a_re_added_name_needs_a_new_login(api: Api) -> None:
    carol = _add(api, "carol", "user")
    old = _login(api, carol)
    try:
        assert old.get("/api/me").json() == {"name": "carol", "role": "user"}
        assert api.client.delete("/api/users/carol").status_code == 200
        assert old.get("/api/me").status_code == 401

        # the name comes back as an admin: the old cookie is not theirs
        carol = _add(api, "carol", "admin")
        assert old.get("/api/me").status_code == 401
        assert old.get("/api/users").status_code == 401
        assert old.get("/", follow_redirects=False).status_code == 303  # to the login page
        with httpx.Client(base_url=str(api.client.base_url), timeout=20) as bearer:
            bearer.headers["Authorization"] = f"Bearer {carol}"
            assert bearer.get("/api/me").json() == {"name": "carol", "role": "admin"}
        new = _login(api, carol)
        try:
            assert new.get("/api/me").json() == {"name": "carol", "role": "admin"}
        finally:
            new.close()
    finally:
        old.close()


def _follow(client: httpx.Client, job_id: str, seen: list[dict[str, str]]) -> None:
    """Read the job's event stream until the server ends it; each frame's event kind."""
    timeout = httpx.Timeout(20, read=120)
    with client.stream("GET", f"/api/jobs/{job_id}/events", timeout=timeout) as answer:
        assert answer.status_code == 200, answer.read()
        kind = ""
        for line in answer.iter_lines():
            if line.startswith("event:"):
                kind = line.partition(":")[2].strip()
            elif line.startswith("data:"):
                seen.append({"event": kind, "data": line.partition(":")[2].strip()})
    seen.append({"event": "<end>", "data": ""})


def _log(events: Path, n: int) -> None:
    line: dict[str, Any] = {"kind": "message", "time": time.time(), "level": "info"}
    write_events(events, {**line, "text": f"step {n}"})


@pytest.mark.parametrize("via", ["session", "bearer"])
def test_an_open_event_stream_ends_when_its_grant_is_revoked(
    api: Api, tmp_path: Path, via: str
) -> None:
    job_id, events = running_job(api, tmp_path)
    now = time.time()
    write_events(
        events,
        {"kind": "state", "time": now, "old": "pending", "state": "starting", "attempt": 0},
        {"kind": "state", "time": now, "old": "starting", "state": "running", "attempt": 0},
    )
    dave = _add(api, "dave", "viewer")
    if via == "session":
        reader = _login(api, dave)
    else:
        reader = httpx.Client(base_url=str(api.client.base_url), timeout=20)
        reader.headers["Authorization"] = f"Bearer {dave}"
    seen: list[dict[str, str]] = []
    thread = threading.Thread(target=_follow, args=(reader, job_id, seen), daemon=True)
    try:
        thread.start()
        _log(events, 0)
        until(lambda: any("step 0" in e["data"] for e in seen), f"no first line: {seen}")
        assert api.client.delete("/api/users/dave").status_code == 200
        step = 1
        # the job goes on writing: the stream must end anyway (a job that never ends
        # would keep it open for ever)
        while thread.is_alive() and step < 1200:
            _log(events, step)
            step += 1
            thread.join(0.05)
        assert not thread.is_alive(), f"the stream outlived the revocation: {seen[-3:]}"
        assert seen[-2]["event"] == "revoked" and seen[-1]["event"] == "<end>", seen[-3:]
        # and it does not come back
        assert reader.get(f"/api/jobs/{job_id}/events").status_code == 401
    finally:
        reader.close()
        thread.join(5)
