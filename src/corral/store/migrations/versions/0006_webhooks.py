"""Notification targets (webhooks, apprise URLs) and their delivery log.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | Sequence[str] | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "webhooks",
        sa.Column("id", sa.String(32), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("url", sa.Text(), nullable=False),
        sa.Column("secret", sa.Text(), nullable=True),
        sa.Column("events", sa.JSON(), nullable=False),
        sa.Column("created", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_webhooks")),
    )
    op.create_table(
        "deliveries",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("hook_id", sa.String(32), nullable=False),
        sa.Column("event", sa.String(32), nullable=False),
        sa.Column("job_id", sa.String(64), nullable=True),
        sa.Column("payload", sa.JSON(), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("status_code", sa.Integer(), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("created", sa.Float(), nullable=False),
        sa.Column("last_try", sa.Float(), nullable=True),
        sa.Column("next_try", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(
            ["hook_id"],
            ["webhooks.id"],
            name=op.f("fk_deliveries_hook_id_webhooks"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_deliveries")),
    )
    op.create_index(op.f("ix_deliveries_hook_id"), "deliveries", ["hook_id"])
    op.create_index("ix_deliveries_due", "deliveries", ["state", "next_try"])


def downgrade() -> None:
    op.drop_index("ix_deliveries_due", table_name="deliveries")
    op.drop_index(op.f("ix_deliveries_hook_id"), table_name="deliveries")
    op.drop_table("deliveries")
    op.drop_table("webhooks")
