"""The initial schema: machines, tasks, jobs (attempts, nodes, ranks, events), preferences.

Revision ID: 0001
Revises:
Create Date: 2026-11-24
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _job_id(table: str) -> tuple[sa.Column[str], sa.ForeignKeyConstraint]:
    """The ``job_id`` column of a job's child table and its key (rows go with the job)."""
    fk = sa.ForeignKeyConstraint(
        ["job_id"], ["jobs.id"], name=op.f(f"fk_{table}_job_id_jobs"), ondelete="CASCADE"
    )
    return sa.Column("job_id", sa.String(64), nullable=False), fk


def _create_machines() -> None:
    op.create_table(
        "machines",
        sa.Column("id", sa.String(32), nullable=False),
        sa.Column("name", sa.String(255), nullable=False),
        sa.Column("address", sa.String(255), nullable=False),
        sa.Column("port", sa.Integer(), nullable=True),
        sa.Column("user", sa.String(255), nullable=True),
        sa.Column("key_path", sa.Text(), nullable=True),
        sa.Column("password_env", sa.String(255), nullable=True),
        sa.Column("slots", sa.Integer(), nullable=False),
        sa.Column("labels", sa.JSON(), nullable=False),
        sa.Column("local", sa.Boolean(), nullable=False),
        sa.Column("python", sa.Text(), nullable=True),
        sa.Column("created", sa.Float(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("last_seen", sa.Float(), nullable=True),
        sa.Column("last_checked", sa.Float(), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("capabilities", sa.JSON(), nullable=False),
        sa.Column("load", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_machines")),
        sa.UniqueConstraint("name", name=op.f("uq_machines_name")),
    )


def _create_tasks_and_preferences() -> None:
    op.create_table(
        "tasks",
        sa.Column("id", sa.String(32), nullable=False),
        sa.Column("name", sa.String(255), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("request", sa.JSON(), nullable=False),
        sa.Column("created", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_tasks")),
    )
    op.create_table(
        "preferences",
        sa.Column("key", sa.String(64), nullable=False),
        sa.Column("value", sa.JSON(), nullable=False),
        sa.Column("updated", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("key", name=op.f("pk_preferences")),
    )


def _create_jobs() -> None:
    op.create_table(
        "jobs",
        sa.Column("id", sa.String(64), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("request", sa.JSON(), nullable=False),
        sa.Column("plan", sa.JSON(), nullable=False),
        sa.Column("machine_ids", sa.JSON(), nullable=False),
        sa.Column("master", sa.String(255), nullable=True),
        sa.Column("world_size", sa.Integer(), nullable=False),
        sa.Column("task_id", sa.String(32), nullable=True),
        sa.Column("run_dir", sa.Text(), nullable=False),
        sa.Column("created", sa.Float(), nullable=False),
        sa.Column("queued", sa.Float(), nullable=True),
        sa.Column("started", sa.Float(), nullable=True),
        sa.Column("ended", sa.Float(), nullable=True),
        sa.Column("exit_code", sa.Integer(), nullable=True),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("restarts", sa.Integer(), nullable=False),
        sa.Column("root_cause", sa.JSON(), nullable=True),
        sa.Column("last_metrics", sa.JSON(), nullable=False),
        sa.Column("supervisor_pid", sa.Integer(), nullable=True),
        sa.Column("supervisor_started", sa.Float(), nullable=True),
        sa.Column("events_offset", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(
            ["task_id"], ["tasks.id"], name=op.f("fk_jobs_task_id_tasks"), ondelete="SET NULL"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_jobs")),
    )
    for column in ("created", "state", "task_id"):
        op.create_index(op.f(f"ix_jobs_{column}"), "jobs", [column])


def _create_job_children() -> None:
    op.create_table(
        "attempts",
        *_job_id("attempts"),
        sa.Column("number", sa.Integer(), nullable=False),
        sa.Column("started", sa.Float(), nullable=False),
        sa.Column("ended", sa.Float(), nullable=True),
        sa.Column("hosts", sa.JSON(), nullable=False),
        sa.Column("world_size", sa.Integer(), nullable=False),
        sa.Column("checkpoint", sa.Text(), nullable=True),
        sa.Column("record", sa.JSON(), nullable=False),
        sa.Column("restart", sa.Boolean(), nullable=False),
        sa.Column("decision", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("job_id", "number", name=op.f("pk_attempts")),
    )
    op.create_table(
        "nodes",
        *_job_id("nodes"),
        sa.Column("host", sa.String(255), nullable=False),
        sa.Column("node_rank", sa.Integer(), nullable=False),
        sa.Column("machine_id", sa.String(32), nullable=True),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("detail", sa.Text(), nullable=False),
        sa.Column("started", sa.Float(), nullable=True),
        sa.Column("ended", sa.Float(), nullable=True),
        sa.PrimaryKeyConstraint("job_id", "host", name=op.f("pk_nodes")),
    )
    op.create_table(
        "ranks",
        *_job_id("ranks"),
        sa.Column("rank", sa.Integer(), nullable=False),
        sa.Column("host", sa.String(255), nullable=False),
        sa.Column("step", sa.Integer(), nullable=True),
        sa.Column("total", sa.Integer(), nullable=True),
        sa.Column("metrics", sa.JSON(), nullable=False),
        sa.Column("updated", sa.Float(), nullable=True),
        sa.Column("code", sa.Integer(), nullable=True),
        sa.PrimaryKeyConstraint("job_id", "rank", name=op.f("pk_ranks")),
    )
    op.create_table(
        "events",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        *_job_id("events"),
        sa.Column("pos", sa.BigInteger(), nullable=False),
        sa.Column("time", sa.Float(), nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("data", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_events")),
    )
    op.create_index("ix_events_job_pos", "events", ["job_id", "pos"], unique=True)


def upgrade() -> None:
    _create_machines()
    _create_tasks_and_preferences()
    _create_jobs()
    _create_job_children()


def downgrade() -> None:
    for table in ("events", "ranks", "nodes", "attempts", "jobs", "preferences", "tasks"):
        op.drop_table(table)
    op.drop_table("machines")
