"""The supervisor process of one job started by ``corral serve``.

``python -m corral.service.launch`` reads a :class:`LaunchRequest` (JSON) from
stdin, runs the job with the same engine as ``corral run``
(:class:`corral.job.engine.Job`: pre-flight, agents, supervision, restarts,
checkpoints, the no-orphan teardown) and appends every event to the job's
``events.jsonl`` (:mod:`corral.service.eventlog`). It runs in its own session,
so the server can crash or restart without stopping training; SIGTERM (the
server's stop) tears the job down like Ctrl-C does for ``corral run``, a second
SIGTERM kills. A job with workload weights has a
:class:`~corral.calibrate.drift.DriftMonitor` (as ``corral run --calibration``):
its drift warnings and rebalanced weights are ``message`` events of the job, its
live throughput is saved as ``calibration-live.json`` in the job dir. The request
travels over stdin so the job's secret env values never appear in argv or in a
file; the process exits with the job's exit code.
"""

from __future__ import annotations

import asyncio
import signal
import sys
import time
from pathlib import Path
from typing import Any

import psutil
from pydantic import BaseModel, ConfigDict, Field

from corral.cluster.model import Cluster, Host
from corral.errors import ConfigError, CorralError
from corral.job.build import JobOptions, build_job, job_spec, new_job
from corral.job.engine import Job
from corral.job.result import EXIT_LAUNCH
from corral.plan.spec import DEFAULT_RDZV_TIMEOUT, JobSpec
from corral.private import private_dir, write_private
from corral.recovery.health import DEFAULT_HOST_TIMEOUT
from corral.service.eventlog import EVENTS_FILE, EventWriter, write_supervisor
from corral.service.models import ServiceLauncher
from corral.signals import STOP_SIGNALS, stop_on_signals
from corral.transport.options import SshOptions

EXIT_CONFIG = 2


class HostSpec(BaseModel):
    """One node of the job (a registered machine)."""

    model_config = ConfigDict(extra="forbid")

    name: str
    address: str = ""
    port: int | None = None
    user: str | None = None
    slots: int = 1
    local: bool = False
    python: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)

    def host(self) -> Host:
        """As a :class:`~corral.cluster.model.Host`."""
        return Host(
            name=self.name,
            address=self.address,
            port=self.port,
            user=self.user,
            slots=self.slots,
            local=self.local,
            python=self.python,
            labels=self.labels,
        )


class SshSpec(BaseModel):
    """How the job's hosts are reached (a key path or a password's variable *name*)."""

    model_config = ConfigDict(extra="forbid")

    user: str | None = None
    key: str | None = None
    port: int | None = None
    password_env: str | None = None
    config: str | None = None
    accept_new_host_keys: bool = False
    insecure_no_host_key_check: bool = False

    def options(self) -> SshOptions:
        """As :class:`~corral.transport.options.SshOptions`."""
        return SshOptions(**self.model_dump())


class LaunchRequest(BaseModel):
    """Everything the supervisor process needs to run one job."""

    model_config = ConfigDict(extra="forbid")

    job_id: str
    run_dir: str
    script: str
    args: list[str] = Field(default_factory=list)
    launcher: ServiceLauncher = "torchrun"
    command_template: str | None = None
    python: str | None = None
    nproc_per_node: int | None = None
    master_addr: str | None = None
    master_port: int = 0
    workdir: str | None = None
    env: dict[str, str] = Field(default_factory=dict)
    secret_env: list[str] = Field(default_factory=list)
    nccl_interface: str | None = None
    gloo_interface: str | None = None
    timeout: float | None = None
    rdzv_timeout: float = DEFAULT_RDZV_TIMEOUT
    hosts: list[HostSpec]
    ssh: SshSpec = Field(default_factory=SshSpec)
    preflight: bool = True
    smoke_test: bool = False
    sync: bool = False
    code_dir: str | None = None
    max_restarts: int = 0
    restart_backoff: float = 1.0
    min_nodes: int | None = None
    host_timeout: float = DEFAULT_HOST_TIMEOUT
    hang_timeout: float | None = None
    checkpoint_dir: str | None = None
    replicate_checkpoints: bool = False
    grace: float = 10.0
    workload_weights: list[float] = Field(default_factory=list)
    rebalance: bool = False

    def options(self) -> JobOptions:
        """The job as :func:`~corral.job.build.build_job` takes it (as ``corral run``)."""
        return JobOptions(
            command=(self.script, *self.args),
            launcher=self.launcher,
            command_template=self.command_template,
            job_id=self.job_id,
            python=self.python,
            nproc_per_node=self.nproc_per_node,
            master_addr=self.master_addr,
            master_port=self.master_port,
            workdir=self.workdir,
            env=self.env,
            secret_env=tuple(self.secret_env),
            nccl_interface=self.nccl_interface,
            gloo_interface=self.gloo_interface,
            timeout=self.timeout,
            checkpoint_dir=self.checkpoint_dir,
            rdzv_timeout=self.rdzv_timeout,
            run_dir=self.run_dir,
            workload_weights=tuple(self.workload_weights),
            preflight=self.preflight,
            smoke_test=self.smoke_test,
            code_dir=self.code_dir,
            sync=self.sync,
            max_restarts=self.max_restarts,
            restart_backoff=self.restart_backoff,
            min_nodes=self.min_nodes,
            host_timeout=self.host_timeout,
            hang_timeout=self.hang_timeout,
            replicate_checkpoints=self.replicate_checkpoints,
            grace=self.grace,
        )

    def spec(self) -> JobSpec:
        """The job's validated :class:`~corral.plan.spec.JobSpec`."""
        return job_spec(self.options())

    def cluster(self) -> Cluster:
        """The job's hosts, node 0 first."""
        return Cluster(tuple(h.host() for h in self.hosts), source="corral serve")

    def job(self) -> Job:
        """The engine's :class:`~corral.job.engine.Job` for this request, built as
        ``corral run`` builds its job (:func:`~corral.job.build.build_job`)."""
        spec, policies = build_job(self.options())
        return new_job(spec, self.cluster(), policies, ssh=self.ssh.options())


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


async def supervise(request: LaunchRequest, writer: EventWriter) -> int:
    """Run the job, SIGTERM/SIGINT mapped to ``job.stop()`` (one that came before the
    job existed stops it before launch); its exit code."""
    try:
        job = request.job()
    except CorralError as exc:
        event = error_event(exc)
        writer.write(event)
        return int(event["exit_code"])
    if request.workload_weights:
        from corral.calibrate.launch import watch_drift

        # before the writer: its last message precedes `finished`
        watch_drift(job, rebalance=request.rebalance)
    job.subscribe(writer.on_event)
    directory = job_dir(request.run_dir, request.job_id)
    for _ in _EARLY_STOPS:
        job.stop(stopped_by(directory))
    try:
        with stop_on_signals(lambda: job.stop(stopped_by(directory))):
            result = await job.run()
    except CorralError as exc:
        event = error_event(exc)
        writer.write(event)
        return int(event["exit_code"])
    return result.exit_code


def main() -> int:
    """Entry point: the request on stdin, the events in the job dir."""
    for signum in STOP_SIGNALS:
        signal.signal(signum, _early_stop)
    request = LaunchRequest.model_validate_json(sys.stdin.buffer.read())
    directory = private_dir(job_dir(request.run_dir, request.job_id))
    write_supervisor(directory, psutil.Process().pid, psutil.Process().create_time())
    writer = EventWriter(directory / EVENTS_FILE)
    try:
        return asyncio.run(supervise(request, writer))
    finally:
        writer.close()


if __name__ == "__main__":
    sys.exit(main())
