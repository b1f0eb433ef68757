"""The audit log: every privileged change once, with who, what, before and after.

A service function that changes something privileged (a user added, revoked or
limited; a job queued or moved; a webhook added or removed; a login) writes its
entry with :func:`record_change` in the same transaction as the change, naming the
actor: the user of the request, or ``cli:<os user>`` for ``corral serve user ...``
on the server's machine (:func:`cli_actor`). The server's middleware opens a
:class:`RequestAudit` for each request (:func:`open_request`), so the entry also
names the method, path and client address, and gets the answer's status once sent;
a state-changing request that wrote no entry (a refusal, a measurement) gets one
entry of its own from the middleware (:meth:`AuditLog.request`). An entry of the
CLI has the status 0 (its exit status).

Requests without a valid token cannot grow the log without bound: they are one
entry per client address per :data:`WINDOW` seconds, whose ``count`` says how many
came (:meth:`AuditLog.unauthenticated`).
"""

from __future__ import annotations

import getpass
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel
from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from corral.store import Store
from corral.store.models import AuditEntry

WINDOW = 60.0
"""Seconds one entry counts the requests without a valid token from one address."""


@dataclass
class RequestAudit:
    """The request (or CLI command) a change is made for, and the entries it wrote."""

    method: str
    path: str
    source: str | None = None
    status: int = 0
    entries: list[int] = field(default_factory=list)


_CURRENT: ContextVar[RequestAudit | None] = ContextVar("corral_audit_request", default=None)


@contextmanager
def open_request(request: RequestAudit) -> Iterator[RequestAudit]:
    """Make ``request`` the one the changes made inside are recorded for (the route's
    worker thread gets a copy of this context, which shares the object)."""
    token = _CURRENT.set(request)
    try:
        yield request
    finally:
        _CURRENT.reset(token)


def cli_actor() -> str:
    """Who runs a ``corral serve`` command on the server's machine: ``cli:<os user>``."""
    try:
        return f"cli:{getpass.getuser()}"
    except (KeyError, OSError):
        return "cli:?"


def record_change(
    s: Session,
    who: str,
    action: str,
    target: str | None,
    *,
    before: dict[str, Any] | None = None,
    after: dict[str, Any] | None = None,
) -> None:
    """Add the entry of one privileged change to ``s`` (committed with the change)."""
    request = _CURRENT.get() or RequestAudit(method="CALL", path=action)
    entry = AuditEntry(
        time=time.time(),
        user=who[:64],
        method=request.method[:8],
        path=request.path[:2000],
        status=request.status,
        action=action,
        target=None if target is None else target[:255],
        before=before,
        after=after,
        source=request.source,
        count=1,
    )
    s.add(entry)
    s.flush()
    request.entries.append(entry.id)


class AuditOut(BaseModel):
    """One audit entry."""

    id: int
    time: float
    user: str | None
    method: str
    path: str
    status: int
    action: str | None = None
    target: str | None = None
    before: dict[str, Any] | None = None
    after: dict[str, Any] | None = None
    source: str | None = None
    count: int = 1


class AuditPage(BaseModel):
    """A page of the audit log, newest first."""

    entries: list[AuditOut]
    total: int
    limit: int
    offset: int


class AuditLog:
    """The audit log over the store."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._lock = threading.Lock()
        self._windows: dict[str, tuple[int, int]] = {}  # source -> (window, entry id)

    def change(
        self,
        who: str,
        action: str,
        target: str | None,
        *,
        before: dict[str, Any] | None = None,
        after: dict[str, Any] | None = None,
    ) -> None:
        """Record one privileged change made outside a service's own transaction."""
        with self.store.session() as s:
            record_change(s, who, action, target, before=before, after=after)

    def added_or_removed(
        self, who: str, action: str, target: str | None, values: dict[str, Any], *, removed: bool
    ) -> None:
        """Record the addition (``values`` after) or removal (``values`` before) of ``target``."""
        self.change(
            who,
            action,
            target,
            before=values if removed else None,
            after=None if removed else values,
        )

    def finish(self, request: RequestAudit, status: int) -> bool:
        """Give the request's entries its answer's status; False when none is stored
        (its changes were rolled back)."""
        if not request.entries:
            return False
        with self.store.session() as s:
            done = s.execute(
                update(AuditEntry)
                .where(AuditEntry.id.in_(request.entries), AuditEntry.path == request.path[:2000])
                .values(status=status)
            )
            return bool(getattr(done, "rowcount", 0))

    def request(self, who: str, request: RequestAudit, status: int) -> None:
        """One entry for a state-changing request of ``who`` that recorded no change."""
        with self.store.session() as s:
            s.add(
                AuditEntry(
                    time=time.time(),
                    user=who,
                    method=request.method[:8],
                    path=request.path[:2000],
                    status=status,
                    source=request.source,
                    count=1,
                )
            )

    def unauthenticated(self, request: RequestAudit, status: int) -> None:
        """Count a request without a valid token: one entry per source address and
        :data:`WINDOW` (the first request's method, path and status, and ``count``)."""
        source = (request.source or "?")[:64]
        window = int(time.time() // WINDOW)
        with self._lock:
            if any(w != window for w, _ in self._windows.values()):
                self._windows = {k: v for k, v in self._windows.items() if v[0] == window}
            known = self._windows.get(source)
            with self.store.session() as s:
                if known is not None:
                    done = s.execute(
                        update(AuditEntry)
                        .where(AuditEntry.id == known[1])
                        .values(count=AuditEntry.count + 1)
                    )
                    if getattr(done, "rowcount", 0):
                        return
                entry = AuditEntry(
                    time=time.time(),
                    user=None,
                    method=request.method[:8],
                    path=request.path[:2000],
                    status=status,
                    action="unauthenticated",
                    source=source,
                    count=1,
                )
                s.add(entry)
                s.flush()
                self._windows[source] = (window, entry.id)

    def page(self, *, user: str | None = None, limit: int = 50, offset: int = 0) -> AuditPage:
        """Entries newest first (only ``user``'s when given)."""
        query = select(AuditEntry)
        if user is not None:
            query = query.where(AuditEntry.user == user)
        with self.store.session() as s:
            total = s.scalar(select(func.count()).select_from(query.subquery())) or 0
            rows = s.scalars(query.order_by(AuditEntry.id.desc()).offset(offset).limit(limit)).all()
            entries = [
                AuditOut(
                    id=r.id,
                    time=r.time,
                    user=r.user,
                    method=r.method,
                    path=r.path,
                    status=r.status,
                    action=r.action,
                    target=r.target,
                    before=r.before,
                    after=r.after,
                    source=r.source,
                    count=r.count or 1,
                )
                for r in rows
            ]
        return AuditPage(entries=entries, total=int(total), limit=limit, offset=offset)
