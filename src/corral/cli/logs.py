"""``corral logs [JOB]``: print a job's per-rank logs (coordinator or host-side copies).

``JOB`` left out, or ``latest``, is the job that ran last in the run dir. When the job
ran more than once (restarts, or reruns of its id), a marker line opens each attempt's
output in every file.
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path
from typing import Annotated

import typer

from corral.cli.common import ssh_flags
from corral.cluster.model import Host
from corral.errors import ConfigError
from corral.fleet.logs import (
    LATEST,
    LogFile,
    attempt_offsets,
    attempt_segments,
    attempt_starts,
    coordinator_logs,
    fetch_host_logs,
    load_job,
    resolve_job_id,
    split_teardown,
    teardown_offsets,
)
from corral.job.fold import fold_note
from corral.job.output import prefix_for
from corral.transport.base import Transport
from corral.transport.local import LocalTransport
from corral.transport.options import SshOptions


def _transport(job: dict[str, object], given: SshOptions) -> Transport:
    hosts = job.get("hosts") or []
    assert isinstance(hosts, list)
    if all(h.get("local") for h in hosts):
        return LocalTransport()
    from corral.transport.ssh import SshTransport

    saved = job.get("ssh") or {}
    assert isinstance(saved, dict)
    options = SshOptions(
        user=saved.get("user"),
        key=given.key or saved.get("key"),
        port=saved.get("port"),
        config=given.config or saved.get("config"),
        password_env=given.password_env or saved.get("password_env"),
        # the host-key policy the job itself ran with (never looser than the user chose)
        accept_new_host_keys=bool(saved.get("accept_new_host_keys")),
        insecure_no_host_key_check=bool(saved.get("insecure_no_host_key_check")),
    )
    return SshTransport.from_options(options)


def _marker(attempt: int | None, starts: dict[int, float]) -> bytes:
    """The line that opens one attempt's output."""
    if attempt is None:
        return b"[corral] ---- earlier attempt(s), not told apart ----"
    started = starts.get(attempt)
    when = (
        f", started {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(started))}"
        if started is not None
        else ""
    )
    return f"[corral] ---- attempt {attempt}{when} ----".encode()


def _print(
    files: list[LogFile],
    marks: dict[str, list[tuple[int, int]]],
    starts: dict[int, float],
    teardowns: dict[str, list[int]] | None = None,
) -> None:
    """Every file's lines, prefixed; with more than one attempt on record, a marker line
    before each attempt's output (``marks``: see :func:`attempt_offsets`). A node's
    output after its teardown began (``teardowns``) is folded into one line."""
    attempts = set(starts) | {a for found in marks.values() for _, a in found}
    out = sys.stdout.buffer
    for log in files:
        prefix = (prefix_for(log.host, -1 if log.rank is None else log.rank) + " ").encode()
        for segment in attempt_segments(log.path.read_bytes(), marks.get(log.path.name, [])):
            if len(attempts) > 1:
                out.write(prefix + _marker(segment.attempt, starts) + b"\n")
            shown, folded = split_teardown(segment, (teardowns or {}).get(log.path.name, []))
            for line in shown.splitlines():
                out.write(prefix + line + b"\n")
            if folded:
                out.write(prefix + b"[corral] " + fold_note(log.host, folded).encode() + b"\n")
    out.flush()


@ssh_flags("key", "config", "password_env")
def logs(
    job_id: Annotated[
        str | None,
        typer.Argument(
            metavar="[JOB]",
            help=f"The job id (see runs/); {LATEST} or none: the job that ran last.",
            show_default=False,
        ),
    ] = None,
    host: Annotated[str | None, typer.Option("--host", help="Only this host.")] = None,
    rank: Annotated[int | None, typer.Option("--rank", help="Only this global rank.")] = None,
    from_hosts: Annotated[
        bool,
        typer.Option(
            "--from-hosts",
            help="Fetch the copies each host kept (e.g. after a lost "
            "link) into runs/<job>/host-logs/ and print them.",
        ),
    ] = False,
    run_dir: Annotated[str, typer.Option("--run-dir", envvar="CORRAL_RUN_DIR")] = "runs",
    ssh: SshOptions = SshOptions(),  # noqa: B008 (--ssh-key, --ssh-config, --ssh-password-env)
) -> None:
    """Print a job's logs, each line prefixed [host:rank]. A marker line opens each attempt."""
    root = Path(run_dir)
    job_id = resolve_job_id(root, job_id)
    job = load_job(root, job_id)
    if from_hosts:
        hosts = [
            Host(
                name=h["name"],
                address=h["address"],
                port=h.get("port"),
                user=h.get("user"),
                local=bool(h.get("local")),
            )
            for h in job["hosts"]
            if host is None or h["name"] == host
        ]
        if not hosts:
            raise ConfigError(f"job {job_id} has no host {host!r}", option="--host")
        node_dirs = {h["name"]: h["node_dir"] for h in job["hosts"]}
        transport = _transport(job, ssh)

        async def fetch() -> list[LogFile]:
            try:
                return await fetch_host_logs(
                    transport, hosts, node_dirs, root / job_id / "host-logs"
                )
            finally:
                await transport.close()

        files = asyncio.run(fetch())
        marks: dict[str, list[tuple[int, int]]] = {}
        starts: dict[int, float] = {}
        teardowns: dict[str, list[int]] = {}
    else:
        files = coordinator_logs(root, job_id)
        marks = attempt_offsets(root / job_id / "logs")
        starts = attempt_starts(root, job_id)
        teardowns = teardown_offsets(root / job_id / "logs")
        if len(starts) > 1 and not marks:
            print(
                f"note: job {job_id} ran {len(starts)} attempts; its logs do not record "
                "where each began",
                file=sys.stderr,
            )
    files = [
        f for f in files if (host is None or f.host == host) and (rank is None or f.rank == rank)
    ]
    if not files:
        what = " ".join(
            x
            for x in (f"host {host}" if host else "", f"rank {rank}" if rank is not None else "")
            if x
        )
        raise ConfigError(f"job {job_id} has no logs{' for ' + what if what else ''}")
    _print(files, marks, starts, teardowns)


def register(app: typer.Typer) -> None:
    """Add ``logs`` to the root app."""
    app.command("logs")(logs)
