"""Webhooks a hostile or careless URL cannot turn against the server, over real HTTP
(the app of ``corral serve`` with its background worker in a uvicorn thread): URLs
are checked when added (422 naming the field), shown with their credentials masked,
kept off link-local and metadata addresses unless an admin allows them (the host
resolved again at each delivery), and a delivery that raises is an attempt with a
backoff that ends ``failed``, never a hot loop of tracebacks."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from corral.store.models import Delivery, Webhook
from tests.e2e.test_notify import (
    SECRET,
    Api,
    Receiver,
    add_hook,
    deliveries,
    running_job,
    served,
    start_and_fail,
    until,
)
from tests.serverlib import TOKEN, free_port, live_server

ATTEMPTS = 3


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Api]:
    with served(tmp_path / "server", notify_attempts=ATTEMPTS) as served_api:
        yield served_api


def _refused(api: Api, url: str) -> dict[str, Any]:
    answer = api.client.post("/api/webhooks", json={"url": url, "secret": SECRET})
    assert answer.status_code == 422, (url, answer.text)
    error: dict[str, Any] = answer.json()["error"]
    fields = [f["field"] for f in error["details"].get("fields", [])]
    assert error["details"].get("field") == "url" or "body.url" in fields, (url, error)
    return error


def test_webhook_urls_are_checked_when_added_and_shown_masked(api: Api) -> None:
    for url in (
        "http://127.0.0.1:99999/x",  # no such port
        "http://127.0.0.1:0/x",
        "ftp://127.0.0.1/x",
        "http:///x",
        "http://127.0.0.1/x\x00y",
        "http://127.0.0.1/a\nb",
        "http://<img src=x>/",
        "http://" + "a" * 2100 + ".example/",
    ):
        _refused(api, url)
    assert api.client.get("/api/webhooks").json() == []

    url = "http://carol:hunter2@127.0.0.1:9/hook?token=sekret&api_key=k3y&team=ml&x=ghp_" + (
        "A1b2C3d4E5f6G7h8I9j0K1l2"
    )
    shown = add_hook(api, url)["url"]
    listed = api.client.get("/api/webhooks").json()
    for text in (shown, str(listed)):
        for secret in ("carol", "hunter2", "sekret", "k3y", "ghp_"):
            assert secret not in text, text
    assert shown == "http://***@127.0.0.1:9/hook?token=***&api_key=***&team=ml&x=***"
    assert listed[0]["url"] == shown


def test_link_local_and_metadata_are_refused_until_an_admin_allows_them(
    api: Api, tmp_path: Path
) -> None:
    assert api.client.get("/api/notify/addresses").json() == {"allow": ["loopback", "private"]}
    for url in (
        "http://169.254.169.254/latest/meta-data/",
        "http://[fe80::1]/x",
        "http://[::ffff:169.254.169.254]/x",
        "http://metadata.google.internal/computeMetadata/v1/",
        "http://0.0.0.0:80/x",
    ):
        message = _refused(api, url)["message"]
        assert "refuses" in message or "not an address" in message, (url, message)

    # an admin relaxes the rule: the metadata address may be added
    relaxed = {"allow": ["link_local", "loopback", "private"]}
    assert api.client.put("/api/notify/addresses", json=relaxed).json() == relaxed
    assert add_hook(api, "http://169.254.169.254/latest")["url"] == "http://169.254.169.254/latest"
    # a user may not change it
    made = api.client.post("/api/users", json={"name": "ursula", "role": "user"}).json()
    as_user = {"Authorization": f"Bearer {made['token']}"}
    put = api.client.put("/api/notify/addresses", json={"allow": []}, headers=as_user)
    assert put.status_code == 403

    # tightened again: a host *name* that resolves to a refused address is refused at
    # delivery (the rule is checked against what the name resolves to then)
    strict = {"allow": ["private"]}
    assert api.client.put("/api/notify/addresses", json=strict).json() == strict
    receiver = Receiver(free_port()).start()
    try:
        hook = add_hook(api, f"http://localhost:{receiver.port}/hook", ["finished"])
        _, events = running_job(api, tmp_path)
        start_and_fail(events)
        until(
            lambda: [d["state"] for d in deliveries(api, hook)] == ["failed"],
            f"the delivery did not end failed: {deliveries(api, hook)}",
        )
        (entry,) = deliveries(api, hook)
        assert "loopback" in entry["last_error"] and entry["attempts"] == ATTEMPTS
        assert receiver.got == []
    finally:
        receiver.stop()


def test_a_delivery_that_raises_is_an_attempt_with_backoff_and_ends_failed(
    api: Api, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # a target stored before URLs were checked (its port makes the socket layer raise
    # OverflowError, which is no httpx error)
    with api.svc.store.session() as s:
        s.add(
            Webhook(
                id="hook-old",
                kind="webhook",
                url="http://u:hunter2@127.0.0.1:99999/x?token=sekret",
                secret=SECRET,
                events=["host_lost", "finished", "failed"],  # one terminal: failed
                created=time.time(),
            )
        )
    caplog.set_level(logging.INFO, logger="corral")
    _, events = running_job(api, tmp_path)
    start_and_fail(events)
    hook = {"id": "hook-old"}
    until(
        lambda: sorted(d["state"] for d in deliveries(api, hook)) == ["failed", "failed"],
        f"the deliveries did not end failed: {deliveries(api, hook)}",
    )
    log = deliveries(api, hook)
    assert all(d["attempts"] == ATTEMPTS and d["last_error"] for d in log), log
    # once failed they stay failed: nothing is tried again
    with api.svc.store.session() as s:
        tries = sorted(d.attempts for d in s.query(Delivery).filter_by(hook_id="hook-old"))
    assert tries == [ATTEMPTS, ATTEMPTS]
    records = [r for r in caplog.records if "hook-old" in r.getMessage()]
    assert len(records) == 2 * ATTEMPTS, [r.getMessage() for r in records]  # one per attempt
    assert not any(r.exc_info for r in caplog.records if r.name.startswith("corral"))
    assert not any("hunter2" in r.getMessage() or "sekret" in r.getMessage() for r in records)
    shown = api.client.get("/api/webhooks").json()[0]["url"]
    assert "hunter2" not in shown and "sekret" not in shown


def test_an_admin_sets_the_address_rule_from_the_command_line(tmp_path: Path) -> None:
    with live_server(tmp_path / "srv") as server:
        env = {**os.environ, "CORRAL_TOKEN": TOKEN, "CORRAL_SERVER": server.url}

        def corral(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [sys.executable, "-m", "corral", "notify", "addresses", *args],
                capture_output=True,
                text=True,
                env=env,
                timeout=120,
            )

        shown = corral()
        assert shown.returncode == 0, shown.stderr
        assert "public, loopback, private" in shown.stdout
        relaxed = corral("--allow", "link-local", "--allow", "loopback")
        assert relaxed.returncode == 0, relaxed.stderr
        assert "public, link_local, loopback" in relaxed.stdout
        with server.client() as admin:
            assert admin.get("/api/notify/addresses").json() == {
                "allow": ["link_local", "loopback"]
            }
        strict = corral("--public-only", "--json")
        assert strict.returncode == 0 and json.loads(strict.stdout) == {"allow": []}
        wrong = corral("--allow", "everything")
        assert wrong.returncode != 0 and "unknown address kind everything" in wrong.stderr
        assert "Traceback" not in wrong.stderr


def test_an_apprise_url_to_a_refused_address_is_not_sent(api: Api, tmp_path: Path) -> None:
    pytest.importorskip("apprise")  # the [notify] extra (installed with [dev])
    literal = api.client.post(
        "/api/notifiers", json={"url": "json://169.254.169.254/latest", "events": ["failed"]}
    )
    assert literal.status_code == 422 and "link-local" in literal.json()["error"]["message"]
    strict = {"allow": ["private"]}
    assert api.client.put("/api/notify/addresses", json=strict).json() == strict
    receiver = Receiver(free_port()).start()
    try:
        # a name: resolved when sent, to a loopback address the rule now refuses
        added = api.client.post(
            "/api/notifiers",
            json={"url": f"json://localhost:{receiver.port}/chat", "events": ["failed"]},
        )
        assert added.status_code == 201, added.text
        notifier = added.json()
        _, events = running_job(api, tmp_path)
        start_and_fail(events)
        log = f"/api/notifiers/{notifier['id']}/deliveries"
        until(
            lambda: [d["state"] for d in api.client.get(log).json()] == ["failed"],
            f"the delivery did not end failed: {api.client.get(log).json()}",
        )
        (entry,) = api.client.get(log).json()
        assert "loopback" in entry["last_error"] and entry["attempts"] == ATTEMPTS
        assert receiver.got == [] and receiver.bad_signatures == 0  # nothing reached it
    finally:
        receiver.stop()
