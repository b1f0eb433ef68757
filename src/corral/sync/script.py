"""The user's sync script (``--sync-script PATH``), run on the coordinator first.

Semantics (seed 000, "pre-RDMA sync"): a script that exits non-zero *blocks*
(``corral sync`` pushes nothing and exits 1; ``corral run --sync`` does not
launch); a script that does not exist is a warning and the sync goes on.

The script runs here, in the current directory, with our environment plus:
``CORRAL_HOSTS`` (the ``--hosts`` value, so nested ``corral`` commands reach the
same cluster), ``CORRAL_HOST_NAMES`` (the host names, space-separated),
``CORRAL_SYNC_SRC`` and ``CORRAL_SYNC_DEST``. A file without the execute bit is
run by the interpreter on its ``#!`` line, else by ``/bin/sh``. Its output is
passed on line by line, prefixed ``[sync-script]``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
import signal
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from corral.sync.procs import drain, kill_group, spawn

__all__ = [
    "PREFIX",
    "ScriptResult",
    "ScriptStatus",
    "run_sync_script",
    "script_argv",
]

PREFIX = "[sync-script] "
TAIL_LINES = 20
_CHUNK = 64 * 1024

ScriptStatus = Literal["ok", "missing", "failed"]


@dataclass(frozen=True)
class ScriptResult:
    """How the sync script went. ``blocks`` is True when nothing may proceed."""

    path: str
    status: ScriptStatus
    exit_code: int | None = None
    seconds: float = 0.0
    tail: list[str] = field(default_factory=list)  # last lines of its output
    message: str = ""

    @property
    def blocks(self) -> bool:
        """Whether the sync (and a launch after it) must stop."""
        return self.status == "failed"

    def to_json(self) -> dict[str, object]:
        """JSON-ready form."""
        return {
            "path": self.path,
            "status": self.status,
            "exit_code": self.exit_code,
            "seconds": round(self.seconds, 3),
            "message": self.message,
            "tail": self.tail,
        }


def script_argv(path: Path) -> list[str]:
    """How to run ``path``: directly when executable, else by its ``#!`` interpreter
    (or ``/bin/sh`` without one)."""
    if os.access(path, os.X_OK):
        return [str(path)]
    try:
        with open(path, "rb") as fh:
            first = fh.readline(256)
    except OSError:
        first = b""
    if first.startswith(b"#!"):
        words = shlex.split(first[2:].decode(errors="replace").strip())
        if words:
            return [*words, str(path)]
    return ["/bin/sh", str(path)]


def _exit_text(code: int) -> str:
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-code).name}"
        return f"killed by signal {-code}"
    return f"exit code {code}"


async def run_sync_script(
    path: str | os.PathLike[str],
    *,
    hosts_spec: str = "",
    host_names: Sequence[str] = (),
    src: str = "",
    dest: str = "",
    env: Mapping[str, str] | None = None,
    on_line: Callable[[str], None] | None = None,
    cwd: str | None = None,
) -> ScriptResult:
    """Run the sync script to completion; never raises for the script's own failure.

    ``on_line`` gets each output line (stdout and stderr merged, prefix added);
    ``env`` adds variables to ours. Cancelling kills the script's process group.
    """
    file = Path(path).expanduser()
    shown = str(path)
    if not file.is_file():
        why = "is a directory" if file.is_dir() else "not found"
        return ScriptResult(
            path=shown,
            status="missing",
            message=f"sync script {shown} {why}; continuing without it",
        )
    full_env = dict(os.environ)
    full_env.update(
        CORRAL_HOSTS=hosts_spec,
        CORRAL_HOST_NAMES=" ".join(host_names),
        CORRAL_SYNC_SRC=src,
        CORRAL_SYNC_DEST=dest,
    )
    full_env.update(env or {})
    started = time.monotonic()
    try:
        proc = await spawn(
            *script_argv(file),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            env=full_env,
            cwd=cwd,
        )
    except OSError as exc:
        return ScriptResult(
            path=shown,
            status="failed",
            seconds=time.monotonic() - started,
            message=f"sync script {shown} could not be started: {exc.strerror or exc}",
        )
    tail: deque[str] = deque(maxlen=TAIL_LINES)

    def emit(raw: bytes) -> None:
        line = raw.decode(errors="replace").rstrip("\r")
        tail.append(line)
        if on_line is not None:
            on_line(PREFIX + line)

    try:
        assert proc.stdout is not None
        buf = b""
        while chunk := await proc.stdout.read(_CHUNK):
            *lines, buf = (buf + chunk).split(b"\n")
            for raw in lines:
                emit(raw)
        if buf:
            emit(buf)
        code = await proc.wait()
    except BaseException:
        await kill_group(proc)
        await drain(proc)
        raise
    seconds = time.monotonic() - started
    if code == 0:
        return ScriptResult(path=shown, status="ok", exit_code=0, seconds=seconds, tail=list(tail))
    last = f": {tail[-1]}" if tail else ""
    return ScriptResult(
        path=shown,
        status="failed",
        exit_code=code,
        seconds=seconds,
        tail=list(tail),
        message=f"sync script {shown} failed ({_exit_text(code)}){last}",
    )
