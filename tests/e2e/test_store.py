"""The store against SQLite and a real PostgreSQL server: schema, models, migrations, errors."""

from __future__ import annotations

import socket
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import func, inspect, select, text
from sqlalchemy.exc import IntegrityError

from corral.errors import ConfigError
from corral.store import (
    Attempt,
    Base,
    Event,
    Job,
    Machine,
    Node,
    Preference,
    Rank,
    Store,
    Task,
    default_db_url,
    open_store,
)
from corral.store.db import head_revision
from tests import pgserver

SECRET = "s3cret-Pa55word"

#: rows written by a corral whose schema was at revision 0001 (plain SQL, no models)
ROWS_AT_0001 = (
    "INSERT INTO machines (id, name, address, slots, labels, local, created, status,"
    " capabilities, load) VALUES ('m1', 'gpu1', '10.0.0.1', 8, '{\"gpu\": \"a100\"}', false,"
    " 1.0, 'online', '{}', '{}')",
    "INSERT INTO jobs (id, kind, state, reason, request, plan, machine_ids, world_size, run_dir,"
    " created, attempt, restarts, last_metrics, events_offset) VALUES ('j1', 'distributed',"
    " 'running', '', '{}', '{}', '[\"m1\"]', 1, '/r', 2.0, 0, 0, '{}', 0)",
    "INSERT INTO ranks (job_id, rank, host, metrics) VALUES ('j1', 0, 'gpu1', '{}')",
)


@pytest.fixture
def store(store_url: str) -> Iterator[Store]:
    with open_store(store_url) as opened:
        yield opened


def _tables(store: Store) -> set[str]:
    return set(inspect(store.engine).get_table_names())


def _count(store: Store, model: type[Base]) -> int:
    with store.session() as session:
        return session.scalar(select(func.count()).select_from(model)) or 0


def _populate(store: Store) -> None:
    """A machine, a task, a job of it with one row of every child table, a preference."""
    labels = {"gpu": "a100", "ids": [0, 1]}
    request = {"env": {"A": "1"}, "n": None}
    with store.session() as session:
        session.add(
            Machine(id="m1", name="gpu1", address="10.0.0.1", port=22, created=1.0, labels=labels)
        )
        session.add(Task(id="t1", name="train", request={"args": ["--lr", "0.1"]}, created=2.0))
        session.flush()  # no relationship() orders the rows: a parent row goes first
        session.add(Job(id="j1", state="running", task_id="t1", created=3.0, request=request))
        session.add(Preference(key="distributed", value={"nnodes": 2}, updated=4.0))
        session.flush()
        session.add_all(
            [
                Attempt(job_id="j1", number=0, started=3.1, hosts=["gpu1"], record={"ok": True}),
                Node(job_id="j1", host="gpu1", machine_id="m1"),
                Rank(job_id="j1", rank=0, host="gpu1", step=10, steps_per_s=2.5, metrics=labels),
                Event(job_id="j1", pos=0, time=3.2, kind="state", data={"state": "running"}),
                Event(job_id="j1", pos=2**33, time=3.3, kind="progress"),
            ]
        )
        session.get_one(Machine, "m1").latency_ms = 0.5
        session.get_one(Job, "j1").machine_ids = ["m1"]


# --- schema and migrations, on both backends ----------------------------------------


def test_open_store_creates_the_schema_at_head(store: Store) -> None:
    assert store.revision() == head_revision() == "0008"
    assert _tables(store) == {*Base.metadata.tables, "alembic_version"}
    assert store.dialect in ("sqlite", "postgresql")


def _differences(store: Store) -> list[Any]:
    """What autogenerate would change to make the schema equal the models (column diffs)."""
    with store.engine.connect() as connection:
        context = MigrationContext.configure(connection, opts={"compare_type": True})
        diffs = compare_metadata(context, Base.metadata)
    return [_named(diff) for diff in diffs]


def _named(diff: Any) -> Any:
    """A diff as names (tables and indexes as objects do not sort)."""
    if isinstance(diff, tuple) and diff[0] == "add_column":
        return (diff[0], diff[2], diff[3].name)
    if isinstance(diff, tuple) and diff[0] in ("add_table", "add_index"):
        return (diff[0], diff[1].name)
    return diff


def test_head_equals_the_models(store: Store) -> None:
    assert _differences(store) == []


def test_a_jobs_latest_event_of_a_kind_is_read_from_the_kind_index(store: Store) -> None:
    # the status's reads (last pre-flight report, groups, stragglers): by kind, in pos
    # order, without walking the job's other events or sorting them
    query = (
        "SELECT * FROM events WHERE job_id = 'j1' AND kind = 'checked' ORDER BY pos DESC LIMIT 1"
    )
    with store.engine.connect() as connection:
        if store.dialect == "sqlite":
            plan = " ".join(
                str(r[-1]) for r in connection.execute(text("EXPLAIN QUERY PLAN " + query))
            )
        else:
            connection.execute(text("SET enable_seqscan = off"))
            plan = " ".join(str(r[0]) for r in connection.execute(text("EXPLAIN " + query)))
    assert "ix_events_job_kind_pos" in plan
    assert "sort" not in plan.lower()


def test_upgrade_from_0001_keeps_the_rows(store_url: str) -> None:
    with open_store(store_url, migrate=False) as store:
        assert store.revision() is None
        store.upgrade("0001")
        assert store.revision() == "0001"
        assert sorted(_differences(store)) == [
            ("add_column", "attempts", "workload_weights"),
            ("add_column", "jobs", "launch"),
            ("add_column", "jobs", "owner"),
            ("add_column", "jobs", "priority"),
            ("add_column", "machines", "latency_ms"),
            ("add_column", "ranks", "steps_per_s"),
            ("add_column", "tasks", "owner"),
            ("add_column", "tasks", "priority"),
            ("add_index", "ix_audit_time"),
            ("add_index", "ix_audit_user_id"),
            ("add_index", "ix_deliveries_due"),
            ("add_index", "ix_deliveries_hook_id"),
            ("add_index", "ix_events_job_kind_pos"),
            ("add_index", "ix_jobs_owner"),
            ("add_index", "ix_jobs_owner_state"),
            ("add_index", "ix_jobs_queue"),
            ("add_table", "audit"),
            ("add_table", "deliveries"),
            ("add_table", "users"),
            ("add_table", "webhooks"),
        ]
        with store.engine.begin() as connection:
            for statement in ROWS_AT_0001:
                connection.execute(text(statement))
        store.upgrade()
        assert store.revision() == "0008"
        with store.session() as session:
            machine = session.get_one(Machine, "m1")
            rank = session.get_one(Rank, ("j1", 0))
            assert (machine.labels, machine.slots, machine.latency_ms) == ({"gpu": "a100"}, 8, None)
            job = session.get_one(Job, "j1")
            assert (job.machine_ids, rank.steps_per_s) == (["m1"], None)
            assert (job.owner, job.priority) == ("admin", 0)
            rank.steps_per_s = 1.5
        with store.session() as session:
            assert session.get_one(Rank, ("j1", 0)).steps_per_s == 1.5


def test_downgrade_keeps_rows_then_drops_everything(store: Store) -> None:
    _populate(store)
    store.downgrade("0001")
    assert store.revision() == "0001"
    with store.engine.connect() as connection:
        assert connection.execute(text("SELECT count(*) FROM attempts")).scalar() == 1
        assert connection.execute(text("SELECT name FROM machines")).scalar() == "gpu1"
        assert connection.execute(text("SELECT step FROM ranks")).scalar() == 10
    store.downgrade("base")
    assert store.revision() is None
    assert _tables(store) <= {"alembic_version"}
    store.upgrade()
    assert store.revision() == head_revision()


def test_processes_opening_a_new_store_together_migrate_it_once(store_url: str) -> None:
    code = "import sys; from corral.store import open_store; open_store(sys.argv[1]).close()"
    argv = [sys.executable, "-c", code, store_url]
    procs = [subprocess.Popen(argv, stderr=subprocess.PIPE, text=True) for _ in range(3)]
    for proc in procs:
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
    with open_store(store_url) as store:
        assert store.revision() == head_revision()


# --- the models ---------------------------------------------------------------------


def test_models_round_trip(store: Store) -> None:
    _populate(store)
    with store.session() as session:
        machine = session.get_one(Machine, "m1")
        job = session.get_one(Job, "j1")
        rank = session.get_one(Rank, ("j1", 0))
        attempt = session.get_one(Attempt, ("j1", 0))
        events = session.scalars(select(Event).where(Event.job_id == "j1").order_by(Event.pos))
        assert [(e.pos, e.kind, e.data) for e in events] == [
            (0, "state", {"state": "running"}),
            (2**33, "progress", {}),
        ]
    # expire_on_commit=False: the objects stay readable after the session
    assert machine.labels == {"gpu": "a100", "ids": [0, 1]}
    assert (machine.slots, machine.local, machine.status, machine.load) == (1, False, "unknown", {})
    assert (machine.latency_ms, machine.user, machine.port) == (0.5, None, 22)
    assert job.request == {"env": {"A": "1"}, "n": None}
    assert (job.kind, job.machine_ids, job.task_id, job.root_cause) == (
        "distributed",
        ["m1"],
        "t1",
        None,
    )
    assert (rank.steps_per_s, rank.metrics, rank.total) == (2.5, machine.labels, None)
    assert (attempt.hosts, attempt.record, attempt.restart) == (["gpu1"], {"ok": True}, False)
    with store.session() as session:
        node = session.get_one(Node, ("j1", "gpu1"))
        assert (node.state, node.node_rank, node.machine_id) == ("pending", 0, "m1")
        assert session.get_one(Preference, "distributed").value == {"nnodes": 2}
        assert session.get_one(Task, "t1").request == {"args": ["--lr", "0.1"]}


def test_deleting_a_job_deletes_its_rows_and_a_task_unlinks_its_jobs(store: Store) -> None:
    _populate(store)
    with store.session() as session:
        session.delete(session.get_one(Task, "t1"))
    with store.session() as session:
        assert session.get_one(Job, "j1").task_id is None
        session.delete(session.get_one(Job, "j1"))
    for model in (Attempt, Node, Rank, Event):
        assert _count(store, model) == 0, model.__tablename__
    assert _count(store, Machine) == 1


def test_machine_names_are_unique(store: Store) -> None:
    _populate(store)
    with pytest.raises(IntegrityError), store.session() as session:
        session.add(Machine(id="m2", name="gpu1", address="10.0.0.2", created=5.0))
    assert _count(store, Machine) == 1


def test_an_event_position_is_unique_per_job(store: Store) -> None:
    _populate(store)
    with pytest.raises(IntegrityError), store.session() as session:
        session.add(Event(job_id="j1", pos=0, time=9.0, kind="message"))
    assert _count(store, Event) == 2


def test_a_session_rolls_back_when_its_block_raises(store: Store) -> None:
    with pytest.raises(RuntimeError), store.session() as session:
        session.add(Preference(key="ui", value={}, updated=1.0))
        session.flush()
        raise RuntimeError("boom")
    assert _count(store, Preference) == 0


# --- SQLite specifics ---------------------------------------------------------------


def test_sqlite_file_is_private_and_in_wal_mode(tmp_path: Path) -> None:
    path = tmp_path / "data" / "corral" / "corral.db"
    with open_store(f"sqlite:///{path}") as store:
        with store.session() as session:
            session.add(Preference(key="ui", value={}, updated=1.0))
        with store.engine.connect() as connection:
            pragmas = [
                connection.exec_driver_sql(f"PRAGMA {name}").scalar()
                for name in ("journal_mode", "foreign_keys", "busy_timeout", "synchronous")
            ]
        assert pragmas == ["wal", 1, 5000, 1]  # synchronous 1: NORMAL
        files = sorted(p.name for p in path.parent.iterdir())
        assert files == ["corral.db", "corral.db-shm", "corral.db-wal"]
        for file in path.parent.iterdir():
            assert stat.S_IMODE(file.stat().st_mode) == 0o600, file
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700


def test_default_db_url_follows_xdg_data_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert default_db_url() == f"sqlite:///{tmp_path}/xdg/corral/corral.db"
    monkeypatch.delenv("XDG_DATA_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_db_url() == f"sqlite:///{tmp_path}/home/.local/share/corral/corral.db"
    with open_store() as store:
        assert store.url == default_db_url()
    assert (tmp_path / "home/.local/share/corral/corral.db").is_file()


def test_in_memory_sqlite_is_one_database(tmp_path: Path) -> None:
    with open_store("sqlite://") as store:
        _populate(store)
        assert _count(store, Event) == 2


# --- errors -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("where", "reason"),
    [
        ("afile/x.db", "is not a directory"),
        ("afile/sub/x.db", "Not a directory"),
        (".", "Is a directory"),
    ],
)
def test_an_unwritable_sqlite_path_is_a_config_error(
    tmp_path: Path, where: str, reason: str
) -> None:
    (tmp_path / "afile").write_text("not a directory\n")
    path = tmp_path / where
    with pytest.raises(ConfigError) as info:
        open_store(f"sqlite:///{path}")
    assert info.value.option == "--db"
    assert str(path) in str(info.value)
    assert "is not writable" in str(info.value)
    assert reason in str(info.value)


def test_a_file_that_is_no_database_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "junk.db"
    path.write_bytes(b"this is not SQLite" * 100)
    with pytest.raises(ConfigError, match="file is not a database") as info:
        open_store(f"sqlite:///{path}")
    assert str(path) in str(info.value)


@pytest.mark.parametrize(
    ("url", "match"),
    [
        (f"mysql://corral:{SECRET}@db/corral", "unsupported database URL scheme 'mysql'"),
        ("sqlite+aiosqlite:///x.db", "unsupported database URL scheme"),
        ("no url at all", "not a database URL"),
    ],
)
def test_an_unknown_url_is_a_config_error(url: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match) as info:
        open_store(url)
    assert SECRET not in str(info.value)


def test_a_missing_postgres_driver_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "psycopg", None)
    with pytest.raises(ConfigError, match=r"install corral\[postgres\]") as info:
        open_store(f"postgresql+psycopg://corral:{SECRET}@127.0.0.1/corral")
    assert SECRET not in str(info.value)


def test_unreachable_postgres_is_a_config_error_without_the_password() -> None:
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(ConfigError) as info:
        open_store(f"postgresql://corral:{SECRET}@127.0.0.1:{port}/corral")
    message = str(info.value)
    assert info.value.option == "--db"
    assert f"127.0.0.1:{port}" in message
    assert SECRET not in message
    assert "***" in message


def test_a_missing_postgres_database_is_a_config_error(postgres_url: str) -> None:
    url = pgserver.create_database(postgres_url, "corral_gone")
    pgserver.drop_database(postgres_url, "corral_gone")
    with pytest.raises(ConfigError, match='database "corral_gone" does not exist'):
        open_store(url)


def test_a_later_postgres_cluster_of_the_run_starts_from_the_first_ones_initdb(
    postgres_url: str, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The session's cluster left its fresh data dir in the run's temp root; another
    one (another xdist worker's) copies it instead of running initdb (issue 30)."""
    shared = tmp_path_factory.getbasetemp().parent
    assert [p.name for p in shared.glob("pg-*-data") if (p / "PG_VERSION").is_file()]
    ran: list[str] = []
    run_pg = pgserver._Cluster._pg

    def recorded(cluster: pgserver._Cluster, tool: str, *args: str) -> None:
        ran.append(tool)
        run_pg(cluster, tool, *args)

    monkeypatch.setattr(pgserver._Cluster, "_pg", recorded)
    with (
        pgserver.postgres_or_skip(shared) as url,
        open_store(url) as store,
        store.session() as session,
    ):
        assert session.execute(text("select 1")).scalar() == 1
    assert ran == ["pg_ctl", "pg_ctl"], ran  # start, stop: no initdb
