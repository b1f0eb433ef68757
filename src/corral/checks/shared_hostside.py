"""The host side of the shared data path check (standard library only, shipped by
:mod:`corral.remote.python`).

:func:`main` is one session per host: it prints one JSON line describing the
path (exists, filesystem type and source, mount point, device, free space, the
machine's boot id), then answers one JSON line per request until stdin closes:

- ``{"op": "write", "name", "content"}``: create the marker file ``name`` in the
  path (exclusively, flushed to the server) with ``content``;
- ``{"op": "read", "name"}``: whether this host sees the marker, and its content;
- ``{"op": "remove"}``: remove the marker this session wrote.

A marker this session wrote is removed when stdin closes, whatever happened.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from typing import Any

MAX_MARKER_BYTES = 4096


def _emit(event: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()


def _unescape(field: str) -> str:
    """A mountinfo field with its octal escapes (``\\040`` for a space) decoded."""
    if "\\" not in field:
        return field
    raw = field.encode()
    out = bytearray()
    i = 0
    while i < len(raw):
        if raw[i : i + 1] == b"\\" and raw[i + 1 : i + 4].isdigit():
            out.append(int(raw[i + 1 : i + 4], 8))
            i += 4
        else:
            out.append(raw[i])
            i += 1
    return out.decode(errors="replace")


def parse_mountinfo(text: str) -> list[dict[str, str]]:
    """The mounts of a ``/proc/self/mountinfo`` text, in order: device (major:minor),
    root (within the filesystem), mount point, type and source."""
    mounts = []
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        cols, tail = left.split(), right.split()
        if not sep or len(cols) < 5 or len(tail) < 2:
            continue
        mounts.append(
            {
                "device": cols[2],
                "root": _unescape(cols[3]),
                "mount_point": _unescape(cols[4]),
                "type": tail[0],
                "source": _unescape(tail[1]),
            }
        )
    return mounts


def mount_of(path: str, mounts: list[dict[str, str]]) -> dict[str, str] | None:
    """The mount that holds the absolute, resolved ``path``: the longest mount point
    above it, the last mounted on that point (the one on top)."""
    best: dict[str, str] | None = None
    for mount in mounts:
        point = mount["mount_point"]
        inside = path == point or path.startswith(point.rstrip("/") + "/")
        if inside and (best is None or len(point) >= len(best["mount_point"])):
            best = mount
    return best


def _df_mount(path: str) -> dict[str, str] | None:
    """Without /proc (macOS): source and mount point from ``df -P``, type from ``mount``."""
    try:
        df = subprocess.run(["df", "-P", path], capture_output=True, text=True, timeout=10)
        lines = df.stdout.splitlines()
        if df.returncode != 0 or len(lines) < 2:
            return None
        cols = lines[1].split()
        source, point = cols[0], cols[-1]
        listing = subprocess.run(["mount"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError, IndexError):
        return None
    kind = "unknown"
    for line in listing.splitlines():
        if f" on {point} (" in line:
            kind = line.rsplit(" (", 1)[1].split(",")[0].rstrip(")")
    return {"device": "", "root": "/", "mount_point": point, "type": kind, "source": source}


def filesystem(path: str) -> dict[str, str] | None:
    """The mount that holds ``path`` (which exists): type, source, mount point, root."""
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as fh:
            mounts = parse_mountinfo(fh.read())
    except OSError:
        return _df_mount(path)
    return mount_of(path, mounts)


def _boot_id() -> str | None:
    with contextlib.suppress(OSError), open("/proc/sys/kernel/random/boot_id") as fh:
        return fh.read().strip() or None
    return None


def describe(path: str) -> dict[str, Any]:
    """What this host has at ``path``: whether it is a directory, its filesystem,
    device and free space (of the nearest existing parent when it is missing)."""
    full = os.path.abspath(os.path.expanduser(path))
    info: dict[str, Any] = {"event": "facts", "path": full, "boot_id": _boot_id()}
    info["exists"] = os.path.exists(full)
    info["is_dir"] = os.path.isdir(full)
    if info["exists"] and not info["is_dir"]:
        info["error"] = "is not a directory"
    existing = full
    while not os.path.exists(existing) and existing != os.path.dirname(existing):
        existing = os.path.dirname(existing)
    real = os.path.realpath(existing)
    info["realpath"] = real
    info["fs"] = filesystem(real)
    try:
        st = os.stat(real)
        info["device"] = f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}"
        vfs = os.statvfs(real)
        info["free_bytes"] = vfs.f_bavail * vfs.f_frsize
        info["total_bytes"] = vfs.f_blocks * vfs.f_frsize
    except OSError as exc:
        info["error"] = f"cannot stat {real}: {exc.strerror or exc}"
    return info


def write_marker(path: str, name: str, content: str) -> dict[str, Any]:
    """Create the marker ``name`` in ``path`` with ``content``, durably."""
    full = os.path.join(os.path.abspath(os.path.expanduser(path)), name)
    try:
        fd = os.open(full, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except OSError as exc:
        return {"event": "write", "ok": False, "error": f"cannot write in {path}: {exc.strerror}"}
    try:
        os.write(fd, content.encode())
        os.fsync(fd)
    except OSError as exc:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(full)
        return {"event": "write", "ok": False, "error": f"cannot write in {path}: {exc.strerror}"}
    os.close(fd)
    return {"event": "write", "ok": True, "file": full}


def read_marker(path: str, name: str) -> dict[str, Any]:
    """Whether the marker ``name`` is in ``path`` here, and what it holds."""
    directory = os.path.abspath(os.path.expanduser(path))
    full = os.path.join(directory, name)
    for attempt in range(2):
        try:
            with open(full, "rb") as fh:
                data = fh.read(MAX_MARKER_BYTES)
            return {"event": "read", "found": True, "content": data.decode(errors="replace")}
        except FileNotFoundError:
            if attempt == 0:  # a listing revalidates a network filesystem's cached directory
                with contextlib.suppress(OSError):
                    os.listdir(directory)
        except OSError as exc:
            return {"event": "read", "found": False, "error": exc.strerror or str(exc)}
    return {"event": "read", "found": False}


def _remove(written: str | None) -> dict[str, Any]:
    if written is None:
        return {"event": "remove", "ok": True}
    try:
        os.unlink(written)
    except FileNotFoundError:
        pass
    except OSError as exc:
        return {"event": "remove", "ok": False, "error": f"{written}: {exc.strerror or exc}"}
    return {"event": "remove", "ok": True}


def main(params: dict[str, Any]) -> int:
    """Describe the path, then answer write / read / remove requests until EOF."""
    path = str(params["path"])
    _emit(describe(path))
    written: str | None = None
    try:
        for line in sys.stdin:
            try:
                request = json.loads(line)
            except ValueError:
                continue
            op = request.get("op")
            if op == "write":
                reply = write_marker(path, str(request["name"]), str(request["content"]))
                written = reply.get("file") or written
            elif op == "read":
                reply = read_marker(path, str(request["name"]))
            elif op == "remove":
                reply, written = _remove(written), None
            else:
                reply = {"event": "error", "error": f"unknown op {op!r}"}
            _emit(reply)
    finally:
        _remove(written)
    return 0
