"""What ``corral sync`` pushed where: ``sync-state.json`` on the coordinator.

One entry per (host, destination): the tree's manifest digest, the source
directory, when, and how many files; and, once per pushed tree (up to
:data:`MANIFEST_LIMIT` files), its ``{path: sha256}`` manifest, so that a host's
current tree can later be verified against what was pushed there. Written after
each successful sync (atomically, under a lock, so concurrent syncs do not lose
entries); read by the pre-flight "sync status" check through :func:`verify_sync`
and by the code check's default reference through :func:`records_for_dest`.

The file lives in ``$CORRAL_STATE_DIR`` (default ``~/.corral``).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import tempfile
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

__all__ = [
    "MANIFEST_LIMIT",
    "STATE_FILE",
    "HostVerdict",
    "SyncRecord",
    "SyncStatus",
    "describe_age",
    "load_records",
    "record_sync",
    "record_syncs",
    "recorded_manifest",
    "records_for_dest",
    "state_dir",
    "state_path",
    "sync_state",
    "sync_status",
    "verify_sync",
]

STATE_FILE = "sync-state.json"
MANIFEST_LIMIT = 20_000  # larger trees are recorded by digest only
SHOWN_FILES = 3
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
    digest: str  # the tree's manifest digest (corral.agent.fingerprint)
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


def _same_place(dest: str) -> str:
    """``dest`` as the host sees it: ``~/x``, ``./x`` and ``x`` are all ``x`` in the home."""
    dest = _norm(dest)
    while dest.startswith(("~/", "./")):
        dest = dest[2:].lstrip("/") or "."
    return "." if dest == "~" else dest


def _key(host: str, dest: str) -> str:
    return f"{host}\0{_same_place(dest)}"


def _load(path: Path) -> tuple[dict[str, SyncRecord], dict[str, dict[str, str]]]:
    """(entries by key, stored manifests by digest)."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}, {}
    entries = doc.get("entries") if isinstance(doc, dict) else None
    out: dict[str, SyncRecord] = {}
    for raw in entries if isinstance(entries, list) else []:
        rec = SyncRecord.from_json(raw)
        if rec is not None:
            out[_key(rec.host, rec.dest)] = rec
    stored = doc.get("manifests") if isinstance(doc, dict) else None
    manifests: dict[str, dict[str, str]] = {}
    for digest, files in (stored if isinstance(stored, dict) else {}).items():
        if isinstance(files, dict) and all(isinstance(v, str) for v in files.values()):
            manifests[str(digest)] = {str(k): v for k, v in files.items()}
    return out, manifests


def _read(path: Path) -> dict[str, SyncRecord]:
    return _load(path)[0]


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def record_syncs(
    records: Sequence[SyncRecord],
    *,
    path: Path | None = None,
    manifest: Mapping[str, str] | None = None,
) -> Path:
    """Add or replace the entries for ``records`` (one write); returns the file.

    ``manifest`` is the pushed tree's ``{path: sha256}`` (the records' digest):
    kept, when it has at most :data:`MANIFEST_LIMIT` files, for as long as an
    entry refers to it."""
    path = path or state_path()
    with _locked(path):
        entries, manifests = _load(path)
        for rec in records:
            entries[_key(rec.host, rec.dest)] = rec
        if manifest is not None and records and len(manifest) <= MANIFEST_LIMIT:
            for digest in {r.digest for r in records}:
                manifests[digest] = dict(manifest)
        ordered = sorted(entries.values(), key=lambda r: (r.host, r.dest))
        used = {r.digest for r in ordered}
        doc: dict[str, Any] = {"version": _VERSION, "entries": [asdict(r) for r in ordered]}
        doc["manifests"] = {d: files for d, files in manifests.items() if d in used}
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
    manifest: Mapping[str, str] | None = None,
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
    record_syncs([rec], path=path, manifest=manifest)
    return rec


def load_records(*, path: Path | None = None) -> list[SyncRecord]:
    """Every recorded sync (empty when the file is missing or unreadable)."""
    return list(_read(path or state_path()).values())


def sync_state(host: str, dest: str, *, path: Path | None = None) -> SyncRecord | None:
    """The last recorded sync to ``host:dest``, or None."""
    return _read(path or state_path()).get(_key(host, dest))


def records_for_dest(
    host_names: Iterable[str], dest: str, *, path: Path | None = None
) -> list[SyncRecord]:
    """The recorded syncs to ``dest`` on any of ``host_names``, newest first."""
    entries = _read(path or state_path())
    found = [entries[k] for k in (_key(h, dest) for h in host_names) if k in entries]
    return sorted(found, key=lambda r: r.time, reverse=True)


def recorded_manifest(digest: str, *, path: Path | None = None) -> dict[str, str] | None:
    """The stored ``{path: sha256}`` of the pushed tree ``digest`` (None when not kept)."""
    return _load(path or state_path())[1].get(digest)


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


@dataclass(frozen=True)
class HostVerdict:
    """One host's sync status: ``pass`` (what corral pushed is what is there and
    here), ``warn`` (changed here and/or on the host since), ``skip`` (never
    pushed there by corral). ``changed`` names the host's files that differ from
    the pushed tree; ``verified`` says whether the host's current tree was
    compared with it."""

    status: SyncStatus
    detail: str
    changed: tuple[str, ...] = field(default=())
    verified: bool = False
    record: SyncRecord | None = None


def _names(changed: list[str], missing: list[str], extra: list[str]) -> list[str]:
    return [*changed, *missing, *extra]


def _shown(paths: Sequence[str]) -> str:
    more = f" (+{len(paths) - SHOWN_FILES} more)" if len(paths) > SHOWN_FILES else ""
    return ", ".join(paths[:SHOWN_FILES]) + more


def _host_diff(reference: Mapping[str, str], host: Mapping[str, str]) -> list[str]:
    from corral.agent.fingerprint import diff_manifests

    return _names(*diff_manifests(dict(reference), dict(host)))


def verify_sync(
    host_names: Sequence[str],
    dest: str,
    *,
    local_digest: str | None,
    local_files: Mapping[str, str] | None = None,
    host_trees: Mapping[str, Mapping[str, str] | None] | None = None,
    ignores: Sequence[str] = (),
    path: Path | None = None,
    now: float | None = None,
) -> dict[str, HostVerdict]:
    """Per host, whether the last ``corral sync`` to ``dest`` is still what runs.

    ``local_files`` / ``local_digest``: the tree here now; ``host_trees``: each
    host's current ``{path: sha256}`` under ``dest`` (None where unknown);
    both walked with the extra ``ignores`` (the pushed tree's stored manifest is
    filtered the same way before comparing). A host whose tree differs from what
    was pushed is ``warn`` with the differing files named, even when the tree
    here did not change."""
    from corral.agent.fingerprint import filter_files

    entries, manifests = _load(path or state_path())
    trees = host_trees or {}
    filtered: dict[str, dict[str, str]] = {}
    out: dict[str, HostVerdict] = {}
    for name in host_names:
        rec = entries.get(_key(name, dest))
        if rec is None:
            out[name] = HostVerdict("skip", f"never synced to {dest} by corral sync")
            continue
        age = describe_age(rec.time, now=now)
        pushed = manifests.get(rec.digest)
        if pushed is not None and rec.digest not in filtered:
            filtered[rec.digest] = filter_files(pushed, ignores)
        pushed_files = filtered.get(rec.digest)
        if pushed_files is not None and local_files is not None:
            here_same = pushed_files == dict(local_files)
        else:
            here_same = local_digest is not None and rec.digest == local_digest
        host_files = trees.get(name)
        reference = pushed_files if pushed_files is not None else local_files
        changed: list[str] = []
        verified = False
        if (
            host_files is not None
            and reference is not None
            and (pushed_files is not None or here_same)
        ):
            verified = True
            if dict(host_files) != dict(reference):
                changed = _host_diff(reference, host_files)
        if changed:
            where = "here and on the host" if not here_same else "on the host"
            detail = (
                f"changed {where} since the last sync ({age}): {_shown(changed)}; run corral sync"
            )
            out[name] = HostVerdict("warn", detail, tuple(changed), verified, rec)
        elif not here_same:
            detail = f"code changed since the last sync ({age}); run corral sync"
            out[name] = HostVerdict("warn", detail, (), verified, rec)
        else:
            checked = "; verified on the host" if verified else ""
            out[name] = HostVerdict("pass", f"synced {age}{checked}", (), verified, rec)
    return out


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
    since that sync; ``("skip", ...)`` when corral never synced it there. (Without
    the hosts' trees: :func:`verify_sync` also checks those.)"""
    verdicts = verify_sync(host_names, dest, local_digest=current_digest, path=path, now=now)
    return {name: (v.status, v.detail) for name, v in verdicts.items()}
