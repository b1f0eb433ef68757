"""Where corral keeps its own files on this machine: the server's database and
token, found the same way by the server (``corral serve``) and its clients."""

from __future__ import annotations

import os
from pathlib import Path


def data_dir() -> Path:
    """``$XDG_DATA_HOME/corral``; ``~/.local/share/corral`` when it is unset or
    relative (the XDG base directory spec ignores a relative one)."""
    base = Path(os.environ.get("XDG_DATA_HOME", ""))
    return (base if base.is_absolute() else Path.home() / ".local" / "share") / "corral"


def default_token_file() -> Path:
    """Where ``corral serve`` keeps its token by default, and where a client looks
    for it: ``$XDG_DATA_HOME/corral/token``."""
    return data_dir() / "token"


def token_path(token_file: str | None) -> Path:
    """``--token-file`` (``~`` expanded) when given, else :func:`default_token_file`."""
    return Path(token_file).expanduser() if token_file else default_token_file()


__all__ = ["data_dir", "default_token_file", "token_path"]
