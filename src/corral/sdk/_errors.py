"""Per-rank JSON error files, so the supervisor can name the root cause.

The file is written to the path given, else ``CORRAL_ERROR_FILE``, else
torchrun's ``TORCHELASTIC_ERROR_FILE``. Its ``message`` and ``timestamp`` keys
are also what torchrun's own failure summary reads.
"""

from __future__ import annotations

import functools
import json
import os
import socket
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

from corral.contract import error_file_path, read_error_file
from corral.sdk._env import info

__all__ = ["error_file_path", "read_error_file", "record", "write_error_file"]

P = ParamSpec("P")
R = TypeVar("R")


def _exc_type(exc: BaseException) -> str:
    cls = type(exc)
    return (
        cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"
    )


def _message(exc: BaseException) -> str:
    if isinstance(exc, SystemExit):
        return f"exited with code {exc.code}"
    return str(exc) or _exc_type(exc)


def write_error_file(exc: BaseException, path: str | os.PathLike[str] | None = None) -> Path | None:
    """Atomically write ``exc`` as JSON to ``path`` (or the env's error file); return the path.

    Keys: ``rank``, ``local_rank``, ``host``, ``pid``, ``timestamp``, ``exc_type``,
    ``message``, ``traceback``. Returns None when there is no destination. Never
    raises: a write failure is printed to stderr so it cannot hide ``exc``.
    """
    target = path if path is not None else error_file_path()
    if not target:
        return None
    try:
        me = info()
        rank, local_rank = me.rank, me.local_rank
    except ValueError:
        rank = local_rank = -1
    data: dict[str, Any] = {
        "rank": rank,
        "local_rank": local_rank,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "timestamp": time.time(),
        "exc_type": _exc_type(exc),
        "message": _message(exc),
        "traceback": "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)),
    }
    final = Path(target)
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{final.name}.", suffix=".tmp", dir=final.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                json.dump(data, fh, indent=2)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, final)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    except OSError as err:
        print(f"[corral] could not write error file {final}: {err}", file=sys.stderr, flush=True)
        return None
    return final


def record(fn: Callable[P, R]) -> Callable[P, R]:
    """Decorate a main function: an uncaught exception is written to the error file, then re-raised.

    Recorded: any ``Exception`` and ``SystemExit`` with a non-zero code.
    ``KeyboardInterrupt`` (a teardown, not a cause) is not recorded.
    """

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return fn(*args, **kwargs)
        except SystemExit as exc:
            if exc.code not in (None, 0):
                write_error_file(exc)
            raise
        except Exception as exc:
            write_error_file(exc)
            raise

    return wrapper
