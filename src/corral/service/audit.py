"""The audit log: one row per state-changing request (who, what, when, the outcome).

The server's middleware records every request whose method is not ``GET``,
``HEAD`` or ``OPTIONS`` once its answer is sent, refused ones included (their
user is null when no valid token came with them). Reads are never recorded.
"""

from __future__ import annotations

import time

from pydantic import BaseModel
from sqlalchemy import func, select

from corral.store import Store
from corral.store.models import AuditEntry


class AuditOut(BaseModel):
    """One audited request."""

    id: int
    time: float
    user: str | None
    method: str
    path: str
    status: int


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

    def record(self, user: str | None, method: str, path: str, status: int) -> None:
        """Append one entry."""
        with self.store.session() as s:
            s.add(
                AuditEntry(
                    time=time.time(), user=user, method=method, path=path[:2000], status=status
                )
            )

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
                    id=r.id, time=r.time, user=r.user, method=r.method, path=r.path, status=r.status
                )
                for r in rows
            ]
        return AuditPage(entries=entries, total=int(total), limit=limit, offset=offset)
