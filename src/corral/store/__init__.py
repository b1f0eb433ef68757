"""The persistent store of ``corral serve``: SQLAlchemy models, Alembic migrations.

``open_store()`` opens SQLite under the user's data dir by default, or any
``postgresql+psycopg://`` URL, and migrates it to head; ``Store.session()`` gives
a transaction.
"""

from corral.store.db import Store, default_db_url, open_store
from corral.store.models import (
    Attempt,
    AuditEntry,
    Base,
    Event,
    Job,
    Machine,
    Node,
    Preference,
    Rank,
    Task,
    User,
)

__all__ = [
    "Attempt",
    "AuditEntry",
    "Base",
    "Event",
    "Job",
    "Machine",
    "Node",
    "Preference",
    "Rank",
    "Store",
    "Task",
    "User",
    "default_db_url",
    "open_store",
]
