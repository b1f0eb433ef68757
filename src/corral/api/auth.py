"""Tokens and roles: the server's token (made on first start into a 0600 file, the
token of the user ``admin``), every user's token checked on every request, and the
dependencies that give a route its caller and refuse a role (403).

Every route except ``/healthz`` needs ``Authorization: Bearer <token>`` (any active
user's). A missing, wrong or revoked token is a 401 that says nothing about the
resource asked for; a role that may not do what was asked is a 403 naming it.
"""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPBearer

from corral.client.http import CLIENT_AGENT
from corral.errors import Forbidden
from corral.service.users import Principal, Role
from corral.sessions import SESSION_COOKIE

OPEN_PATHS = frozenset({"/healthz", "/login"})
PUBLIC_PREFIXES = ("/static/",)  # the web page's own JS/CSS: nothing secret
bearer = HTTPBearer(auto_error=False, description="The token of `corral serve --print-token`.")
"""Declared on every router so the OpenAPI schema documents the scheme; the check
itself is :class:`TokenMiddleware` (it also covers the schema and docs routes)."""


def token_matches(header: str | None, token: str) -> bool:
    """Whether an ``Authorization`` header carries ``token`` (constant time)."""
    if not header:
        return False
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(value.strip().encode(), token.encode())


def bearer_value(header: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header (None: no such header)."""
    if not header:
        return None
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "bearer":
        return None
    return value.strip() or None


def caller(request: Request) -> Principal:
    """Who made the request (a dependency; the middleware authenticated them)."""
    found = request.state.principal if hasattr(request.state, "principal") else None
    if not isinstance(found, Principal):  # an open path: nobody authenticated
        raise Forbidden("this route needs a user's token")
    return found


Caller = Annotated[Principal, Depends(caller)]


def credential_alive(request: Request) -> bool:
    """Whether the token or web session ``request`` was let in with still holds (its
    grant not revoked, the session not logged out): a long answer, a live stream, asks
    again while it runs, so it ends with the grant (blocking: run it in a thread)."""
    grant = getattr(request.state, "grant", None)
    if not isinstance(grant, str) or not grant:
        return False
    if getattr(request.state, "via", None) == "session":
        session = request.app.state.sessions.get(request.cookies.get(SESSION_COOKIE))
        if session is None or session.grant != grant:
            return False
    return request.app.state.services.users.by_grant(grant) is not None


def require_admin(request: Request) -> None:
    """A dependency of the routes only an admin may call (403 for anyone else)."""
    who = caller(request)
    what = f"{request.method} {request.url.path}"
    who.require(Role.ADMIN, what)


def require_user(request: Request) -> None:
    """A dependency of the routes that change state (403 for a viewer)."""
    caller(request).require(Role.USER, f"{request.method} {request.url.path}")


def acting(request: Request) -> str:
    """Who made the request and from where, as a job's reason names them:
    ``alice (web)`` (a web session), ``alice (cli)`` (corral's client), ``alice (api)``."""
    who = caller(request)
    if getattr(request.state, "via", None) == "session":
        where = "web"
    elif request.headers.get("user-agent", "").startswith(CLIENT_AGENT):
        where = "cli"
    else:
        where = "api"
    return f"{who.name} ({where})"
