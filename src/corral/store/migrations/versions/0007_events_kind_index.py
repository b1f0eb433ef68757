"""An index on events (job_id, kind, pos): a job's events of one kind, newest first.

The status of a job reads its last pre-flight report and its straggler and hang
events, and the compare page its progress reports: with only (job_id, pos) each
read walked every event of the job (a long job has hundreds of thousands).

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-03
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0007"
down_revision: str | Sequence[str] | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index("ix_events_job_kind_pos", "events", ["job_id", "kind", "pos"])


def downgrade() -> None:
    op.drop_index("ix_events_job_kind_pos", table_name="events")
