"""Files the node agent writes in its node dir: readable by the job's user only.

The node dir is ``0700`` and every file in it ``0600`` (also when it already
existed with looser bits, e.g. from an earlier attempt). ``spec.json`` holds the
start message with secret env values redacted (:mod:`corral.redact`); the real
values stay in the agent's memory and the ranks' environment.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import IO, Any

from corral.redact import redact_env

DIR_MODE = 0o700
FILE_MODE = 0o600


def private_dir(path: Path) -> None:
    """Make ``path`` (and missing parents) and restrict it to its owner."""
    path.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    os.chmod(path, DIR_MODE)


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
    """Replace the contents of ``path`` with ``text``, ``0600``."""
    with os.fdopen(_open_fd(path, os.O_TRUNC), "w", encoding="utf-8") as fh:
        fh.write(text)


def redacted_node(node: dict[str, Any]) -> dict[str, Any]:
    """The start message's node description with every secret env value redacted
    (the keys named like secrets and those listed in its ``secret_env``)."""
    extra = tuple(node.get("secret_env") or ())
    redacted = dict(node)
    redacted["env"] = redact_env(node.get("env") or {}, extra)
    redacted["ranks"] = [
        {**spec, "env": redact_env(spec.get("env") or {}, extra)}
        for spec in node.get("ranks") or []
    ]
    return redacted


__all__ = ["append_private", "private_dir", "redacted_node", "write_private"]
