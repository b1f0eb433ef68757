"""A throwaway PostgreSQL server for tests, started from Debian's postgresql binaries.

``postgres_or_skip()`` starts one cluster in a temp dir (``initdb`` + ``pg_ctl``,
run as the ``postgres`` user when the tests run as root, since initdb refuses
root), listening on a unix socket in that dir and on 127.0.0.1 at a free port,
trust auth, with a database ``corral_test``; it yields that database's URL and
stops and removes the cluster afterwards. Without the binaries the test is
skipped (failed under ``CI=true``, see :func:`tests.conftest.missing_dependency`).

Given a ``template_dir`` (the e2e tests give the one every pytest-xdist worker of
the run shares), the first cluster's fresh ``initdb`` output is kept there and the
later clusters start from a copy of it: ``initdb`` is ~0.8 of the ~1.5 CPU-s a
cluster costs, and each worker starts one (issue 30).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy import create_engine, make_url, text

from tests.conftest import missing_dependency

PG_USER = "postgres"
DATABASE = "corral_test"
# UTF8 (SQL_ASCII would hand psycopg bytes); speed over durability: it is thrown away
_INITDB = ("-E", "UTF8", "--locale=C", "--no-sync")
_FAST = ("fsync=off", "full_page_writes=off", "synchronous_commit=off")


class PgUnavailable(Exception):
    """PostgreSQL cannot be run here (no binaries, no user to run them as)."""


def find_bindir() -> Path:
    """The bin dir of the newest installed PostgreSQL (Debian's layout, then PATH)."""
    versions = Path("/usr/lib/postgresql").glob("*/bin/initdb")
    found = sorted(versions, key=lambda p: int(p.parts[-3]) if p.parts[-3].isdigit() else 0)
    if found:
        return found[-1].parent
    initdb = shutil.which("initdb")
    if initdb is None:
        raise PgUnavailable("PostgreSQL is not installed (no initdb): apt-get install postgresql")
    return Path(initdb).parent


def _run_as() -> tuple[list[str], pwd.struct_passwd | None]:
    """The command prefix that runs a PostgreSQL binary, and the user it runs as (root)."""
    if os.geteuid() != 0:
        return [], None
    runuser = shutil.which("runuser")
    try:
        user = pwd.getpwnam(PG_USER)
    except KeyError:
        raise PgUnavailable(f"running as root and there is no {PG_USER!r} user") from None
    if runuser is None:
        raise PgUnavailable("running as root and there is no runuser to drop to postgres")
    return [runuser, "-u", PG_USER, "--"], user


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class _Cluster:
    """One initdb'ed cluster in ``root``; ``start()`` / ``stop()``."""

    def __init__(
        self, root: Path, bindir: Path, prefix: list[str], template_dir: Path | None = None
    ) -> None:
        self.root = root
        self.bindir = bindir
        self.prefix = prefix
        self.template_dir = template_dir
        self.data = root / "data"
        self.port = _free_port()

    def _pg(self, tool: str, *args: str) -> None:
        argv = [*self.prefix, str(self.bindir / tool), *args]
        done = subprocess.run(argv, cwd=self.root, capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            log = self.root / "log"
            tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
            raise RuntimeError(f"{tool} failed ({done.returncode}): {done.stderr}{tail}")

    def _initdb(self) -> None:
        """The data dir: ``initdb``'s, or a copy of the template (made from the first)."""
        if self.template_dir is None:
            self._pg("initdb", "-D", str(self.data), "-U", PG_USER, "-A", "trust", *_INITDB)
            return
        self.template_dir.mkdir(parents=True, exist_ok=True)
        made_by = hashlib.sha256(f"{self.bindir} {PG_USER} {_INITDB}".encode()).hexdigest()
        template = self.template_dir / f"pg-{made_by[:12]}-data"
        with open(self.template_dir / "pg-template.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # one initdb; no copy of a half-made one
            if template.exists():
                _copy(template, self.data)
                return
            self._pg("initdb", "-D", str(self.data), "-U", PG_USER, "-A", "trust", *_INITDB)
            _copy(self.data, template)

    def start(self) -> str:
        """initdb, start, create the test database; the admin URL of that database."""
        data = str(self.data)
        self._initdb()
        options = (
            "listen_addresses=127.0.0.1",
            f"port={self.port}",
            f"unix_socket_directories={self.root}",
            *_FAST,
        )
        settings = " ".join(f"-c {option}" for option in options)
        log = str(self.root / "log")
        self._pg("pg_ctl", "-D", data, "-l", log, "-w", "-t", "60", "-o", settings, "start")
        admin = f"postgresql+psycopg://{PG_USER}@127.0.0.1:{self.port}/postgres"
        return create_database(admin, DATABASE)

    def stop(self) -> None:
        self._pg("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")


def _copy(source: Path, target: Path) -> None:
    """``source`` copied to ``target`` with its owner and modes (``cp -a``): the data
    dir of a cluster that runs as ``postgres`` stays ``postgres``'s, 0700."""
    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)  # a copy cut short
    subprocess.run(["cp", "-a", str(source), str(partial)], check=True, timeout=120)
    partial.rename(target)


def create_database(url: str, name: str) -> str:
    """Create database ``name`` on the server of ``url``; the same URL naming it."""
    _admin(url, f'CREATE DATABASE "{name}"')
    return make_url(url).set(database=name).render_as_string(hide_password=False)


def drop_database(url: str, name: str) -> None:
    """Drop database ``name`` on the server of ``url``, closing its connections."""
    _admin(url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _admin(url: str, statement: str) -> None:
    engine = create_engine(make_url(url).set(database="postgres"), isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as connection:
            connection.execute(text(statement))
    finally:
        engine.dispose()


def _requirements() -> tuple[Path, list[str], pwd.struct_passwd | None]:
    """The bin dir, the command prefix and the user (as root) to run PostgreSQL with."""
    return (find_bindir(), *_run_as())


@contextmanager
def _running(
    bindir: Path,
    prefix: list[str],
    user: pwd.struct_passwd | None,
    template_dir: Path | None = None,
) -> Iterator[str]:
    root = Path(tempfile.mkdtemp(prefix="corral-pg-"))
    try:
        if user is not None:
            os.chown(root, user.pw_uid, user.pw_gid)
        cluster = _Cluster(root, bindir, prefix, template_dir)
        try:
            yield cluster.start()
        finally:
            if (cluster.data / "postmaster.pid").exists():
                cluster.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)


@contextmanager
def throwaway_postgres() -> Iterator[str]:
    """Run a throwaway cluster; yield the URL of its ``corral_test`` database.

    Raises :class:`PgUnavailable` when PostgreSQL cannot be run here, RuntimeError
    when it is there but fails to start.
    """
    with _running(*_requirements()) as url:
        yield url


@contextmanager
def postgres_or_skip(template_dir: Path | None = None) -> Iterator[str]:
    """:func:`throwaway_postgres`, or skip the test (fail under ``CI=true``) without it;
    its data dir copied from the one in ``template_dir``, kept there if none is yet."""
    try:
        requirements = _requirements()
    except PgUnavailable as exc:
        missing_dependency(str(exc))
    with _running(*requirements, template_dir) as url:
        yield url
