"""The HTTP client of ``corral serve``: one request, its JSON answer or corral's error.

An error answer becomes the server's own error class (a 409 is a
:class:`~corral.errors.Conflict` on both sides, with the server's details); the HTTP
status is mapped here, not in :mod:`corral.errors`. A transport failure is a
:class:`~corral.errors.ServerUnreachable`, a refused token a
:class:`~corral.errors.TokenRefused`.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote, urlsplit

import httpx

from corral import __version__
from corral.client.sse import SseEvent, parse_sse
from corral.errors import (
    ConfigError,
    Conflict,
    CorralError,
    Forbidden,
    Invalid,
    NotFound,
    ServerFailed,
    ServerUnreachable,
    ServiceError,
    TokenRefused,
    TooMany,
)

DEFAULT_SERVER = "http://127.0.0.1:8765"
CLIENT_AGENT = "corral/"
"""How this client's ``User-Agent`` starts: the server names a stop made with it
``alice (cli)``."""
REQUEST_TIMEOUT = 30.0
STREAM_READ_TIMEOUT = 60.0  # the server pings every 15 s
RECONNECT_FOR = 60.0  # seconds a stream keeps trying to reconnect before giving up
REFUSALS: dict[int, type[ServiceError]] = {
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    422: Invalid,
    429: TooMany,
}
"""The error class of each HTTP status the server refuses a request with."""


def error_of(status: int, body: Any, *, server: str, text: str = "") -> CorralError:
    """The error an answer with HTTP ``status`` and JSON ``body`` (``{"error": {"type",
    "message", "details"}}``; ``text`` when it is not JSON) stands for."""
    if status == 401:
        return TokenRefused(server=server)
    try:
        error = body["error"]
        message, kind, info = str(error["message"]), str(error["type"]), error.get("details")
    except (KeyError, TypeError):
        text = " ".join(text.split())[:200]
        message = f"HTTP {status} from {server}: {text or 'no body'}"
        kind, info = "http_error", None
    details = info if isinstance(info, dict) else ({"details": info} if info else {})
    refusal = REFUSALS.get(status)
    if refusal is not None:
        return refusal(message, details=details)
    return ServerFailed(message, kind=kind, details=details)


def unreachable(server: str, exc: Exception) -> ServerUnreachable:
    """The one-line error for a transport failure."""
    reason = re.sub(r"^\[Errno -?\d+\] ", "", str(exc)) or type(exc).__name__
    if isinstance(exc, httpx.TimeoutException):
        reason = f"no answer within {REQUEST_TIMEOUT:g} s"
    return ServerUnreachable(f"cannot reach corral serve at {server}: {reason}", server=server)


def segment(value: str) -> str:
    """``value`` as one path segment (a job id or machine name with a ``/`` stays one)."""
    return quote(value, safe="")


class Client:
    """A synchronous client of ``corral serve`` with its errors in corral's tree.

    ``transport`` replaces the network (tests use :class:`httpx.MockTransport`)."""

    def __init__(
        self,
        server: str,
        token: str,
        *,
        timeout: float = REQUEST_TIMEOUT,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        server = server.rstrip("/")
        parts = urlsplit(server)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError(f"{server!r} is not an http(s) URL", option="--server")
        self.server = server
        try:
            self.http = httpx.Client(
                base_url=server,
                headers={
                    "Authorization": f"Bearer {token}",
                    "User-Agent": f"{CLIENT_AGENT}{__version__}",  # a stop names the CLI
                },
                timeout=timeout,
                transport=transport,
            )
        except httpx.InvalidURL as exc:
            raise ConfigError(f"{server!r}: {exc}", option="--server") from exc

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the connections."""
        self.http.close()

    def check(self, response: httpx.Response) -> None:
        """Raise the error a non-2xx answer stands for (its body must have been read)."""
        if response.status_code < 400:
            return
        try:
            body = response.json()
        except ValueError:
            body = None
        raise error_of(response.status_code, body, server=self.server, text=response.text)

    def call(self, method: str, path: str, **kwargs: Any) -> Any:
        """One request; its JSON answer."""
        try:
            response = self.http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise unreachable(self.server, exc) from exc
        self.check(response)
        return response.json()

    def events(self, job_id: str, last_id: str | None = None) -> Iterator[SseEvent]:
        """The job's events from after ``last_id``, live, until the server ends the
        stream; a dropped connection is resumed from the last event seen (for up to
        :data:`RECONNECT_FOR` seconds of failures)."""
        failing_since: float | None = None
        delay = 0.25
        while True:
            headers = {"Last-Event-ID": last_id} if last_id else {}
            timeout = httpx.Timeout(REQUEST_TIMEOUT, read=STREAM_READ_TIMEOUT)
            try:
                with self.http.stream(
                    "GET", f"/api/jobs/{segment(job_id)}/events", headers=headers, timeout=timeout
                ) as response:
                    if response.status_code >= 400:
                        response.read()
                        self.check(response)
                    failing_since, delay = None, 0.25
                    for event in parse_sse(response.iter_lines()):
                        last_id = event.id or last_id
                        yield event
                return
            except httpx.HTTPError as exc:
                now = time.monotonic()
                failing_since = failing_since or now
                if now - failing_since > RECONNECT_FOR:
                    raise unreachable(self.server, exc) from exc
                time.sleep(delay)
                delay = min(delay * 2, 5.0)
