"""The one way corral makes a rich Console for its own output.

On a terminal, rich wraps to the terminal's width as usual. When the stream is
not a terminal (a pipe, ``| tee``, a CI log) nothing is ever wrapped: lines are
as long as they are, tables are as wide as their widest cell, so a log can be
grepped and a root cause read back whole.
"""

from __future__ import annotations

import sys
from typing import IO

from rich.console import Console

#: Width used off a terminal: wider than any line corral prints, so nothing wraps.
UNWRAPPED_WIDTH = 100_000


def make_console(*, stderr: bool = True, file: IO[str] | None = None) -> Console:
    """A Console for ``stderr`` (default) or stdout, or ``file``; unwrapped unless a
    terminal."""
    stream = file if file is not None else (sys.stderr if stderr else sys.stdout)
    isatty = getattr(stream, "isatty", None)
    if isatty is not None and isatty():
        return Console(file=stream, highlight=False)
    return Console(file=stream, highlight=False, width=UNWRAPPED_WIDTH, soft_wrap=True)


__all__ = ["UNWRAPPED_WIDTH", "make_console"]
