"""The store's tables (SQLAlchemy 2.x declarative models).

One row per registered machine, job, attempt, node of a job, rank of a job,
structured event (log lines stay in the run dir's files, see
:mod:`corral.service.eventlog`), task (a saved job template), preference, user
(its token only as a hash), audited request, notification target (webhook or apprise
URL) and delivery.
Ids are short random strings made by the service; times are UNIX seconds
(floats) from the coordinator's clock; free-form data is JSON.

The schema is created and upgraded only by the Alembic migrations in
``corral/store/migrations`` (applied when the store opens); a change here needs
a new revision there.
"""

from __future__ import annotations

from typing import Any, ClassVar

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

#: Deterministic constraint names, the same on SQLite and PostgreSQL, so that a later
#: migration can drop or alter a constraint by name (SQLite batch mode needs names).
NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    """Every table of the store."""

    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map: ClassVar[dict[Any, Any]] = {dict[str, Any]: JSON, list[Any]: JSON}


class Machine(Base):
    """A registered machine: an SSH host, or a simulated ``local`` node on the server.

    Credentials are a key *path* or the *name* of an environment variable that holds
    a password: never a secret itself.
    """

    __tablename__ = "machines"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    name: Mapped[str] = mapped_column(String(255), unique=True)
    address: Mapped[str] = mapped_column(String(255))
    port: Mapped[int | None] = mapped_column(Integer, nullable=True)
    user: Mapped[str | None] = mapped_column(String(255), nullable=True)
    key_path: Mapped[str | None] = mapped_column(Text, nullable=True)
    password_env: Mapped[str | None] = mapped_column(String(255), nullable=True)
    slots: Mapped[int] = mapped_column(Integer, default=1)
    labels: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    local: Mapped[bool] = mapped_column(Boolean, default=False)
    python: Mapped[str | None] = mapped_column(Text, nullable=True)
    created: Mapped[float] = mapped_column(Float)
    # health, as the last ping / health check saw it
    status: Mapped[str] = mapped_column(String(16), default="unknown")  # online|offline|unknown
    last_seen: Mapped[float | None] = mapped_column(Float, nullable=True)
    last_checked: Mapped[float | None] = mapped_column(Float, nullable=True)
    last_error: Mapped[str | None] = mapped_column(Text, nullable=True)
    latency_ms: Mapped[float | None] = mapped_column(Float, nullable=True)
    capabilities: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    load: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)


class Job(Base):
    """A job submitted to the server: its request, plan, state and supervisor."""

    __tablename__ = "jobs"
    __table_args__ = (Index("ix_jobs_owner_state", "owner", "state"),)  # a user's queued

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    kind: Mapped[str] = mapped_column(String(16), default="distributed")  # |single
    state: Mapped[str] = mapped_column(String(16), index=True)
    reason: Mapped[str] = mapped_column(Text, default="")
    request: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)  # secrets redacted
    plan: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    #: what the supervisor runs, fixed when the job was planned (secrets redacted)
    launch: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    machine_ids: Mapped[list[Any]] = mapped_column(JSON, default=list)
    master: Mapped[str | None] = mapped_column(String(255), nullable=True)
    world_size: Mapped[int] = mapped_column(Integer, default=0)
    task_id: Mapped[str | None] = mapped_column(
        String(32), ForeignKey("tasks.id", ondelete="SET NULL"), nullable=True, index=True
    )
    run_dir: Mapped[str] = mapped_column(Text, default="")
    created: Mapped[float] = mapped_column(Float, index=True)
    queued: Mapped[float | None] = mapped_column(Float, nullable=True)
    started: Mapped[float | None] = mapped_column(Float, nullable=True)
    ended: Mapped[float | None] = mapped_column(Float, nullable=True)
    exit_code: Mapped[int | None] = mapped_column(Integer, nullable=True)
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    restarts: Mapped[int] = mapped_column(Integer, default=0)
    root_cause: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    last_metrics: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    # the supervisor process (pid + its start time, so a reused pid is not mistaken)
    supervisor_pid: Mapped[int | None] = mapped_column(Integer, nullable=True)
    supervisor_started: Mapped[float | None] = mapped_column(Float, nullable=True)
    events_offset: Mapped[int] = mapped_column(BigInteger, default=0)  # events.jsonl ingested
    #: the name of the user who submitted or queued it (None: before users existed)
    owner: Mapped[str | None] = mapped_column(String(64), nullable=True, index=True)
    #: the queue's order: higher first, first in first out within a priority
    priority: Mapped[int] = mapped_column(Integer, default=0, server_default="0")


# the queue in its order (the scheduler's next job, a job's position): an index range,
# never a scan and sort of every queued job
Index("ix_jobs_queue", Job.state, Job.priority.desc(), Job.queued, Job.created, Job.id)


class Attempt(Base):
    """One attempt of a job (a restart starts the next)."""

    __tablename__ = "attempts"

    job_id: Mapped[str] = mapped_column(
        String(64), ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True
    )
    number: Mapped[int] = mapped_column(Integer, primary_key=True)
    started: Mapped[float] = mapped_column(Float)
    ended: Mapped[float | None] = mapped_column(Float, nullable=True)
    hosts: Mapped[list[Any]] = mapped_column(JSON, default=list)
    world_size: Mapped[int] = mapped_column(Integer, default=0)
    checkpoint: Mapped[str | None] = mapped_column(Text, nullable=True)
    record: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    restart: Mapped[bool] = mapped_column(Boolean, default=False)
    decision: Mapped[str] = mapped_column(Text, default="")
    #: each planned rank's share (host order, then local rank); null: an even split
    workload_weights: Mapped[list[Any] | None] = mapped_column(JSON, nullable=True)


class Node(Base):
    """A node (host) of a job's current attempt."""

    __tablename__ = "nodes"

    job_id: Mapped[str] = mapped_column(
        String(64), ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True
    )
    host: Mapped[str] = mapped_column(String(255), primary_key=True)
    node_rank: Mapped[int] = mapped_column(Integer, default=0)
    machine_id: Mapped[str | None] = mapped_column(String(32), nullable=True)
    state: Mapped[str] = mapped_column(String(16), default="pending")
    detail: Mapped[str] = mapped_column(Text, default="")
    started: Mapped[float | None] = mapped_column(Float, nullable=True)
    ended: Mapped[float | None] = mapped_column(Float, nullable=True)


class Rank(Base):
    """A rank of a job: its last progress report and exit code."""

    __tablename__ = "ranks"

    job_id: Mapped[str] = mapped_column(
        String(64), ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True
    )
    rank: Mapped[int] = mapped_column(Integer, primary_key=True)
    host: Mapped[str] = mapped_column(String(255))
    step: Mapped[int | None] = mapped_column(Integer, nullable=True)
    total: Mapped[int | None] = mapped_column(Integer, nullable=True)
    steps_per_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    metrics: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    updated: Mapped[float | None] = mapped_column(Float, nullable=True)
    code: Mapped[int | None] = mapped_column(Integer, nullable=True)


class Event(Base):
    """A structured event of a job (state, node, progress, message, attempt, finish).

    ``pos`` is the event's byte offset in the job's ``events.jsonl``: the id the
    SSE stream gives it (``Last-Event-ID``)."""

    __tablename__ = "events"
    __table_args__ = (
        Index("ix_events_job_pos", "job_id", "pos", unique=True),
        # a job's events of one kind, newest first (the status's pre-flight report,
        # groups, stragglers and hang): without it a read walks all the job's events
        Index("ix_events_job_kind_pos", "job_id", "kind", "pos"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(String(64), ForeignKey("jobs.id", ondelete="CASCADE"))
    pos: Mapped[int] = mapped_column(BigInteger)  # a byte offset: may pass 2 GiB
    time: Mapped[float] = mapped_column(Float)
    kind: Mapped[str] = mapped_column(String(32))
    data: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)


class Task(Base):
    """A saved job template; queuing it creates a job."""

    __tablename__ = "tasks"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    name: Mapped[str] = mapped_column(String(255))
    kind: Mapped[str] = mapped_column(String(16), default="distributed")  # |single
    request: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    created: Mapped[float] = mapped_column(Float)
    owner: Mapped[str | None] = mapped_column(String(64), nullable=True)
    #: the priority of the jobs queued from it (unless the queue request names one)
    priority: Mapped[int] = mapped_column(Integer, default=0, server_default="0")


class Preference(Base):
    """One named preference document (``distributed``: the seed's DistributedPreferences)."""

    __tablename__ = "preferences"

    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    updated: Mapped[float] = mapped_column(Float)


class User(Base):
    """A user of the server: a role and the sha256 of their token (never the token).

    A revoked user keeps the row (their jobs and audit entries name them) but no
    token of theirs is accepted. ``max_jobs``/``max_machines``: how many jobs and
    machines their running jobs may hold at once (None: no limit); ``max_queued``:
    how many jobs they may have queued (None: the server's ``--max-queued``)."""

    __tablename__ = "users"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    role: Mapped[str] = mapped_column(String(16))  # admin|user|viewer
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    created: Mapped[float] = mapped_column(Float)
    revoked: Mapped[float | None] = mapped_column(Float, nullable=True)
    max_jobs: Mapped[int | None] = mapped_column(Integer, nullable=True)
    max_machines: Mapped[int | None] = mapped_column(Integer, nullable=True)
    max_queued: Mapped[int | None] = mapped_column(Integer, nullable=True)


class AuditEntry(Base):
    """One privileged change or state-changing request: who, what (the action, its
    target, the values before and after; the method and path), when, the outcome.
    Requests without a valid token are one row per source address and minute, with
    their ``count``."""

    __tablename__ = "audit"
    __table_args__ = (Index("ix_audit_user_id", "user", "id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    time: Mapped[float] = mapped_column(Float, index=True)
    user: Mapped[str | None] = mapped_column(String(64), nullable=True)  # None: no valid token
    method: Mapped[str] = mapped_column(String(8))
    path: Mapped[str] = mapped_column(Text)
    status: Mapped[int] = mapped_column(Integer)
    action: Mapped[str | None] = mapped_column(String(64), nullable=True)  # user.add, ...
    target: Mapped[str | None] = mapped_column(String(255), nullable=True)
    before: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    after: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    source: Mapped[str | None] = mapped_column(String(64), nullable=True)  # client address
    count: Mapped[int] = mapped_column(Integer, default=1, server_default="1")


class Webhook(Base):
    """A notification target (:mod:`corral.notify`): a webhook (``kind`` ``webhook``:
    the events POSTed as JSON, signed with ``secret``) or a chat/mail service through
    apprise (``kind`` ``apprise``: ``url`` is its apprise URL). ``events``: the names
    it wants. The secret and an apprise URL's credentials are never returned."""

    __tablename__ = "webhooks"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    kind: Mapped[str] = mapped_column(String(16))  # webhook|apprise
    url: Mapped[str] = mapped_column(Text)
    secret: Mapped[str | None] = mapped_column(Text, nullable=True)
    events: Mapped[list[Any]] = mapped_column(JSON, default=list)
    created: Mapped[float] = mapped_column(Float)


class Delivery(Base):
    """One event for one target, and how its delivery went (the target's log):
    ``pending`` until delivered or given up (``failed``) after the last attempt;
    ``next_try`` is when the worker tries again."""

    __tablename__ = "deliveries"
    __table_args__ = (Index("ix_deliveries_due", "state", "next_try"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    hook_id: Mapped[str] = mapped_column(
        String(32), ForeignKey("webhooks.id", ondelete="CASCADE"), index=True
    )
    event: Mapped[str] = mapped_column(String(32))
    job_id: Mapped[str | None] = mapped_column(String(64), nullable=True)
    payload: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    state: Mapped[str] = mapped_column(String(16), default="pending")
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    status_code: Mapped[int | None] = mapped_column(Integer, nullable=True)
    last_error: Mapped[str | None] = mapped_column(Text, nullable=True)
    created: Mapped[float] = mapped_column(Float)
    last_try: Mapped[float | None] = mapped_column(Float, nullable=True)
    next_try: Mapped[float] = mapped_column(Float)
