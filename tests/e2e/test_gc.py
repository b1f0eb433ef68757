"""``corral serve gc``: an old finished job loses its stored events and its run dir
(its row stays); a running, queued or recently ended job is untouched, whatever its
age; a dry run lists the same and deletes nothing. Over SQLite and PostgreSQL, and
the command itself as a real process."""

from __future__ import annotations

import getpass
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sqlalchemy import func, select

from corral.errors import Invalid
from corral.service.audit import AuditLog
from corral.service.gc import collect, parse_age
from corral.store import Store, open_store
from corral.store.models import Event, Job

DAY = 86400.0


def _job(
    store: Store, root: Path, job_id: str, state: str, age_days: float, *, ended: bool = True
) -> Path:
    """A job created ``age_days`` ago (ended an hour after when ``ended``) with three
    stored events and a run dir with a log under ``root``."""
    created = time.time() - age_days * DAY
    run_dir = root / job_id
    (run_dir / "logs").mkdir(parents=True)
    (run_dir / "events.jsonl").write_text('{"kind": "state"}\n' * 3)
    (run_dir / "logs" / "h.0.log").write_text("x" * 4096)
    with store.session() as s:
        s.add(
            Job(
                id=job_id,
                state=state,
                created=created,
                started=created + 1,
                ended=created + 3600 if ended else None,
                run_dir=str(run_dir),
            )
        )
        s.flush()
        for k in range(3):
            s.add(Event(job_id=job_id, pos=k, time=created + k, kind="progress", data={}))
    return run_dir


def _events(store: Store, job_id: str) -> int:
    with store.session() as s:
        return int(s.scalar(select(func.count()).where(Event.job_id == job_id)) or 0)


def test_old_finished_jobs_are_trimmed_and_nothing_else(store_url: str, tmp_path: Path) -> None:
    root = tmp_path / "runs"
    outside = tmp_path / "elsewhere"
    with open_store(store_url) as store:
        old = _job(store, root, "old-done", "succeeded", 40)
        failed = _job(store, root, "old-failed", "failed", 35)
        running = _job(store, root, "old-running", "running", 60, ended=False)
        queued = _job(store, root, "old-queued", "queued", 60, ended=False)
        recent = _job(store, root, "recent-done", "succeeded", 2)
        foreign = _job(store, outside, "old-outside", "cancelled", 50)

        dry = collect(store, root, parse_age("30d"), dry_run=True)
        assert [j.job_id for j in dry.jobs] == ["old-outside", "old-done", "old-failed"]
        assert dry.dry_run and dry.events == 9 and dry.run_dirs == 2
        assert dry.bytes >= 2 * 4096
        assert "not under the server's run dir" in dry.jobs[0].kept
        for path in (old, failed, running, queued, recent, foreign):
            assert path.is_dir()
        assert _events(store, "old-done") == 3

        done = collect(store, root, parse_age("30d"))
        assert [j.job_id for j in done.jobs] == ["old-outside", "old-done", "old-failed"]
        assert not old.exists() and not failed.exists()
        assert foreign.is_dir()  # not the server's: listed, never deleted
        for job_id in ("old-done", "old-failed", "old-outside"):
            assert _events(store, job_id) == 0
        for path, job_id in (
            (running, "old-running"),
            (queued, "old-queued"),
            (recent, "recent-done"),
        ):
            assert path.is_dir() and (path / "logs" / "h.0.log").is_file()
            assert _events(store, job_id) == 3
        with store.session() as s:  # the rows stay, with their state
            assert s.get(Job, "old-done") is not None
            assert s.get(Job, "old-done").state == "succeeded"  # type: ignore[union-attr]

        again = collect(store, root, parse_age("30d"))  # nothing left but the foreign dir
        assert [(j.job_id, j.events, j.run_dir) for j in again.jobs] == [("old-outside", 0, None)]


@pytest.mark.parametrize("text", ["30", "thirty days", "5y", "", "-3d"])
def test_an_age_needs_a_number_and_a_unit(text: str) -> None:
    with pytest.raises(Invalid, match="not an age"):
        parse_age(text)
    assert parse_age("30d") == 30 * DAY and parse_age("12h") == 12 * 3600
    assert parse_age("2w") == 14 * DAY and parse_age("90m") == 5400


def test_the_gc_command(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    db = f"sqlite:///{tmp_path / 'corral.db'}"
    with open_store(db) as store:
        old = _job(store, root, "old-done", "succeeded", 40)
        running = _job(store, root, "old-running", "running", 40, ended=False)
    base = [sys.executable, "-m", "corral", "serve", "gc", "--db", db, "--run-dir", str(root)]

    def gc(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*base, *args], capture_output=True, text=True, timeout=120)

    dry = gc("--older-than", "30d", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "old-done  succeeded" in dry.stdout and "3 events" in dry.stdout
    assert "old-running" not in dry.stdout
    assert "would delete 3 events and 1 run dirs" in dry.stdout
    assert old.is_dir()

    for args in (("--older-than", "30 days"), ()):
        bad = gc(*args)
        assert bad.returncode != 0
        assert "--older-than" in bad.stderr and "Traceback" not in bad.stderr

    with open_store(db) as store:
        assert AuditLog(store).page().total == 0  # a dry run changes nothing
    real = gc("--older-than", "30d")
    assert real.returncode == 0, real.stderr
    assert "deleted 3 events and 1 run dirs" in real.stdout
    assert not old.exists() and running.is_dir()
    # what was trimmed is one audit entry of the OS user who ran it
    with open_store(db) as store:
        entries = AuditLog(store).page().entries
    assert [(e.user, e.method, e.path, e.action) for e in entries] == [
        (f"cli:{getpass.getuser()}", "CLI", "corral serve gc", "jobs.gc")
    ]
    assert entries[0].target == str(root.resolve())
    assert entries[0].after is not None
    assert (entries[0].after["jobs"], entries[0].after["events"]) == (1, 3)
    assert entries[0].after["run_dirs"] == 1 and entries[0].after["older_than"] == 30 * DAY
