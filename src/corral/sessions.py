"""Browser sessions of the web page: the token is typed once on the login page and
exchanged for an HttpOnly, SameSite=Strict session cookie; every state-changing
request made with that cookie must carry the session's CSRF token.

Sessions live in the server's memory (a restart asks for the token again);
logout ends one. A session is bound to the grant it was made from (the stored hash
of the token typed), not to a user's name: revoking the user, or giving the name a
new token, ends it for good. The API's own clients keep using
``Authorization: Bearer``.
"""

from __future__ import annotations

import hmac
import secrets
import time
from dataclasses import dataclass

SESSION_COOKIE = "corral_session"
LOGIN_COOKIE = "corral_login"  # the login form's CSRF (double submit)
CSRF_HEADER = "x-csrf-token"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
SESSION_TTL_S = 12 * 3600.0


@dataclass
class Session:
    """One logged-in browser."""

    csrf: str
    created: float
    user: str  # whose token was typed (their role is looked up per request)
    grant: str  # the stored hash of that token: the session lives while it does


class Sessions:
    """The live sessions, by their secret cookie value."""

    def __init__(self, ttl_s: float = SESSION_TTL_S) -> None:
        self.ttl_s = ttl_s
        self._by_id: dict[str, Session] = {}

    def create(self, user: str, grant: str) -> tuple[str, Session]:
        """A new session of ``user`` made from the token whose stored hash is ``grant``:
        its cookie value and the session (its CSRF token)."""
        self._expire()
        sid = secrets.token_urlsafe(32)
        session = Session(
            csrf=secrets.token_urlsafe(32), created=time.time(), user=user, grant=grant
        )
        self._by_id[sid] = session
        return sid, session

    def get(self, sid: str | None) -> Session | None:
        """The session of a cookie value (None: none, or expired)."""
        if not sid:
            return None
        session = self._by_id.get(sid)
        if session is None or time.time() - session.created > self.ttl_s:
            self._by_id.pop(sid, None)
            return None
        return session

    def end(self, sid: str | None) -> None:
        """Log a session out."""
        if sid:
            self._by_id.pop(sid, None)

    def _expire(self) -> None:
        now = time.time()
        for sid in [s for s, v in self._by_id.items() if now - v.created > self.ttl_s]:
            del self._by_id[sid]


def same_token(given: str | None, expected: str) -> bool:
    """Constant-time comparison of a presented token."""
    return bool(given) and hmac.compare_digest(str(given).encode(), expected.encode())
