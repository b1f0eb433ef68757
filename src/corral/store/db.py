"""Opening the store: the database URL, the SQLite file, connection settings, migrations.

SQLite (the default, one file under the user's data dir) or PostgreSQL by URL
(``postgresql+psycopg://user@host:port/db``). Opening applies the Alembic
migrations up to head, serialised between processes (SQLite: ``BEGIN IMMEDIATE``;
PostgreSQL: an advisory lock), so a server and a CLI starting together do not race.
Every failure to open is a :class:`~corral.errors.ConfigError` on ``--db`` whose
message never holds the password.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import Any

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util import CommandError
from sqlalchemy import URL, Connection, Engine, create_engine, event, make_url, text
from sqlalchemy.exc import ArgumentError, DBAPIError
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import StaticPool

from corral.errors import ConfigError
from corral.paths import data_dir

#: The Alembic scripts (``env.py``, ``versions/``), shipped inside the package.
MIGRATIONS = Path(__file__).parent / "migrations"

_OPTION = "--db"
_EXAMPLES = "sqlite:///PATH or postgresql+psycopg://USER@HOST:PORT/DB"
_DRIVERS = {
    "sqlite": "sqlite",
    "sqlite+pysqlite": "sqlite+pysqlite",
    "postgresql": "postgresql+psycopg",
    "postgresql+psycopg": "postgresql+psycopg",
    "postgresql+psycopg2": "postgresql+psycopg2",
}
# busy_timeout first: switching to WAL may wait for another connection's lock
_SQLITE_PRAGMAS = ("busy_timeout=5000", "journal_mode=WAL", "foreign_keys=ON", "synchronous=NORMAL")
_PG_MIGRATION_LOCK = 0x636F7272616C  # "corral": pg_advisory_xact_lock key of migrations
_PG_TIMEOUT_S = 10  # connect timeout: an unreachable host fails, never hangs

_Step = Callable[[Config, str], None]


def default_db_url() -> str:
    """``sqlite:///$XDG_DATA_HOME/corral/corral.db`` (``~/.local/share`` without it)."""
    return f"sqlite:///{data_dir() / 'corral.db'}"


def alembic_config(connection: Connection) -> Config:
    """An Alembic config over the packaged migrations that runs on ``connection``."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS).replace("%", "%%"))
    config.attributes["connection"] = connection
    return config


@functools.cache
def head_revision() -> str:
    """The newest revision of the packaged migrations."""
    head = ScriptDirectory(str(MIGRATIONS)).get_current_head()
    assert head is not None, "the store's migrations have no head"
    return head


class Store:
    """An open database: its engine, sessions and schema revision."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        #: the URL with its password hidden: safe to print and log
        self.url: str = engine.url.render_as_string(hide_password=True)
        #: ``"sqlite"`` or ``"postgresql"``
        self.dialect: str = engine.dialect.name
        self._sessions = sessionmaker(engine, expire_on_commit=False)

    def __repr__(self) -> str:
        return f"Store({self.url!r})"

    def __enter__(self) -> Store:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    @contextmanager
    def session(self) -> Iterator[Session]:
        """A session that commits when the block ends, or rolls back when it raises."""
        with self._sessions.begin() as session:
            yield session

    def revision(self) -> str | None:
        """The schema's current Alembic revision (None: no migration applied)."""
        with self._translated(), self.engine.connect() as connection:
            return MigrationContext.configure(connection).get_current_revision()

    def upgrade(self, revision: str = "head") -> None:
        """Apply the migrations up to ``revision`` (nothing to do when already there)."""
        if revision == "head" and self.revision() == head_revision():
            return
        self._migrate(command.upgrade, revision)

    def downgrade(self, revision: str) -> None:
        """Revert the migrations down to ``revision`` (``"base"``: drop every table)."""
        self._migrate(command.downgrade, revision)

    def ping(self) -> None:
        """Connect once, so that a bad URL fails now with a clear error."""
        with self._translated(), self.engine.connect() as connection:
            connection.exec_driver_sql("SELECT 1")

    def close(self) -> None:
        """Close every pooled connection."""
        self.engine.dispose()

    def _migrate(self, step: _Step, revision: str) -> None:
        with (
            self._translated(),
            self.engine.connect() as connection,
            _migration_transaction(connection),
        ):
            step(alembic_config(connection), revision)

    @contextmanager
    def _translated(self) -> Iterator[None]:
        """Database and migration errors as ConfigErrors naming the (password-free) URL."""
        try:
            yield
        except DBAPIError as exc:
            reason = _one_line(str(exc.orig), self.engine.url.password)
            message = f"cannot use the database {self.url}: {reason}"
            raise ConfigError(message, option=_OPTION) from exc
        except CommandError as exc:
            message = (
                f"the database {self.url} has a schema this corral does not know "
                f"(its migrations end at {head_revision()}; upgrade corral?): {exc}"
            )
            raise ConfigError(message, option=_OPTION) from exc


def open_store(url: str | None = None, *, migrate: bool = True) -> Store:
    """Open the database at ``url`` (default: :func:`default_db_url`) and migrate it to head.

    ``migrate=False`` opens the schema as it is (a process of a server that has
    migrated it, or a test driving the migrations itself); it still connects once.
    """
    parsed = _checked_url(default_db_url() if url is None else url)
    if parsed.get_backend_name() == "sqlite":
        parsed = _prepare_sqlite(parsed)
    store = Store(_create_engine(parsed))
    try:
        if migrate:
            store.upgrade()
        else:
            store.ping()
    except BaseException:
        store.close()
        raise
    return store


def _checked_url(url: str) -> URL:
    """The parsed URL, with a supported driver (plain ``postgresql`` means psycopg 3)."""
    try:
        parsed = make_url(url)
    except ArgumentError as exc:
        raise ConfigError(f"not a database URL; expected {_EXAMPLES}", option=_OPTION) from exc
    driver = _DRIVERS.get(parsed.drivername)
    if driver is None:
        message = f"unsupported database URL scheme {parsed.drivername!r}; expected {_EXAMPLES}"
        raise ConfigError(message, option=_OPTION)
    return parsed.set(drivername=driver)


def _sqlite_memory(url: URL) -> bool:
    return url.database in (None, "", ":memory:") and "uri" not in url.query


def _sqlite_file(url: URL) -> Path | None:
    """The database file of a SQLite URL; None for an in-memory or ``file:`` URI database."""
    if _sqlite_memory(url) or "uri" in url.query:
        return None
    return Path(url.database or "").expanduser()


def _prepare_sqlite(url: URL) -> URL:
    """Create the file's dir (0700) and the file (0600) when missing, make an existing
    file and its ``-wal``/``-shm`` 0600 (SQLite gives new ones the file's mode); check
    both writable."""
    path = _sqlite_file(url)
    if path is None:
        return url
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.close(os.open(path, os.O_RDWR | os.O_CREAT, 0o600))
        _private_files(path)
    except FileExistsError as exc:  # mkdir: a part of the dir path is a file
        raise _not_writable(path, f"{exc.filename} is not a directory") from exc
    except OSError as exc:
        raise _not_writable(path, exc.strerror or str(exc)) from exc
    if not os.access(path.parent, os.W_OK | os.X_OK):
        raise _not_writable(path, f"SQLite cannot create {path.name}-wal in {path.parent}")
    return url.set(database=str(path))


def _private_files(path: Path) -> None:
    """Take group and other access away from the database file and its companions."""
    for each in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
        try:
            mode = each.stat().st_mode
        except FileNotFoundError:
            continue
        if mode & 0o077 and each.is_file():
            os.chmod(each, mode & 0o700)


def _not_writable(path: Path, reason: str) -> ConfigError:
    return ConfigError(f"database file {path} is not writable: {reason}", option=_OPTION)


def _create_engine(url: URL) -> Engine:
    """The engine for a checked URL; a missing driver module is a ConfigError."""
    try:
        if url.get_backend_name() == "sqlite":
            return _sqlite_engine(url)
        timeout = {} if "connect_timeout" in url.query else {"connect_timeout": _PG_TIMEOUT_S}
        return create_engine(url, pool_pre_ping=True, connect_args=timeout, hide_parameters=True)
    except ImportError as exc:
        message = (
            f"the database driver of {url.drivername} is not installed ({exc.name}): "
            "install corral[postgres] and use postgresql+psycopg://"
        )
        raise ConfigError(message, option=_OPTION) from exc


def _sqlite_engine(url: URL) -> Engine:
    """A SQLite engine whose every connection gets the store's pragmas."""
    # hide_parameters: a failed statement's message (logged by the server) never holds
    # the values of a request
    if _sqlite_memory(url):  # one connection, so that every session sees the same db
        engine = create_engine(
            url,
            poolclass=StaticPool,
            connect_args={"check_same_thread": False},
            hide_parameters=True,
        )
    else:
        engine = create_engine(url, hide_parameters=True)
    event.listen(engine, "connect", _set_sqlite_pragmas)
    return engine


def _set_sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    try:
        for pragma in _SQLITE_PRAGMAS:
            cursor.execute(f"PRAGMA {pragma}")
    finally:
        cursor.close()


@contextmanager
def _migration_transaction(connection: Connection) -> Iterator[None]:
    """One transaction around the migrations that no other process's migrations overlap."""
    if connection.dialect.name != "sqlite":
        connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _PG_MIGRATION_LOCK})
        yield
        connection.commit()
        return
    # batch mode rebuilds tables: with foreign keys on, dropping a parent table
    # would cascade into its children (Alembic's advice); the pragma is a no-op
    # inside a transaction, so it goes before BEGIN and comes back after it
    connection.exec_driver_sql("PRAGMA foreign_keys=OFF")
    try:
        connection.exec_driver_sql("BEGIN IMMEDIATE")
        yield
        connection.commit()
    finally:
        connection.rollback()
        connection.exec_driver_sql("PRAGMA foreign_keys=ON")
        connection.commit()


def _one_line(message: str, password: str | None) -> str:
    """A driver's (possibly multi-line) message on one line, without the password."""
    text_ = "; ".join(line.strip() for line in message.splitlines() if line.strip())
    return text_.replace(password, "***") if password else text_
