"""A machine's last ping latency; a rank's measured training speed.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-24
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | Sequence[str] | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("machines", sa.Column("latency_ms", sa.Float(), nullable=True))
    op.add_column("ranks", sa.Column("steps_per_s", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("ranks") as batch:
        batch.drop_column("steps_per_s")
    with op.batch_alter_table("machines") as batch:
        batch.drop_column("latency_ms")
