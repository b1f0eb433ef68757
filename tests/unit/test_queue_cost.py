"""What the queue costs, counted in SQL statements (never timed): a scheduler round
reads up to the job the queue waits for and writes only what changed, whatever the
queue's length; enqueuing and reading one job's place do not load the queue."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event, text

from corral.service.jobs import JobManager
from corral.service.machines import MachineService
from corral.service.models import JobRequest
from corral.service.queue import queue_key
from corral.service.settings import ServerSettings
from corral.service.tasks import TaskService
from corral.service.users import LimitsIn, UserIn, UserService
from corral.store import Store, open_store
from corral.store.models import Job, Machine

REQUEST = {"script": "train.py", "launcher": "python", "preflight": False}


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    with open_store(f"sqlite:///{tmp_path / 'corral.db'}") as opened:
        yield opened


@pytest.fixture
def tasks(store: Store, tmp_path: Path) -> TaskService:
    settings = ServerSettings(run_dir=tmp_path / "runs", health_interval=0)
    jobs = JobManager(store, settings, MachineService(store, settings))
    users = UserService(store)
    for name in ("alice", "bob"):
        users.add(UserIn(name=name), by="test")
    with store.session() as s:  # an SSH machine never health-checked: every job waits
        s.add(Machine(id="m-1", name="gpu1", address="10.9.9.9", created=1.0))
    return TaskService(store, jobs, users)


def fill(store: Store, owner: str, count: int, start: float = 1000.0) -> None:
    """``count`` queued jobs of ``owner``, written straight to the store."""
    with store.session() as s:
        for i in range(count):
            s.add(
                Job(
                    id=f"j-{owner}-{int(start) + i:05d}",
                    state="queued",
                    reason="",
                    request=REQUEST,
                    created=start + i,
                    queued=start + i,
                    owner=owner,
                )
            )


@contextmanager
def statements(store: Store) -> Iterator[list[str]]:
    """The SQL statements run inside the block."""
    seen: list[str] = []

    def before(_conn: Any, _cursor: Any, sql: str, *_args: Any) -> None:
        seen.append(sql.lstrip().split(None, 1)[0].upper())

    event.listen(store.engine, "before_cursor_execute", before)
    try:
        yield seen
    finally:
        event.remove(store.engine, "before_cursor_execute", before)


def round_cost(store: Store, tasks: TaskService) -> tuple[int, int]:
    """(statements, UPDATEs) of one scheduler round."""
    with statements(store) as seen:
        assert tasks.schedule_once() == []
    return len(seen), seen.count("UPDATE")


def test_a_round_costs_the_same_for_20_and_2000_queued_jobs(
    store: Store, tasks: TaskService
) -> None:
    fill(store, "alice", 20)
    first = round_cost(store, tasks)
    assert first[1] == 1  # the head's reason, once
    assert not tasks.queued.quiet  # the head was found: the next round comes as usual
    small = round_cost(store, tasks)
    assert small[1] == 0  # nothing changed: nothing written
    assert tasks.queued.quiet  # and the rounds after it may come less often
    fill(store, "bob", 1980, start=5000.0)
    round_cost(store, tasks)
    assert round_cost(store, tasks) == small
    # every job behind the head says so, without a write
    queue = tasks.list_queue(limit=3, offset=1997)
    assert [e.reason for e in queue] == ["waiting behind job j-alice-01000 (queued first)"] * 3
    assert [e.position for e in queue] == [1997, 1998, 1999]
    head = tasks.list_queue(limit=1)[0]
    assert head.reason.startswith("waiting for 1 machine: gpu1 never health-checked")
    status = tasks.jobs.status("j-bob-06979")
    assert status.reason == "waiting behind job j-alice-01000 (queued first)"


def test_owners_at_their_limit_are_skipped_in_the_query_not_one_by_one(
    store: Store, tasks: TaskService
) -> None:
    tasks.users.set_limits("alice", LimitsIn(jobs=1), by="test")
    with store.session() as s:
        s.add(Job(id="j-run", state="running", created=1.0, owner="alice", machine_ids=["m-1"]))
    fill(store, "alice", 10)
    fill(store, "bob", 1, start=9000.0)
    round_cost(store, tasks)
    few = round_cost(store, tasks)
    fill(store, "alice", 1000, start=2000.0)
    assert round_cost(store, tasks) == few
    entry = tasks.list_queue(limit=1)[0]
    assert entry.reason == "alice has 1 running, limit 1"
    # bob's job is the head: alice's wait for her own limit, not behind it
    assert tasks.list_queue(limit=1, offset=1010)[0].reason.startswith("waiting for 1 machine")


def test_enqueue_counts_over_indexes_and_reads_no_queued_row(
    store: Store, tasks: TaskService
) -> None:
    fill(store, "bob", 500)
    with statements(store) as seen:
        queued = tasks.queue_request(JobRequest.model_validate(REQUEST), owner="alice")
    assert queued.position == 500
    loaded: list[str] = []

    def rows(_conn: Any, _cursor: Any, sql: str, *_args: Any) -> None:
        if sql.lstrip().upper().startswith("SELECT") and "count(" not in sql.lower():
            loaded.append(sql)

    event.listen(store.engine, "before_cursor_execute", rows)
    try:
        tasks.queue_request(JobRequest.model_validate(REQUEST), owner="alice")
    finally:
        event.remove(store.engine, "before_cursor_execute", rows)
    assert not [sql for sql in loaded if "FROM jobs" in sql and "jobs.request" in sql]
    assert len(seen) < 20


def test_the_queue_order_is_read_from_its_index(store: Store) -> None:
    query = (
        "SELECT id FROM jobs WHERE state = 'queued' "
        "ORDER BY priority DESC, queued, created, id LIMIT 32"
    )
    with store.engine.connect() as connection:
        plan = " ".join(str(r[-1]) for r in connection.execute(text("EXPLAIN QUERY PLAN " + query)))
    assert "ix_jobs_queue" in plan
    assert "TEMP B-TREE" not in plan.upper()


def test_queue_key_orders_like_the_query() -> None:
    a = Job(id="a", priority=1, queued=5.0, created=5.0)
    b = Job(id="b", priority=0, queued=1.0, created=1.0)
    c = Job(id="c", priority=0, queued=1.0, created=1.0)
    assert sorted([c, b, a], key=queue_key) == [a, b, c]
