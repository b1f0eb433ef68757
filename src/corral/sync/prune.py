"""``corral sync --delete`` on a host: remove files that are not in the pushed tree.

Standard library only (plus :mod:`corral.agent.fingerprint`): this module is
shipped to the hosts over stdin (see :mod:`corral.remote.python`).
The host walks its copy with the same rules as the coordinator, so files its
ignore rules exclude are left alone (like ``rsync --delete`` without
``--delete-excluded``); every other file whose path is not in the list read
from stdin (NUL-separated) is deleted, then the directories that deletion
emptied are removed. One JSON line reports what was done.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterable

from corral.agent.fingerprint import walk


def _parents(rel: str) -> Iterable[str]:
    parent = os.path.dirname(rel)
    while parent:
        yield parent
        parent = os.path.dirname(parent)


def prune(root: str, keep: set[bytes], *, dry_run: bool = False) -> dict[str, object]:
    """Delete the files under ``root`` that the walk finds and ``keep`` lacks."""
    root = os.path.expanduser(root)
    if os.path.realpath(root) == os.path.realpath(os.sep):
        return {"error": "refusing to prune the root directory"}
    if not os.path.isdir(root):
        return {"deleted": [], "dirs": 0, "errors": {}, "missing": True}
    files, unreadable, truncated = walk(root)
    errors: dict[str, str] = {}
    deleted: list[str] = []
    emptied: set[str] = set()
    for rel in files:
        if os.fsencode(rel) in keep:
            continue
        if not dry_run:
            try:
                os.unlink(os.path.join(root, rel))
            except FileNotFoundError:
                pass
            except OSError as exc:
                errors[rel] = exc.strerror or str(exc)
                continue
        deleted.append(rel)
        emptied.update(_parents(rel))
    dirs = 0
    for rel in sorted(emptied, key=lambda d: d.count("/"), reverse=True):
        if dry_run:
            continue
        try:
            os.rmdir(os.path.join(root, rel))
            dirs += 1
        except OSError:
            pass  # not empty (ignored or kept files live there), or gone
    return {
        "deleted": deleted,
        "dirs": dirs,
        "errors": errors,  # paths that could not be deleted -> why
        "unreadable": unreadable,  # directories the walk could not read -> why
        "truncated": truncated,
    }


def main(root: str, dry_run: bool = False) -> int:
    """Entry point on the host: the keep list on stdin, the report on stdout."""
    data = sys.stdin.buffer.read()
    keep = {p for p in data.split(b"\0") if p}
    report = prune(root, keep, dry_run=dry_run)
    sys.stdout.write(json.dumps(report) + "\n")
    sys.stdout.flush()
    return 1 if "error" in report else 0
