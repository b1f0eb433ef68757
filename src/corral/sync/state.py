"""What ``corral sync`` pushed where: ``sync-state.json`` on the coordinator.

One entry per (host, destination): the tree's manifest digest, the source
directory, when, and how many files. Written after each successful sync
(atomically, under a lock, so concurrent syncs do not lose entries); read by
the pre-flight "sync status" check through :func:`sync_status`.

The file lives in ``$CORRAL_STATE_DIR`` (default ``~/.corral``).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

__all__ = [
    "STATE_FILE",
    "SyncRecord",
    "SyncStatus",
    "describe_age",
    "load_records",
    "record_sync",
    "record_syncs",
    "state_dir",
    "state_path",
    "sync_state",
    "sync_status",
]

STATE_FILE = "sync-state.json"
_VERSION = 1

SyncStatus = Literal["pass", "warn", "skip"]


def state_dir() -> Path:
    """``$CORRAL_STATE_DIR``, else ``~/.corral``."""
    configured = os.environ.get("CORRAL_STATE_DIR")
    return Path(configured).expanduser() if configured else Path.home() / ".corral"


def state_path() -> Path:
    """The sync state file."""
    return state_dir() / STATE_FILE


@dataclass(frozen=True)
class SyncRecord:
    """The last successful sync of a tree to one host and destination."""

    host: str
    dest: str
    digest: str  # the tree's manifest digest (corral.sync.fingerprint)
    src: str  # absolute source directory on the coordinator
    time: float  # when it finished (seconds since the epoch)
    files: int  # files in the tree

    @classmethod
    def from_json(cls, data: Any) -> SyncRecord | None:
        """Parse one entry (None when it is malformed)."""
        if not isinstance(data, dict):
            return None
        try:
            return cls(
                host=str(data["host"]),
                dest=str(data["dest"]),
                digest=str(data["digest"]),
                src=str(data["src"]),
                time=float(data["time"]),
                files=int(data["files"]),
            )
        except (KeyError, TypeError, ValueError):
            return None


def _norm(dest: str) -> str:
    return dest.rstrip("/") or dest


def _key(host: str, dest: str) -> str:
    return f"{host}\0{_norm(dest)}"


def _read(path: Path) -> dict[str, SyncRecord]:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    entries = doc.get("entries") if isinstance(doc, dict) else None
    out: dict[str, SyncRecord] = {}
    for raw in entries if isinstance(entries, list) else []:
        rec = SyncRecord.from_json(raw)
        if rec is not None:
            out[_key(rec.host, rec.dest)] = rec
    return out


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def record_syncs(records: Sequence[SyncRecord], *, path: Path | None = None) -> Path:
    """Add or replace the entries for ``records`` (one write); returns the file."""
    path = path or state_path()
    with _locked(path):
        entries = _read(path)
        for rec in records:
            entries[_key(rec.host, rec.dest)] = rec
        ordered = sorted(entries.values(), key=lambda r: (r.host, r.dest))
        doc = {"version": _VERSION, "entries": [asdict(r) for r in ordered]}
        fd, tmp = tempfile.mkstemp(prefix=".sync-state.", dir=path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                json.dump(doc, fh, indent=1)
                fh.write("\n")
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
    return path


def record_sync(
    host: str,
    dest: str,
    *,
    digest: str,
    src: str,
    files: int,
    when: float | None = None,
    path: Path | None = None,
) -> SyncRecord:
    """Record one successful sync of ``src`` (tree ``digest``) to ``host:dest``."""
    rec = SyncRecord(
        host=host,
        dest=_norm(dest),
        digest=digest,
        src=src,
        time=time.time() if when is None else when,
        files=files,
    )
    record_syncs([rec], path=path)
    return rec


def load_records(*, path: Path | None = None) -> list[SyncRecord]:
    """Every recorded sync (empty when the file is missing or unreadable)."""
    return list(_read(path or state_path()).values())


def sync_state(host: str, dest: str, *, path: Path | None = None) -> SyncRecord | None:
    """The last recorded sync to ``host:dest``, or None."""
    return _read(path or state_path()).get(_key(host, dest))


def describe_age(when: float, *, now: float | None = None) -> str:
    """``"3 min ago"``-style age of a timestamp, with the local time."""
    age = max(0.0, (time.time() if now is None else now) - when)
    if age < 90:
        ago = f"{age:.0f} s ago"
    elif age < 90 * 60:
        ago = f"{age / 60:.0f} min ago"
    elif age < 36 * 3600:
        ago = f"{age / 3600:.1f} h ago"
    else:
        ago = f"{age / 86400:.1f} days ago"
    stamp = time.strftime("%Y-%m-%d %H:%M", time.localtime(when))
    return f"{stamp}, {ago}"


def sync_status(
    host_names: Sequence[str],
    dest: str,
    current_digest: str,
    *,
    path: Path | None = None,
    now: float | None = None,
) -> dict[str, tuple[SyncStatus, str]]:
    """Per host: ``("pass", ...)`` when the last corral sync to ``dest`` pushed the
    tree whose digest is ``current_digest``; ``("warn", ...)`` when the code changed
    since that sync; ``("skip", ...)`` when corral never synced it there."""
    entries = _read(path or state_path())
    out: dict[str, tuple[SyncStatus, str]] = {}
    for name in host_names:
        rec = entries.get(_key(name, dest))
        if rec is None:
            out[name] = ("skip", f"never synced to {dest} by corral sync")
        elif rec.digest == current_digest:
            out[name] = ("pass", f"synced {describe_age(rec.time, now=now)}")
        else:
            out[name] = (
                "warn",
                f"code changed since the last sync ({describe_age(rec.time, now=now)}); "
                "run corral sync",
            )
    return out
