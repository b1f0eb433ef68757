"""Files and directories readable by their owner only (dirs 0700, files 0600).

A job's files hold its output, its commands and (redacted) environment: another
local user must not read them. Modes are applied with ``chmod`` too, so a file or
directory that already existed with looser bits is tightened.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import IO

DIR_MODE = 0o700
FILE_MODE = 0o600


def private_dir(path: Path) -> Path:
    """Make ``path`` (and missing parents) and restrict it to its owner; returns it."""
    path.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    os.chmod(path, DIR_MODE)
    return path


def _open_fd(path: Path, flags: int) -> int:
    fd = os.open(path, flags | os.O_WRONLY | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), FILE_MODE)
    try:
        os.fchmod(fd, FILE_MODE)
    except OSError:
        os.close(fd)
        raise
    return fd


def append_private(path: Path) -> IO[bytes]:
    """Open ``path`` for appending bytes, ``0600``."""
    return os.fdopen(_open_fd(path, os.O_APPEND), "ab")


def write_private(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` atomically (a reader never sees half a file), ``0600``."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with os.fdopen(_open_fd(tmp, os.O_TRUNC), "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


__all__ = ["DIR_MODE", "FILE_MODE", "append_private", "private_dir", "write_private"]
