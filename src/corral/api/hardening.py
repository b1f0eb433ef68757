"""What every request and response of ``corral serve`` goes through besides the token:
a request-size limit (413), no NUL in a path or query parameter (422 naming it),
security headers on every response, and the refusal of the state-changing GET
routes to a browser session (they stay for bearer-token clients).
"""

from __future__ import annotations

from urllib.parse import parse_qsl

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from corral.api import errors
from corral.errors import Forbidden

#: The default request-size limit (``corral serve --max-request-bytes``): a job
#: request with 65536 workload weights still fits.
MAX_REQUEST_BYTES = 4 * 1024 * 1024
#: The pages' policy: their own scripts and styles only (no inline script), nothing
#: from elsewhere, never framed.
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; "
    "frame-ancestors 'none'"
)
SECURITY_HEADERS: tuple[tuple[bytes, bytes], ...] = (
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
)
#: The API docs page (corral.api.docs, Swagger UI from this server): its scripts come
#: from this origin only, as the pages'; Swagger UI styles its elements inline.
DOCS_CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; connect-src 'self'; object-src 'none'; base-uri 'none'; "
    "form-action 'self'; frame-ancestors 'none'"
)
#: Paths whose answers a browser or proxy may keep (the pages' own scripts and styles);
#: every other answer is ``Cache-Control: no-store`` (they carry users' data, and some
#: a new token or session).
_CACHEABLE = ("/static/", "/docs/assets/")


class SecurityHeaders:
    """Adds the CSP, ``X-Frame-Options``, ``nosniff`` and ``Referrer-Policy`` to
    every HTTP response (the API's JSON included: nothing of it is framed or sniffed),
    and ``Cache-Control: no-store`` to every one but the static files' (an answer
    carrying a new token, a session cookie or users' data is never stored)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        extra = list(SECURITY_HEADERS)
        path = str(scope["path"])
        policy = DOCS_CSP if path == "/docs" else CSP
        extra.append((b"content-security-policy", policy.encode()))
        if not path.startswith(_CACHEABLE):
            extra.append((b"cache-control", b"no-store"))

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                names = {k.lower() for k, _ in message.get("headers", [])}
                message["headers"] = [
                    *message.get("headers", []),
                    *((k, v) for k, v in extra if k not in names),
                ]
            await send(message)

        await self.app(scope, receive, with_headers)


class InputGuard:
    """Refuses a body over ``max_bytes`` (413) and a NUL character in the path or the
    query string (422 naming the parameter), before any route sees the request.

    The body is read here (up to the limit) and handed on whole, so a chunked upload
    without ``Content-Length`` is limited too.
    """

    def __init__(self, app: ASGIApp, max_bytes: int = MAX_REQUEST_BYTES) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        field = _nul_field(scope)
        if field is not None:
            text = f"{field}: must not contain a NUL character"
            response = errors.error_response(
                422, "invalid", text, {"fields": [{"field": field, "message": text}]}
            )
            await response(scope, receive, send)
            return
        declared = dict(scope.get("headers", [])).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self._too_large(scope, receive, send)
            return
        if scope["method"] in ("GET", "HEAD", "OPTIONS") and declared is None:
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                await self._too_large(scope, receive, send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _too_large(self, scope: Scope, receive: Receive, send: Send) -> None:
        message = (
            f"request body larger than {self.max_bytes} bytes (corral serve --max-request-bytes)"
        )
        response = errors.error_response(
            413,
            "too_large",
            message,
            {"max_bytes": self.max_bytes},
            headers={"Connection": "close"},
        )
        await response(scope, receive, send)


def _nul_field(scope: Scope) -> str | None:
    """The query parameter holding a NUL (``query.NAME``), or ``path`` for a NUL in a
    path outside the API (a route's own parameter is named by :func:`no_nul_in_path`);
    None when there is none."""
    query = scope.get("query_string", b"").decode("latin-1")
    if "%00" in query or "\x00" in query:
        for key, value in parse_qsl(query, keep_blank_values=True):
            if "\x00" in key or "\x00" in value:
                name = key.replace("\x00", "")
                return f"query.{name}" if name else "query"
    path = str(scope.get("path", ""))
    if "\x00" in path and not path.startswith("/api/"):
        return "path"
    return None


def no_nul_in_path(request: Request) -> None:
    """An app-wide dependency: a NUL in a route's path parameter is a 422 naming it
    (the file system and PostgreSQL refuse it: it would be a 500 further in)."""
    for name, value in request.path_params.items():
        if "\x00" in str(value):
            raise RequestValidationError(
                [
                    {
                        "loc": ("path", name),
                        "msg": "must not contain a NUL character",
                        "type": "value_error",
                    }
                ]
            )


def bearer_only(request: Request) -> None:
    """A dependency of the GET routes that change state (the seed's queue routes): a
    browser session cannot call them (its CSRF check trusts GET), only a bearer
    token; the page uses their POST twins."""
    if getattr(request.state, "via", None) != "bearer":
        raise Forbidden(
            "this GET route changes state: it needs the bearer token "
            "(a web session uses POST with its CSRF token)",
            details={"method": "POST"},
        )
