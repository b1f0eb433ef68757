"""``corral serve gc``: trim what old finished jobs keep.

A job that ended (succeeded, failed, timed out, cancelled or lost) before the cut-off
loses its stored events (:class:`~corral.store.models.Event` rows: the bulk of the
store) and its run dir (logs, events file, result), when that dir lies under the
server's run dir. Its row stays, with its state, times, exit code and root cause, so
lists and status still name it. A job that is running, queued or planned is never
touched, whatever its age. A dry run lists the same and deletes nothing.
"""

from __future__ import annotations

import os
import re
import shutil
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy import delete, func, select

from corral.errors import Invalid
from corral.job.states import TERMINAL_STATES, state_values
from corral.service.audit import record_change
from corral.store import Store
from corral.store.models import Event, Job

UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
#: Jobs per round of queries and deletes (bounds a statement's parameters).
BATCH = 500


def parse_age(text: str) -> float:
    """Seconds of an age like ``30d``, ``12h``, ``90m``, ``2w`` or ``3600s``."""
    found = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*", text or "")
    if not found:
        raise Invalid(
            f"{text!r} is not an age: a number and a unit, s, m, h, d or w (e.g. 30d)",
            details={"field": "older_than"},
        )
    return float(found.group(1)) * UNITS[found.group(2)]


@dataclass
class Trimmed:
    """One job's share: its stored events and its run dir (None when there is none to
    delete; ``kept`` says why a dir was left)."""

    job_id: str
    state: str
    ended: float
    events: int
    run_dir: str | None
    bytes: int
    kept: str = ""


@dataclass
class GcReport:
    """What was (or, in a dry run, would be) deleted."""

    cutoff: float
    dry_run: bool
    jobs: list[Trimmed] = field(default_factory=list)

    @property
    def events(self) -> int:
        return sum(j.events for j in self.jobs)

    @property
    def run_dirs(self) -> int:
        return sum(1 for j in self.jobs if j.run_dir)

    @property
    def bytes(self) -> int:
        return sum(j.bytes for j in self.jobs)


def collect(
    store: Store,
    run_root: Path,
    older_than: float,
    *,
    dry_run: bool = False,
    now: float | None = None,
    by: str | None = None,
) -> GcReport:
    """Trim the jobs that ended more than ``older_than`` seconds before ``now``: their
    events and their run dirs under ``run_root``; with ``dry_run`` only list them.
    What was trimmed is one audit entry of ``by`` (``jobs.gc``) when given."""
    if older_than < 0:
        raise Invalid("the age must be >= 0", details={"field": "older_than"})
    cutoff = (time.time() if now is None else now) - older_than
    report = GcReport(cutoff=cutoff, dry_run=dry_run)
    root = run_root.resolve()
    for rows in _old_jobs(store, cutoff):
        ids = [job_id for job_id, *_ in rows]
        with store.session() as s:
            counts = dict(
                s.execute(
                    select(Event.job_id, func.count())
                    .where(Event.job_id.in_(ids))
                    .group_by(Event.job_id)
                ).all()
            )
        trimmed = []
        for job_id, state, ended, run_dir in rows:
            target, kept = _run_dir(run_dir, root)
            events = int(counts.get(job_id, 0))
            if not events and target is None and not kept:
                continue  # nothing left to trim (an earlier gc did)
            size = _size(target) if target is not None else 0
            trimmed.append(
                Trimmed(job_id, state, ended, events, str(target) if target else None, size, kept)
            )
        if not dry_run:
            _delete(store, trimmed)
        report.jobs.extend(trimmed)
    if by is not None and not dry_run and report.jobs:
        after = {
            "older_than": older_than,
            "cutoff": cutoff,
            "jobs": len(report.jobs),
            "events": report.events,
            "run_dirs": report.run_dirs,
            "bytes": report.bytes,
        }
        with store.session() as s:
            record_change(s, by, "jobs.gc", str(root), after=after)
    return report


def _old_jobs(store: Store, cutoff: float) -> Iterator[Sequence[tuple[str, str, float, str]]]:
    """The finished jobs that ended before ``cutoff``, oldest first, in batches."""
    ended = func.coalesce(Job.ended, Job.created)
    query = (
        select(Job.id, Job.state, ended, Job.run_dir)
        .where(Job.state.in_(state_values(TERMINAL_STATES)), ended < cutoff)
        .order_by(ended, Job.id)
    )
    with store.session() as s:
        rows = [(str(a), str(b), float(c), str(d or "")) for a, b, c, d in s.execute(query)]
    for start in range(0, len(rows), BATCH):
        yield rows[start : start + BATCH]


def _run_dir(run_dir: str, root: Path) -> tuple[Path | None, str]:
    """The job's run dir to delete (None: none), and why one that exists is kept."""
    if not run_dir:
        return None, ""
    path = Path(run_dir)
    if path.is_symlink():
        return None, f"{run_dir} is a symbolic link"
    if not path.is_dir():
        return None, ""
    resolved = path.resolve()
    if resolved == root or not resolved.is_relative_to(root):
        return None, f"{run_dir} is not under the server's run dir {root}"
    return resolved, ""


def _size(path: Path) -> int:
    total = 0
    for base, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += (Path(base) / name).lstat().st_size
            except OSError:
                continue
    return total


def _delete(store: Store, trimmed: list[Trimmed]) -> None:
    """Delete the jobs' events (rows still finished: a job cannot start again), then
    their run dirs."""
    ids = [t.job_id for t in trimmed if t.events]
    if ids:
        finished = select(Job.id).where(
            Job.id.in_(ids), Job.state.in_(state_values(TERMINAL_STATES))
        )
        with store.session() as s:
            s.execute(
                delete(Event).where(Event.job_id.in_(finished)),
                execution_options={"synchronize_session": False},
            )
    for t in trimmed:
        if t.run_dir:
            shutil.rmtree(t.run_dir, ignore_errors=True)
