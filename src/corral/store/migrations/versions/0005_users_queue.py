"""Users and roles (tokens as hashes), the audit log, job and task owners, the queue's
priorities and per-user limits. The jobs and tasks already there become the user
``admin``'s (the holder of the server's token, which becomes that user's).

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | Sequence[str] | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "users",
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("token_hash", sa.String(64), nullable=False),
        sa.Column("created", sa.Float(), nullable=False),
        sa.Column("revoked", sa.Float(), nullable=True),
        sa.Column("max_jobs", sa.Integer(), nullable=True),
        sa.Column("max_machines", sa.Integer(), nullable=True),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_users")),
        sa.UniqueConstraint("token_hash", name=op.f("uq_users_token_hash")),
    )
    op.create_table(
        "audit",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("time", sa.Float(), nullable=False),
        sa.Column("user", sa.String(64), nullable=True),
        sa.Column("method", sa.String(8), nullable=False),
        sa.Column("path", sa.Text(), nullable=False),
        sa.Column("status", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_audit")),
    )
    op.create_index(op.f("ix_audit_time"), "audit", ["time"])
    for table in ("jobs", "tasks"):
        op.add_column(table, sa.Column("owner", sa.String(64), nullable=True))
        op.add_column(
            table, sa.Column("priority", sa.Integer(), server_default="0", nullable=False)
        )
        # what was there was submitted with the server's token: now the user "admin"'s
        op.execute(sa.text(f"UPDATE {table} SET owner = 'admin'"))
    op.create_index(op.f("ix_jobs_owner"), "jobs", ["owner"])


def downgrade() -> None:
    op.drop_index(op.f("ix_jobs_owner"), table_name="jobs")
    for table in ("tasks", "jobs"):
        with op.batch_alter_table(table) as batch:
            batch.drop_column("priority")
            batch.drop_column("owner")
    op.drop_index(op.f("ix_audit_time"), table_name="audit")
    op.drop_table("audit")
    op.drop_table("users")
