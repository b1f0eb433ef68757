"""Tokens and roles: the server's token (made on first start into a 0600 file, the
token of the user ``admin``), every user's token checked on every request, and the
dependencies that give a route its caller and refuse a role (403).

Every route except ``/healthz`` needs ``Authorization: Bearer <token>`` (any active
user's). A missing, wrong or revoked token is a 401 that says nothing about the
resource asked for; a role that may not do what was asked is a 403 naming it.
"""

from __future__ import annotations

import hmac
import math
import os
import secrets
import string
from pathlib import Path
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPBearer

from corral.client.http import CLIENT_AGENT
from corral.errors import ConfigError, Forbidden
from corral.private import private_dir, write_private
from corral.service.users import Principal, Role
from corral.sessions import SESSION_COOKIE

OPEN_PATHS = frozenset({"/healthz", "/login"})
PUBLIC_PREFIXES = ("/static/",)  # the web page's own JS/CSS: nothing secret
#: The least a token must carry: as much as the one corral makes (32 random bytes).
MIN_TOKEN_BITS = 256
#: Fewer distinct characters than this is a pattern, whatever its length.
MIN_DISTINCT = 10
_ALPHABETS = (
    (16, frozenset(string.hexdigits.lower())),
    (16, frozenset(string.hexdigits.upper())),
    (64, frozenset(string.ascii_letters + string.digits + "+/=-_")),
    (95, frozenset(string.printable) - frozenset("\t\n\r\x0b\x0c")),
)

bearer = HTTPBearer(auto_error=False, description="The token of `corral serve --print-token`.")
"""Declared on every router so the OpenAPI schema documents the scheme; the check
itself is :class:`TokenMiddleware` (it also covers the schema and docs routes)."""


def load_or_create_token(path: Path) -> str:
    """The token in ``path``; a new random one written there (0600) when missing."""
    try:
        token = path.read_text().strip()
        if token:
            if path.stat().st_mode & 0o077:
                os.chmod(path, 0o600)
            _check_strength(token, path)
            return token
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise ConfigError(
            f"cannot read the token file {path}: {exc.strerror}", option="--token-file"
        ) from exc
    token = secrets.token_urlsafe(32)
    try:
        private_dir(path.parent)
        write_private(path, token + "\n")
    except OSError as exc:
        raise ConfigError(
            f"cannot write the token file {path}: {exc.strerror}", option="--token-file"
        ) from exc
    return token


def token_bits(token: str) -> float:
    """An estimate of a token's entropy in bits: its length times log2 of the smallest
    usual token alphabet holding all its characters (hex 16, base64 64, printable
    ASCII 95, else 256); a token of fewer than :data:`MIN_DISTINCT` distinct
    characters is a pattern and gets log2(distinct) bits per character."""
    chars = set(token)
    if not chars:
        return 0.0
    alphabet = next((size for size, allowed in _ALPHABETS if chars <= allowed), 256)
    if len(chars) < MIN_DISTINCT:
        alphabet = len(chars)
    return len(token) * math.log2(alphabet) if alphabet > 1 else 0.0


def _check_strength(token: str, path: Path) -> None:
    bits = token_bits(token)
    if bits < MIN_TOKEN_BITS:
        raise ConfigError(
            f"the token in {path} is too weak (about {bits:.0f} bits; at least "
            f"{MIN_TOKEN_BITS}, 32 random bytes, are needed): delete the file to have "
            "corral make one, or write e.g. "
            "`python3 -c 'import secrets; print(secrets.token_urlsafe(32))'`",
            option="--token-file",
        )


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
