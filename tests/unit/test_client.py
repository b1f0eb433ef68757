"""corral.client: the SSE parser, the mapping of the server's answers to the error
tree, the typed events, the token's safety; with httpx's mock transport at the seam."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from corral.client import Client, jobs, parse_sse, plain_http_warning
from corral.client.events import LaunchFailed, Lost, decode
from corral.client.jobs import follow
from corral.client.sse import SseEvent
from corral.errors import (
    Conflict,
    Forbidden,
    Invalid,
    NotFound,
    ServerFailed,
    ServerUnreachable,
    TokenRefused,
)
from corral.job.events import Checked, Finished, LogLines, Progress, StateChanged
from corral.job.states import JobState

SERVER = "http://127.0.0.1:8765"


def client_answering(handler: Any) -> Client:
    return Client(SERVER, "t0ken", transport=httpx.MockTransport(handler))


def error(status: int, kind: str, message: str, details: Any = None) -> httpx.Response:
    body = {"error": {"type": kind, "message": message, "details": details or {}}}
    return httpx.Response(status, json=body)


def test_parse_sse_fields_comments_and_multiline_data() -> None:
    lines = [": ping", "id: 5", "event: log", "data: {", "data: }", "", "data: x", "", ""]
    assert list(parse_sse(lines)) == [SseEvent("5", "log", "{\n}"), SseEvent("5", "message", "x")]


def test_parse_sse_ignores_an_event_without_data_and_an_id_with_nul() -> None:
    lines = ["event: state", "", "id: 1\0", "data: y", "", "id:7", "data:z", ""]
    assert list(parse_sse(lines)) == [SseEvent(None, "message", "y"), SseEvent("7", "message", "z")]


@pytest.mark.parametrize(
    ("status", "cls"),
    [(404, NotFound), (403, Forbidden), (409, Conflict), (422, Invalid), (500, ServerFailed)],
)
def test_an_error_answer_is_the_servers_error_class(status: int, cls: type[Exception]) -> None:
    details = {"needed": 2, "available": 0}
    client = client_answering(lambda _: error(status, "some_type", "it went wrong", details))
    with pytest.raises(cls) as info:
        client.call("GET", "/api/jobs/j")
    assert str(info.value) == "it went wrong"
    assert info.value.info == details  # type: ignore[attr-defined]
    assert "needed: 2" in info.value.details()  # type: ignore[attr-defined]


def test_401_is_token_refused_without_the_token() -> None:
    client = client_answering(lambda _: error(401, "unauthorized", "wrong token"))
    with pytest.raises(TokenRefused) as info:
        client.call("GET", "/api/jobs")
    assert str(info.value) == "the server refused the token (set CORRAL_TOKEN or --token-file)"
    assert "t0ken" not in str(info.value)


def test_an_answer_that_is_not_corrals_json_names_the_status() -> None:
    client = client_answering(lambda _: httpx.Response(502, text="<html>Bad gateway</html>"))
    with pytest.raises(ServerFailed) as info:
        client.call("GET", "/api/jobs")
    assert str(info.value) == f"HTTP 502 from {SERVER}: <html>Bad gateway</html>"


def test_a_transport_failure_is_server_unreachable() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("[Errno 111] Connection refused", request=request)

    with pytest.raises(ServerUnreachable) as info:
        client_answering(refuse).call("GET", "/api/jobs")
    assert str(info.value) == f"cannot reach corral serve at {SERVER}: Connection refused"


def test_the_token_is_sent_as_a_bearer_header() -> None:
    seen: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers["authorization"])
        return httpx.Response(200, json={"jobs": []})

    assert client_answering(answer).call("GET", "/api/jobs") == {"jobs": []}
    assert seen == ["Bearer t0ken"]


def sse(kind: str, **data: Any) -> SseEvent:
    return SseEvent("1", kind, json.dumps({"kind": kind, **data}))


def test_events_decode_into_the_engines_typed_events() -> None:
    log = decode(sse("log", host="n1", rank=0, text="hello\n", time=1.0), "j")
    assert log == LogLines(job_id="j", host="n1", rank=0, data=b"hello\n", time=1.0)
    state = decode(sse("state", old="pending", state="running", attempt=0, time=2.0), "j")
    assert isinstance(state, StateChanged) and state.state is JobState.RUNNING
    progress = decode(sse("progress", host="n1", rank=1, step=3, total=9, time=3.0), "j")
    assert isinstance(progress, Progress) and (progress.step, progress.total) == (3, 9)
    checked = decode(sse("checked", blocking=True, report={"checks": []}), "j")
    assert isinstance(checked, Checked) and checked.blocking
    finished = decode(sse("finished", state="failed", exit_code=3, result={}), "j")
    assert isinstance(finished, Finished) and finished.exit_code == 3
    failed = decode(sse("error", message="script missing", exit_code=2), "j")
    assert isinstance(failed, LaunchFailed) and failed.exit_code == 2
    lost = decode(sse("lost", reason="supervisor gone"), "j")
    assert isinstance(lost, Lost) and lost.exit_code == 255


def test_unknown_or_broken_events_are_skipped() -> None:
    assert decode(sse("from_a_newer_server", x=1), "j") is None
    assert decode(sse("state", old="pending", state="no-such-state"), "j") is None
    assert decode(SseEvent("1", "log", "not json"), "j") is None
    assert decode(SseEvent("1", "log", "[1, 2]"), "j") is None


def test_follow_waits_while_queued_then_streams_to_the_last_event(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    statuses = iter(
        [
            {"job_id": "j", "status": "queued", "reason": "waiting for 1 machine: a busy"},
            {"job_id": "j", "status": "queued", "reason": "waiting for 1 machine: a busy"},
            {"job_id": "j", "status": "pending", "reason": ""},
        ]
    )
    stream = "".join(
        f"id: {i}\nevent: {kind}\ndata: {json.dumps(data)}\n\n"
        for i, (kind, data) in enumerate(
            [
                ("log", {"kind": "log", "host": "a", "rank": 0, "text": "x\n"}),
                (
                    "finished",
                    {"kind": "finished", "state": "succeeded", "exit_code": 0, "result": {}},
                ),
                ("log", {"kind": "log", "host": "a", "rank": 0, "text": "after\n"}),
            ]
        )
    )

    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/api/jobs/j":
            return httpx.Response(200, json=next(statuses))
        assert request.url.path == "/api/jobs/j/events"
        return httpx.Response(200, text=stream, headers={"content-type": "text/event-stream"})

    waits: list[str] = []
    monkeypatch.setattr(jobs, "POLL", 0.0)
    events = list(follow(client_answering(answer), "j", lambda s: waits.append(s["reason"])))
    assert waits == ["waiting for 1 machine: a busy"]  # once per reason
    assert [type(e) for e in events] == [LogLines, Finished]


def test_plain_http_to_another_machine_warns() -> None:
    assert plain_http_warning("http://127.0.0.1:8765") is None
    assert plain_http_warning("http://localhost:8765") is None
    assert plain_http_warning("http://[::1]:8765") is None
    assert plain_http_warning("https://gpu-server:8765") is None
    warning = plain_http_warning("http://gpu-server:8765")
    assert warning is not None and "plain http to gpu-server" in warning


def test_a_bad_server_url_names_the_option() -> None:
    with pytest.raises(Exception, match=r"--server: 'ftp://x' is not an http\(s\) URL"):
        Client("ftp://x", "t")
