"""The supervisor process of one job started by ``corral serve``.

``python -m corral.service.launch`` reads the job's
:class:`~corral.job.describe.JobDescription` from stdin (the description stored
when the job was planned, exactly, with its secret env values beside it), builds
the job from it as ``corral run`` does (:func:`~corral.job.build.ready_job`:
pre-flight, agents, supervision, restarts, checkpoints, the no-orphan teardown,
trackers, and for a weighted job its drift monitor, whose warnings and rebalanced
weights are ``message`` events of the job) and appends every event to the job's
``events.jsonl`` (:mod:`corral.service.eventlog`). It runs in its own session, so
the server can crash or restart without stopping training; SIGTERM (the server's
stop) tears the job down like Ctrl-C does for ``corral run``
(:func:`~corral.job.build.drive`), a second SIGTERM kills. The description travels
over stdin so the job's secret env values never appear in argv or in a file; the
process exits with the job's exit code.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import psutil

from corral.cluster.model import Cluster, Host
from corral.errors import ConfigError, CorralError
from corral.job.build import drive, ready_job
from corral.job.describe import SOURCE, JobDescription, JobOptions
from corral.job.engine import Job
from corral.job.result import EXIT_LAUNCH
from corral.private import private_dir, write_private
from corral.redact import REDACTED, is_secret
from corral.service.eventlog import EVENTS_FILE, EventWriter, write_supervisor
from corral.signals import STOP_SIGNALS
from corral.transport.options import SshOptions

EXIT_CONFIG = 2


def handover(description: JobDescription) -> bytes:
    """What the supervisor reads on stdin: the description's JSON and, beside it,
    its secret env values (never in argv or a file)."""
    payload = {"description": description.to_dict(), "secrets": description.secrets()}
    return json.dumps(payload, separators=(",", ":")).encode()


def received(data: bytes | str) -> JobDescription:
    """The complete description of a :func:`handover` (ConfigError when it is not one,
    lacks a secret value, or has no job id)."""
    try:
        payload = json.loads(data)
    except ValueError as exc:
        raise ConfigError(f"is not JSON: {exc}", source=SOURCE) from exc
    if not isinstance(payload, dict) or set(payload) != {"description", "secrets"}:
        raise ConfigError("expected {description, secrets}", source=SOURCE)
    description = JobDescription.from_dict(payload["description"], payload["secrets"] or {})
    if not description.options.job_id:
        raise ConfigError("options.job_id: the supervisor runs a job with an id", source=SOURCE)
    return description.complete()


def stored_description(data: Mapping[str, Any]) -> JobDescription:
    """The description stored with a job (the ``launch`` column): a versioned
    description, or the launch request an older ``corral serve`` stored (converted;
    its redacted secret values are withheld). ConfigError for anything else."""
    if "version" in data or not {"job_id", "script", "hosts"} <= set(data):
        return JobDescription.from_dict(data)
    return _from_launch_request(data)


_OLD_OPTIONS = (
    "launcher",
    "command_template",
    "job_id",
    "python",
    "nproc_per_node",
    "master_addr",
    "master_port",
    "workdir",
    "nccl_interface",
    "gloo_interface",
    "timeout",
    "checkpoint_dir",
    "rdzv_timeout",
    "run_dir",
    "preflight",
    "smoke_test",
    "code_dir",
    "sync",
    "max_restarts",
    "restart_backoff",
    "min_nodes",
    "host_timeout",
    "hang_timeout",
    "replicate_checkpoints",
    "grace",
    "rebalance",
)
"""The fields of the old launch request that are JobOptions' fields of the same name."""


def _from_launch_request(data: Mapping[str, Any]) -> JobDescription:
    """The description of an old-shape stored launch request (corral serve before the
    versioned description)."""
    known = {*_OLD_OPTIONS, "script", "args", "env", "secret_env", "hosts", "ssh"}
    unknown = sorted(set(data) - known - {"workload_weights"})
    if unknown:
        raise ConfigError(
            f"an old launch request with unknown fields {', '.join(unknown)}", source=SOURCE
        )
    secret_env = tuple(data.get("secret_env") or ())
    env = dict(data.get("env") or {})
    withheld = tuple(k for k, v in env.items() if v == REDACTED and is_secret(k, secret_env))
    try:
        options = JobOptions(
            command=(str(data["script"]), *(str(a) for a in data.get("args") or ())),
            env={k: v for k, v in env.items() if k not in withheld},
            secret_env=secret_env,
            workload_weights=tuple(float(w) for w in data.get("workload_weights") or ()),
            **{name: data[name] for name in _OLD_OPTIONS if name in data},
        )
        hosts = tuple(Host(**h) for h in data["hosts"])
        ssh = SshOptions(**(data.get("ssh") or {}))
    except (TypeError, ValueError) as exc:
        raise ConfigError(
            f"an old launch request that does not load: {exc}", source=SOURCE
        ) from exc
    return JobDescription(options, Cluster(hosts, source="corral serve"), ssh, withheld)


def job_of(description: JobDescription) -> Job:
    """The engine's :class:`~corral.job.engine.Job` of ``description``, built as
    ``corral run`` builds its job (:func:`~corral.job.build.ready_job`)."""
    return ready_job(description)


def job_dir(run_dir: str | Path, job_id: str) -> Path:
    """Where a job's files live: ``<run_dir>/<job_id>``."""
    return Path(run_dir) / job_id


def error_event(exc: CorralError) -> dict[str, Any]:
    """The ``error`` event of a job that could not start, and its exit code."""
    code = EXIT_CONFIG if isinstance(exc, ConfigError) else EXIT_LAUNCH
    return {
        "kind": "error",
        "time": time.time(),
        "type": type(exc).__name__,
        "message": str(exc),
        "details": list(exc.details()),
        "exit_code": code,
    }


STOP_REQUEST = "stop-request"
"""Who asked the server to stop the job (written in its dir before the SIGTERM)."""


def request_stop(directory: Path, by: str) -> None:
    """Record who stops the job, for its reason (the supervisor reads it at SIGTERM)."""
    write_private(directory / STOP_REQUEST, by)


def stopped_by(directory: Path) -> str | None:
    """Who asked to stop the job (None: a signal nobody explained)."""
    try:
        return (directory / STOP_REQUEST).read_text().strip() or None
    except OSError:
        return None


_EARLY_STOPS: list[int] = []
"""SIGTERM/SIGINT received before the job existed (the server stopped it at once)."""


def _early_stop(signum: int, _frame: object) -> None:
    _EARLY_STOPS.append(signum)


async def supervise(description: JobDescription, writer: EventWriter) -> int:
    """Run the job, SIGTERM/SIGINT mapped to ``job.stop()`` (one that came before the
    job existed stops it before launch); its exit code."""
    options = description.options
    try:
        job = job_of(description)  # its drift monitor first: its last message precedes `finished`
    except CorralError as exc:
        event = error_event(exc)
        writer.write(event)
        return int(event["exit_code"])
    job.subscribe(writer.on_event)
    directory = job_dir(options.run_dir, job.spec.job_id)
    for _ in _EARLY_STOPS:
        job.stop(stopped_by(directory))
    try:
        result = await drive(job, lambda: job.stop(stopped_by(directory)))
    except CorralError as exc:
        event = error_event(exc)
        writer.write(event)
        return int(event["exit_code"])
    return result.exit_code


def main() -> int:
    """Entry point: the description on stdin, the events in the job dir."""
    for signum in STOP_SIGNALS:
        signal.signal(signum, _early_stop)
    try:
        description = received(sys.stdin.buffer.read())
    except ConfigError as exc:
        print(f"corral supervisor: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    options = description.options
    assert options.job_id is not None  # received() refuses a description without one
    directory = private_dir(job_dir(options.run_dir, options.job_id))
    write_supervisor(directory, psutil.Process().pid, psutil.Process().create_time())
    writer = EventWriter(directory / EVENTS_FILE)
    try:
        return asyncio.run(supervise(description, writer))
    finally:
        writer.close()


if __name__ == "__main__":
    sys.exit(main())
