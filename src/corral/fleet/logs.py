"""Reading a job's logs after the fact: the coordinator's copies, or the host-side
copies each node agent kept (fetched over the job's transport, e.g. after a cut
link came back).

A coordinator log file is appended to by every attempt of its job. Where each
attempt's output begins is kept beside the logs in ``logs/attempts.jsonl``, one
JSON object per line, ``{"attempt": N, "file": "<host>.<rank>.log", "offset": K}``
(``K``: the file's size when attempt ``N`` first wrote to it), so the attempts
can be told apart afterwards (:func:`attempt_segments`). Where a node's teardown
began in its ``<host>.node.log`` is kept there too (``{"attempt": N, "file": ...,
"teardown": K}``, see :mod:`corral.job.fold`): what the launcher printed after it
is folded into one line (:func:`split_teardown`).
"""

from __future__ import annotations

import asyncio
import json
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from corral.cluster.model import Host
from corral.errors import ConfigError, LaunchError
from corral.transport.base import Transport

_COORD_LOG = re.compile(r"^(?P<host>.+)\.(?P<rank>\d+|node)\.log$")
_HOST_LOG = re.compile(r"^rank-(?P<rank>\d+)\.log$|^node\.log$")
LATEST = "latest"
#: Where each attempt's output begins in each log file, in the job's ``logs/`` directory
#: (written by :class:`corral.job.logfiles.LogFiles`).
ATTEMPT_INDEX = "attempts.jsonl"
_RUN_DIR_HINT = "pass --run-dir (or set CORRAL_RUN_DIR) if the job ran elsewhere"


@dataclass(frozen=True)
class LogFile:
    """One rank's (or a node's own) log: ``rank`` is None for node-level output."""

    host: str
    rank: int | None
    path: Path


def _jobs(run_dir: Path) -> list[Path]:
    """The ``job.json`` of every job in ``run_dir``, oldest first (by when it was written:
    each attempt rewrites it, so the last one is the job that ran last)."""
    if not run_dir.is_dir():
        return []
    found = []
    for path in run_dir.glob("*/job.json"):
        try:
            found.append((path.stat().st_mtime, path.parent.name, path))
        except OSError:
            continue
    return [path for _, _, path in sorted(found)]


def resolve_job_id(run_dir: Path, job_id: str | None) -> str:
    """``job_id`` itself, or for None and ``latest`` (when no job has that id) the job in
    ``run_dir`` that ran last; ConfigError naming the directory when there is none."""
    if job_id is not None and (job_id != LATEST or (run_dir / job_id / "job.json").exists()):
        return job_id
    jobs = _jobs(run_dir)
    if not jobs:
        where = run_dir.resolve()
        what = "no jobs in" if run_dir.is_dir() else "no run directory"
        raise ConfigError(f"{what} {where}; {_RUN_DIR_HINT}")
    return jobs[-1].parent.name


def load_job(run_dir: Path, job_id: str) -> dict[str, Any]:
    """The job's ``job.json``; ConfigError if there is no such job."""
    path = run_dir / job_id / "job.json"
    try:
        data: dict[str, Any] = json.loads(path.read_text())
    except FileNotFoundError:
        known = [p.parent.name for p in _jobs(run_dir)]
        raise ConfigError(
            f"no job {job_id!r} in {run_dir.resolve()}; "
            + (f"latest jobs: {', '.join(known[-5:])}" if known else "no jobs there")
            + f"; {_RUN_DIR_HINT}"
        ) from None
    except ValueError as exc:
        raise ConfigError(f"{path} is not valid JSON: {exc}") from exc
    return data


def coordinator_logs(run_dir: Path, job_id: str) -> list[LogFile]:
    """The logs corral wrote while it supervised the job."""
    files = []
    for path in sorted((run_dir / job_id / "logs").glob("*.log")):
        m = _COORD_LOG.match(path.name)
        if m:
            rank = None if m.group("rank") == "node" else int(m.group("rank"))
            files.append(LogFile(m.group("host"), rank, path))
    return sorted(files, key=lambda f: (f.host, -1 if f.rank is None else f.rank))


@dataclass(frozen=True)
class Segment:
    """A stretch of one log file written by one attempt (``attempt`` None: unknown),
    beginning at byte ``start`` of the file."""

    attempt: int | None
    data: bytes
    start: int = 0


def attempt_offsets(log_dir: Path) -> dict[str, list[tuple[int, int]]]:
    """Per log file name, ``(offset, attempt)`` where each attempt's output begins, in
    file order (from ``attempts.jsonl``; empty when there is none, damaged lines skipped)."""
    found: dict[str, list[tuple[int, int]]] = {}
    for item in _index(log_dir):
        try:
            name, offset, attempt = str(item["file"]), int(item["offset"]), int(item["attempt"])
        except (ValueError, TypeError, KeyError):
            continue
        found.setdefault(name, []).append((offset, attempt))
    return {name: sorted(set(marks)) for name, marks in found.items()}


def _index(log_dir: Path) -> list[dict[str, Any]]:
    """The entries of ``attempts.jsonl`` (damaged lines skipped)."""
    try:
        lines = (log_dir / ATTEMPT_INDEX).read_text(errors="replace").splitlines()
    except OSError:
        return []
    found = []
    for line in lines:
        try:
            item = json.loads(line)
        except ValueError:
            continue
        if isinstance(item, dict):
            found.append(item)
    return found


def teardown_offsets(log_dir: Path) -> dict[str, list[int]]:
    """Per node log file name, the byte offsets where a node's teardown began (one per
    attempt that tore it down), in file order."""
    found: dict[str, set[int]] = {}
    for item in _index(log_dir):
        try:
            name, offset = str(item["file"]), int(item["teardown"])
        except (ValueError, TypeError, KeyError):
            continue
        found.setdefault(name, set()).add(offset)
    return {name: sorted(offsets) for name, offsets in found.items()}


def split_teardown(segment: Segment, offsets: list[int]) -> tuple[bytes, int]:
    """The segment's output before its node's teardown began, and how many lines
    came after (the launcher's teardown output, which the views fold)."""
    cut = next((o for o in offsets if segment.start <= o < segment.start + len(segment.data)), None)
    if cut is None:
        return segment.data, 0
    rest = segment.data[cut - segment.start :]
    return segment.data[: cut - segment.start], len(rest.splitlines())


def attempt_segments(data: bytes, marks: list[tuple[int, int]]) -> list[Segment]:
    """``data`` (one log file) split where each attempt began; output written before the
    first mark (an older corral kept no index) is a segment of unknown attempt."""
    segments = []
    first = marks[0][0] if marks else len(data)
    if first > 0:
        segments.append(Segment(None, data[:first]))
    for i, (offset, attempt) in enumerate(marks):
        end = marks[i + 1][0] if i + 1 < len(marks) else len(data)
        if end > offset:
            segments.append(Segment(attempt, data[offset:end], offset))
    return segments


def attempt_starts(run_dir: Path, job_id: str) -> dict[int, float]:
    """When each attempt of the job started (``attempts.json``; empty when unreadable)."""
    try:
        records = json.loads((run_dir / job_id / "attempts.json").read_text())
        return {int(r["number"]): float(r["started"]) for r in records}
    except (OSError, ValueError, TypeError, KeyError):
        return {}


def _remote_dir(node_dir: str) -> str:
    if node_dir.startswith("~/"):
        return '"$HOME"/' + shlex.quote(node_dir[2:])
    return shlex.quote(node_dir)


async def _read(transport: Transport, host: Host, script: str) -> bytes:
    proc = await transport.start(host, ["sh", "-c", script])
    proc.close_stdin()
    out, err, code = await asyncio.gather(proc.stdout.read(), proc.stderr.read(), proc.wait())
    if code != 0:
        raise LaunchError(
            f"reading host-side logs failed: {err.decode(errors='replace').strip()}", host=host.name
        )
    return out


async def fetch_host_logs(
    transport: Transport, hosts: list[Host], node_dirs: dict[str, str], dest: Path
) -> list[LogFile]:
    """Copy every host's ``<node_dir>/logs/*.log`` to ``dest/<host>/``."""

    async def one(host: Host) -> list[LogFile]:
        logs = _remote_dir(node_dirs[host.name]) + "/logs"
        listing = await _read(transport, host, f"cd {logs} && ls -1")
        files = []
        for name in listing.decode().split():
            m = _HOST_LOG.match(name)
            if not m:
                continue
            data = await _read(transport, host, f"cat {logs}/{shlex.quote(name)}")
            target = dest / host.name / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
            rank = int(m.group("rank")) if m.group("rank") else None
            files.append(LogFile(host.name, rank, target))
        return files

    results = await asyncio.gather(*(one(h) for h in hosts))
    return [f for group in results for f in group]
