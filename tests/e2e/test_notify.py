"""Notifications over real HTTP: the app of ``corral serve`` (background tasks on) in a
uvicorn thread, a job whose supervisor is replaced at the seam (its events written to
its events file as a supervisor would), and local receivers on 127.0.0.1 that check
the signature. A receiver down for a while gets every event after the retries; a
receiver that never answers holds up neither the API nor the other targets."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from corral.api.app import create_app
from corral.api.services import Services
from corral.notify import SIGNATURE_HEADER, verify
from corral.service.eventlog import EVENTS_FILE
from corral.service.models import DispatchIn
from corral.service.settings import ServerSettings
from corral.service.users import UserIn
from corral.store import open_store
from tests.serverlib import free_port
from tests.unit.test_service_jobs import Spawned, add_machines, job_request, write_events
from tests.unit.test_service_planner import machine

TOKEN = "notify-test-token-" + "Zq8wX3vB6nM1kL4pR7tY9uE2"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
SECRET = "hook-secret-" + "Gf5Hj8Kl2Mn4"
PUBLIC = "https://corral.example.org"


@dataclass
class Receiver:
    """A local HTTP receiver: keeps what it got, checks each signature; ``hold`` makes
    it never answer until set (a hung receiver)."""

    port: int
    secret: str = SECRET
    got: list[dict[str, Any]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    bad_signatures: int = 0
    hold: threading.Event | None = None
    server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    def start(self) -> Receiver:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if receiver.hold is not None:
                    receiver.hold.wait(30)
                if not verify(receiver.secret, body, self.headers.get(SIGNATURE_HEADER)):
                    receiver.bad_signatures += 1
                    self.send_response(401)
                    self.end_headers()
                    return
                receiver.got.append(json.loads(body))
                receiver.headers.append(dict(self.headers))
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()

    def events(self) -> list[str]:
        return [str(p["event"]) for p in self.got]


@dataclass
class Api:
    client: httpx.Client
    svc: Services
    spawned: Spawned
    root: Path


@contextmanager
def served(root: Path, **overrides: Any) -> Iterator[Api]:
    """The app (background tasks on) over a SQLite store in ``root``; ``overrides``:
    server settings besides the tests' quick retries."""
    root.mkdir(parents=True, exist_ok=True)
    store = open_store(f"sqlite:///{root / 'corral.db'}")
    quick: dict[str, Any] = {
        "notify_backoff": 0.05,
        "notify_max_backoff": 0.2,
        "notify_timeout": 30.0,
        "notify_attempts": 1000,
    }
    settings = ServerSettings(
        run_dir=root / "runs",
        ingest_interval=0.05,
        schedule_interval=0.2,
        health_interval=0,
        public_url=PUBLIC,
        **{**quick, **overrides},
    )
    svc = Services.build(store, settings)
    spawned = Spawned()
    svc.jobs.dispatcher.spawn = spawned
    port = free_port()
    config = uvicorn.Config(
        create_app(svc, TOKEN), host="127.0.0.1", port=port, log_level="warning", lifespan="on"
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="uvicorn", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", headers=AUTH, timeout=20) as c:
            yield Api(c, svc, spawned, root)
    finally:
        server.should_exit = True
        thread.join(30)
        store.close()


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Api]:
    with served(tmp_path / "server") as served_api:
        yield served_api


def deliveries(api: Api, hook: dict[str, Any]) -> list[dict[str, Any]]:
    """The delivery log of ``hook``, as the API lists it."""
    answer: list[dict[str, Any]] = api.client.get(f"/api/webhooks/{hook['id']}/deliveries").json()
    return answer


def until(what: Callable[[], bool], message: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not what():
        assert time.monotonic() < deadline, message
        time.sleep(0.05)


def running_job(api: Api, tmp_path: Path, **extra: object) -> tuple[str, Path]:
    """A dispatched job (its supervisor at the seam) and its events file."""
    add_machines(api.svc.store, machine("a", local=True), machine("b", local=True))
    job_id = api.svc.jobs.plan(job_request(tmp_path, **extra)).job_id
    api.svc.jobs.dispatch(DispatchIn(job_id=job_id))
    return job_id, Path(api.svc.jobs.row(job_id).run_dir) / EVENTS_FILE


def start_and_fail(events: Path) -> None:
    now = time.time()
    write_events(
        events,
        {"kind": "state", "time": now, "old": "pending", "state": "starting", "attempt": 0},
        {"kind": "state", "time": now, "old": "starting", "state": "running", "attempt": 0},
        {"kind": "node", "time": now, "host": "b", "state": "lost", "detail": "no heartbeat"},
        {"kind": "state", "time": now, "old": "running", "state": "stopping", "attempt": 0},
        {
            "kind": "finished",
            "time": now,
            "state": "failed",
            "exit_code": 255,
            "result": {
                "reason": "failure",
                "failures": [{"host": "b", "rank": 1, "message": "lost host b: no heartbeat"}],
            },
        },
    )


def add_hook(api: Api, url: str, events: list[str] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"url": url, "secret": SECRET}
    if events is not None:
        body["events"] = events
    answer = api.client.post("/api/webhooks", json=body)
    assert answer.status_code == 201, answer.text
    hook: dict[str, Any] = answer.json()
    return hook


def test_a_receiver_down_for_a_while_gets_every_event_signed_after_the_retries(
    api: Api, tmp_path: Path
) -> None:
    """In order, one terminal event (``failed``, not ``finished`` too), the job named."""
    receiver = Receiver(free_port())  # nothing listens there yet: connection refused
    hook = add_hook(api, receiver.url)
    job_id, events = running_job(api, tmp_path, name="resnet-a")
    start_and_fail(events)

    def retried() -> bool:
        log = deliveries(api, hook)  # newest first: the job's later events wait their turn
        return (
            len(log) == 3
            and log[-1]["attempts"] >= 2
            and bool(log[-1]["last_error"])
            and all(d["attempts"] == 0 for d in log[:-1])
        )

    until(retried, "the first delivery was not retried while the receiver was down")
    # the server goes on while the receiver is down: the job is ingested, the API answers
    assert api.client.get(f"/api/jobs/{job_id}").json()["status"] == "failed"
    pending = api.client.get("/api/webhooks").json()[0]["pending"]
    assert pending == 3
    receiver.start()
    try:
        until(lambda: len(receiver.got) == 3, f"delivered: {receiver.events()}")

        # the receiver keeps a body before it answers; the server records a delivery
        # once the answer is back, so its log catches up a moment after the receiver
        until(
            lambda: all(d["state"] == "delivered" for d in deliveries(api, hook)),
            "the deliveries were not recorded as delivered",
        )
        log = deliveries(api, hook)
    finally:
        receiver.stop()
    assert receiver.bad_signatures == 0
    assert receiver.events() == ["started", "host_lost", "failed"]
    by_event = {p["event"]: p for p in receiver.got}
    assert by_event["failed"]["data"]["state"] == "failed"
    assert by_event["failed"]["data"]["root_cause"]["message"] == "lost host b: no heartbeat"
    assert (
        by_event["failed"]["text"] == f"job resnet-a ({job_id}) failed: lost host b: no heartbeat"
    )
    assert by_event["host_lost"]["data"]["host"] == "b"
    assert by_event["started"]["job"] == {
        "id": job_id,
        "name": "resnet-a",
        "state": by_event["started"]["job"]["state"],
        "owner": by_event["started"]["job"]["owner"],
        "url": f"{PUBLIC}/jobs/{job_id}",
    }
    assert {h["X-Corral-Event"] for h in receiver.headers} == set(by_event)
    assert all(d["state"] == "delivered" and d["status_code"] == 204 for d in log)
    assert log[-1]["attempts"] >= 3


def test_a_hung_receiver_holds_up_neither_the_api_nor_the_other_targets(
    api: Api, tmp_path: Path
) -> None:
    hung = Receiver(free_port(), hold=threading.Event()).start()
    fast = Receiver(free_port()).start()
    try:
        add_hook(api, hung.url)
        add_hook(api, fast.url, ["finished"])
        _, events = running_job(api, tmp_path)
        start_and_fail(events)
        until(lambda: fast.events() == ["finished"], f"fast receiver got {fast.events()}")
        assert hung.got == []  # still held: its deliveries are in flight
        assert api.client.get("/api/webhooks").status_code == 200
        assert hung.hold is not None
        hung.hold.set()
        until(lambda: len(hung.got) == 3, f"hung receiver got {hung.events()}")
        assert hung.events() == ["started", "host_lost", "failed"]
    finally:
        if hung.hold is not None:
            hung.hold.set()
        hung.stop()
        fast.stop()


def test_the_secret_is_never_returned_nor_logged(
    api: Api, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("DEBUG")
    receiver = Receiver(free_port(), secret="another-secret-entirely")
    hook = add_hook(api, receiver.url)
    listed = api.client.get("/api/webhooks")
    removed = api.client.delete(f"/api/webhooks/{hook['id']}")
    for answer in (listed, removed):
        assert answer.status_code == 200
        assert SECRET not in answer.text
    assert hook["has_secret"] is True and "secret" not in hook
    assert SECRET not in caplog.text
    assert api.client.get("/api/webhooks").json() == []
    assert api.client.delete(f"/api/webhooks/{hook['id']}").status_code == 404


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"url": "ftp://x/y", "secret": SECRET}, "url"),
        ({"url": "http://127.0.0.1:9/h", "secret": "short"}, "secret"),
        ({"url": "http://127.0.0.1:9/h", "secret": SECRET, "events": ["exploded"]}, "events"),
        ({"url": "http://127.0.0.1:9/h", "secret": SECRET, "events": []}, "events"),
    ],
)
def test_a_bad_webhook_is_a_422_naming_the_field(
    api: Api, body: dict[str, Any], field: str
) -> None:
    answer = api.client.post("/api/webhooks", json=body)
    assert answer.status_code == 422
    assert field in answer.text


def test_only_an_admin_manages_notifications(api: Api) -> None:
    bob = api.svc.users.add(UserIn(name="bob", role="user"), by="admin")
    as_bob = {"Authorization": f"Bearer {bob.token}"}
    for method, path in (
        ("GET", "/api/webhooks"),
        ("POST", "/api/webhooks"),
        ("GET", "/api/notifiers"),
        ("DELETE", "/api/webhooks/hook-1"),
    ):
        body = {"url": "http://127.0.0.1:9/h", "secret": SECRET}
        answer = api.client.request(method, path, headers=as_bob, json=body)
        assert answer.status_code == 403, (method, path, answer.text)
        assert answer.json()["error"]["type"] == "forbidden"


def test_chat_through_apprise_gets_one_line_with_the_job_link(api: Api, tmp_path: Path) -> None:
    pytest.importorskip("apprise")  # the [notify] extra (installed with [dev])
    got: list[dict[str, Any]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            got.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"json://user:chat-password-123@127.0.0.1:{server.server_address[1]}/chat"
        answer = api.client.post("/api/notifiers", json={"url": url, "events": ["failed"]})
        assert answer.status_code == 201, answer.text
        notifier = answer.json()
        assert "chat-password-123" not in answer.text
        assert "chat-password-123" not in api.client.get("/api/notifiers").text
        job_id, events = running_job(api, tmp_path)
        start_and_fail(events)
        until(lambda: len(got) == 1, "apprise did not deliver")
        notifier_log = f"/api/notifiers/{notifier['id']}/deliveries"
        # recorded once the receiver's answer is back, a moment after it kept the body
        until(
            lambda: [d["state"] for d in api.client.get(notifier_log).json()] == ["delivered"],
            "the delivery was not recorded as delivered",
        )
        log = api.client.get(notifier_log).json()
    finally:
        server.shutdown()
        server.server_close()
    message = got[0]["message"]
    assert message == (f"job {job_id} failed: lost host b: no heartbeat {PUBLIC}/jobs/{job_id}")
    assert "\n" not in message
    assert got[0]["title"] == "corral: failed"
    assert [d["state"] for d in log] == ["delivered"]


def test_an_unknown_apprise_url_is_a_422(api: Api) -> None:
    pytest.importorskip("apprise")
    answer = api.client.post("/api/notifiers", json={"url": "nosuchservice://x"})
    assert answer.status_code == 422
    assert "apprise" in answer.json()["error"]["message"]
