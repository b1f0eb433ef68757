"""Audit entries that say what changed (action, target, before, after; requests
without a valid token counted per source), a per-user cap on queued jobs, and the
indexes of the queue's order and of one user's jobs in a state.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-04
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | Sequence[str] | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("audit") as batch:
        batch.add_column(sa.Column("action", sa.String(64), nullable=True))
        batch.add_column(sa.Column("target", sa.String(255), nullable=True))
        batch.add_column(sa.Column("before", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("after", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("source", sa.String(64), nullable=True))
        batch.add_column(sa.Column("count", sa.Integer(), server_default="1", nullable=False))
    op.create_index("ix_audit_user_id", "audit", ["user", "id"])
    op.add_column("users", sa.Column("max_queued", sa.Integer(), nullable=True))
    op.create_index(
        "ix_jobs_queue",
        "jobs",
        ["state", sa.text("priority DESC"), "queued", "created", "id"],
    )
    op.create_index("ix_jobs_owner_state", "jobs", ["owner", "state"])


def downgrade() -> None:
    op.drop_index("ix_jobs_owner_state", table_name="jobs")
    op.drop_index("ix_jobs_queue", table_name="jobs")
    with op.batch_alter_table("users") as batch:
        batch.drop_column("max_queued")
    op.drop_index("ix_audit_user_id", table_name="audit")
    with op.batch_alter_table("audit") as batch:
        for name in ("count", "source", "after", "before", "target", "action"):
            batch.drop_column(name)
