"""The tree's manifest without re-hashing unchanged files (a stat cache, like git's index).

:func:`cached_manifest` gives exactly what :func:`corral.agent.fingerprint.build_manifest`
gives for the same file list, but reuses a file's SHA-256 from the previous run
when its size, mtime, ctime, inode and device are unchanged (ctime moves on
every write, and no tool can set it back). Files modified within the last
two seconds are hashed but not cached, so a write in the same clock tick as
the hash is never missed. The cache is one JSON file per tree root under
``$CORRAL_STATE_DIR/hash-cache/`` (default ``~/.corral``); a missing or
unreadable cache only costs time.

:func:`snapshot` and :func:`changed_since` tell whether any file of the tree
was touched between two moments (e.g. while it was being synced).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from corral.agent.fingerprint import Manifest, file_digest
from corral.sync.state import state_dir

__all__ = ["Stamp", "cache_file", "cached_manifest", "changed_since", "snapshot", "stamp"]

#: (size, mtime_ns, ctime_ns, inode, device) of a file's lstat.
Stamp = tuple[int, int, int, int, int]
RACY_NS = 2_000_000_000
_VERSION = 1


def stamp(path: str) -> Stamp | None:
    """A file's stamp (None when it cannot be stat'ed)."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev)


def snapshot(root: str, files: Sequence[str]) -> dict[str, Stamp | None]:
    """Every file's stamp now."""
    return {rel: stamp(os.path.join(root, rel)) for rel in files}


def changed_since(root: str, before: Mapping[str, Stamp | None]) -> list[str]:
    """Files whose stamp differs from ``before`` (changed, replaced or removed)."""
    return [rel for rel, old in before.items() if stamp(os.path.join(root, rel)) != old]


def cache_file(root: str) -> Path:
    """Where the cache of the tree at ``root`` lives."""
    key = hashlib.sha256(os.fsencode(root)).hexdigest()[:24]
    return state_dir() / "hash-cache" / f"{key}.json"


def _load(path: Path, root: str) -> dict[str, list[object]]:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(doc, dict) or doc.get("version") != _VERSION or doc.get("root") != root:
        return {}
    entries = doc.get("entries")
    return entries if isinstance(entries, dict) else {}


def _save(path: Path, root: str, entries: Mapping[str, list[object]]) -> None:
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".hash-cache.", dir=path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                json.dump({"version": _VERSION, "root": root, "entries": entries}, fh)
            os.replace(tmp, path)
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


def cached_manifest(
    root: str,
    files: Sequence[str],
    *,
    errors: Mapping[str, str] | None = None,
    truncated: bool = False,
    cache: Path | None = None,
    use_cache: bool = True,
) -> Manifest:
    """The manifest of ``files`` (relative to ``root``, from :func:`fingerprint.walk`)."""
    root = os.path.abspath(os.path.expanduser(root))
    path = cache if cache is not None else cache_file(root)
    old = _load(path, root) if use_cache else {}
    new: dict[str, list[object]] = {}
    manifest = Manifest(root=root, errors=dict(errors or {}), truncated=truncated)
    racy = time.time_ns() - RACY_NS
    for rel in files:
        full = os.path.join(root, rel)
        before = stamp(full)
        if before is None:
            manifest.errors[rel] = "cannot stat"
            continue
        entry = old.get(rel)
        if isinstance(entry, list) and len(entry) == 6 and tuple(entry[:5]) == before:
            digest = str(entry[5])
        else:
            try:
                digest = file_digest(full)
            except OSError as exc:
                manifest.errors[rel] = exc.strerror or str(exc)
                continue
            if stamp(full) != before:  # written while hashed: do not trust or cache it
                manifest.errors[rel] = "changed while hashed"
                continue
        manifest.files[rel] = digest
        manifest.size += before[0]
        if before[1] < racy and before[2] < racy:
            new[rel] = [*before, digest]
    if use_cache and new != old:
        _save(path, root, new)
    return manifest
