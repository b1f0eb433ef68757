"""From what the user asked for to a JobSpec the planner can use, and its plan.

:func:`resolve` validates a :class:`~corral.plan.spec.JobSpec` against its
cluster and fills in what only this machine knows for ``local:N`` (absolute
paths, a free master port, this interpreter); with ``dry_run`` it binds no
port. :func:`plan_attempt` plans one attempt (pure). Remote hosts are resolved
by their agents' probe (:mod:`corral.job.agents`).
"""

from __future__ import annotations

import dataclasses
import errno
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from corral.agent.probe import try_bind
from corral.cluster.model import Cluster
from corral.contract import is_env_name
from corral.errors import ConfigError, LaunchError
from corral.job.option import parse_nproc as parse_nproc_text
from corral.plan.render import plan_job
from corral.plan.spec import LAUNCHERS, NODE_LAUNCHERS, JobSpec, NodeCommand


@dataclass(frozen=True)
class Prepared:
    """One attempt's validated spec and its plan."""

    spec: JobSpec
    commands: list[NodeCommand]
    job_dir: Path
    attempt: int = 0

    @property
    def world_size(self) -> int:
        """Ranks across every node."""
        return sum(c.nproc for c in self.commands)


def parse_env(items: Sequence[str], environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """``K=V`` strings to a dict; a bare ``K`` takes this machine's value of K (so a
    secret need not appear on the command line). ConfigError naming the bad item."""
    source = os.environ if environ is None else environ
    env: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not is_env_name(key):
            raise ConfigError(f"{key!r} is not a valid environment variable name", option="--env")
        if not sep:
            if key not in source:
                raise ConfigError(
                    f"{key} is not set here (give KEY=VALUE, or set {key} before running corral)",
                    option="--env",
                )
            value = source[key]
        env[key] = value
    return env


def _count_local_gpus() -> int:
    if shutil.which("nvidia-smi") is None:
        return 0
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))


def parse_nproc(value: str | None, cluster: Cluster) -> int | None:
    """``--nproc-per-node``: an int >= 1, 'auto' (this machine's GPUs on ``local:N``,
    else the slots: None), or None (slots)."""
    number = parse_nproc_text(value)
    if number == "auto":
        gpus = _count_local_gpus() if cluster.is_local else 0
        return gpus or None
    return number


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on ``host`` right now."""
    port, error = try_bind(0, host)
    if port is None:
        raise LaunchError(f"cannot find a free port on {host}: {error}")
    return port


def check_port_free(port: int, host: str = "127.0.0.1") -> None:
    """LaunchError if ``port`` cannot be bound on ``host`` (already taken)."""
    _, error = try_bind(port, host)
    if error is not None:
        why = str(error)
        if error.errno == errno.EADDRINUSE:
            from corral.agent.hostfacts import describe_holders, port_holders

            holders = port_holders(port)
            why = "already in use" + (" by " + describe_holders(holders) if holders else "")
        raise LaunchError(
            f"master port {port} on {host} is {why}; pass another --master-port, "
            "or --master-port 0 to pick a free one"
        ) from error


def check_launch(script: str, launcher: str) -> None:
    """A script is given unless the launcher runs its own command, and the launcher is
    one of :data:`~corral.plan.spec.LAUNCHERS` (ConfigError)."""
    if not script and launcher not in NODE_LAUNCHERS:
        raise ConfigError("no script given: corral run [OPTIONS] -- SCRIPT [ARGS...]")
    if launcher not in LAUNCHERS:
        raise ConfigError(
            f"unknown launcher {launcher!r}; choose one of {', '.join(LAUNCHERS)}",
            option="--launcher",
        )


def resolve(spec: JobSpec, cluster: Cluster, *, dry_run: bool = False) -> JobSpec:
    """Validate ``spec`` for ``cluster`` and resolve what this machine can resolve."""
    check_launch(spec.script, spec.launcher)
    if not 0 <= spec.master_port <= 65535:
        raise ConfigError(f"{spec.master_port} is not a TCP port", option="--master-port")
    if spec.timeout is not None and not spec.timeout > 0:
        raise ConfigError(f"must be more than 0 s (got {spec.timeout:g})", option="--timeout")
    for key in spec.secret_env:
        if key not in spec.env:
            raise ConfigError(f"{key} is not passed with --env", option="--secret-env")
    changes: dict[str, object] = {
        "run_dir": os.path.abspath(spec.run_dir),
        "launch_dir": spec.launch_dir or os.getcwd(),  # once: every attempt plans with it
    }
    if cluster.is_local:
        if spec.script and not os.path.isfile(spec.script):
            raise ConfigError(f"script {spec.script} not found (looked in {os.getcwd()})")
        if spec.script:
            changes["script"] = os.path.abspath(spec.script)
        if not dry_run:
            if spec.master_port == 0:
                changes["master_port"] = free_port()
            else:
                check_port_free(spec.master_port)
        if spec.python is None:
            changes["python"] = sys.executable  # remote hosts: resolved by the agents' probe
        if spec.checkpoint_dir:
            changes["checkpoint_dir"] = os.path.abspath(spec.checkpoint_dir)
        # local:N shares one filesystem: no replica there
        changes["replicate_checkpoints"] = False
        if spec.workdir:
            workdir = os.path.abspath(spec.workdir)
            if not os.path.isdir(workdir):
                raise ConfigError(f"directory {workdir} does not exist", option="--workdir")
            changes["workdir"] = workdir
    return dataclasses.replace(spec, **changes)  # type: ignore[arg-type]


def plan_attempt(spec: JobSpec, cluster: Cluster, attempt: int = 0) -> Prepared:
    """Plan attempt ``attempt`` of a resolved ``spec`` on ``cluster`` (pure)."""
    return Prepared(
        spec=spec,
        commands=plan_job(spec, cluster, attempt),
        job_dir=Path(spec.run_dir) / spec.job_id,
        attempt=attempt,
    )
