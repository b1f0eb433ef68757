"""Reading a job's logs after the fact: the coordinator's copies, or the host-side
copies each node agent kept (fetched over the job's transport, e.g. after a cut
link came back).
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


@dataclass(frozen=True)
class LogFile:
    """One rank's (or a node's own) log: ``rank`` is None for node-level output."""

    host: str
    rank: int | None
    path: Path


def load_job(run_dir: Path, job_id: str) -> dict[str, Any]:
    """The job's ``job.json``; ConfigError if there is no such job."""
    path = run_dir / job_id / "job.json"
    try:
        data: dict[str, Any] = json.loads(path.read_text())
    except FileNotFoundError:
        known = (
            sorted(p.parent.name for p in run_dir.glob("*/job.json")) if run_dir.is_dir() else []
        )
        raise ConfigError(
            f"no job {job_id!r} in {run_dir} (looked for {path}); "
            + (f"known jobs: {', '.join(p for p in known[-5:])}" if known else "no jobs there")
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
