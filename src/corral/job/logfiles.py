"""The coordinator's copy of every rank's output: ``<run_dir>/<job>/logs/<host>.<rank>.log``.

Bytes are written exactly as the rank wrote them (progress-bar ``\\r`` updates
included), node-level output (torchrun's own) to ``<host>.node.log``. The
directory is private to the job's user (0700, files 0600): a job's output may
hold anything the script prints. Each file is flushed within a moment of a write
(:class:`~corral.logflush.FlushSoon`), so ``tail -f`` follows a running rank.

With :data:`OUTPUT_LIMIT_ENV` set (``corral serve`` sets it for every job: a job's
ranks are whoever submitted it), a job keeps at most that many bytes of output here,
over all its attempts; past it one line says so and the rest is dropped (a rank
printing without end does not fill the coordinator's disk).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import IO

from corral.fleet.logs import ATTEMPT_INDEX as ATTEMPT_INDEX  # its format: corral logs reads it
from corral.logflush import FlushSoon
from corral.private import append_private, private_dir

NODE_RANK_LABEL = -1
OUTPUT_LIMIT_ENV = "CORRAL_JOB_OUTPUT_LIMIT"
"""Bytes of output a job keeps on the coordinator (unset: no limit)."""


def output_limit() -> int | None:
    """The limit of :data:`OUTPUT_LIMIT_ENV` (None: unset, not a number, or 0)."""
    try:
        value = int(os.environ.get(OUTPUT_LIMIT_ENV, ""))
    except ValueError:
        return None
    return value if value > 0 else None


class LogFiles:
    """Appends each rank's output to its own file (opened on first use)."""

    def __init__(self, log_dir: Path, attempt: int = 0) -> None:
        self.log_dir = private_dir(log_dir)
        self.attempt = attempt
        self._files: dict[tuple[str, int], IO[bytes]] = {}
        self._index: IO[bytes] | None = None
        self._soon = FlushSoon()
        self.limit = output_limit()
        # the attempts before this one count too (their files are in log_dir)
        self.kept = _bytes_in(self.log_dir) if self.limit is not None else 0
        self.full = self.limit is not None and self.kept >= self.limit

    def path(self, host: str, rank: int) -> Path:
        """The log file of one rank (or the node's own output for ``rank`` -1)."""
        name = f"{host}.node.log" if rank == NODE_RANK_LABEL else f"{host}.{rank}.log"
        return self.log_dir / name

    def write(self, host: str, rank: int, data: bytes) -> bool:
        """Append ``data`` to the rank's file; False (nothing written) once the job's
        output is over its limit (the write that crosses it adds a line saying so)."""
        if self.full:
            return False
        if self.limit is not None and self.kept + len(data) > self.limit:
            self.full = True
            data = (
                f"\n[corral] this job's output passed {self.limit} bytes: the rest is not "
                f"kept on the coordinator ({OUTPUT_LIMIT_ENV})\n"
            ).encode()
        self.kept += len(data)
        self._append(host, rank, data)
        return not self.full

    def _append(self, host: str, rank: int, data: bytes) -> None:
        key = (host, rank)
        handle = self._files.get(key)
        if handle is None:
            path = self.path(host, rank)
            handle = self._files[key] = append_private(path)
            self._mark(path.name, os.fstat(handle.fileno()).st_size)
        handle.write(data)
        self._soon.wrote(handle)

    def _mark(self, name: str, offset: int) -> None:
        """Record that this attempt's output in ``name`` begins at ``offset``."""
        if self._index is None:
            self._index = append_private(self.log_dir / ATTEMPT_INDEX)
        entry = {"attempt": self.attempt, "file": name, "offset": offset}
        self._index.write(json.dumps(entry).encode() + b"\n")
        self._index.flush()

    def flush(self) -> None:
        """Flush every open file."""
        self._soon.flush()
        for handle in self._files.values():
            handle.flush()

    def close(self) -> None:
        """Close every file."""
        self._soon.flush()
        for handle in self._files.values():
            handle.close()
        self._files.clear()
        if self._index is not None:
            self._index.close()
            self._index = None


def _bytes_in(log_dir: Path) -> int:
    """The bytes of the log files already in ``log_dir``."""
    total = 0
    for path in log_dir.glob("*.log"):
        try:
            total += path.stat().st_size
        except OSError:
            continue
    return total
