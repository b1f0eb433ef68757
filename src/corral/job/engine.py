"""From CLI options to a supervised job: validate, resolve, plan, run, report.

``prepare`` turns options into a JobSpec and its plan (with ``dry_run`` it
touches nothing); ``run_job`` executes that plan through the right transport
and writes ``<run_dir>/<job-id>/`` (plan.json, result.json, logs/).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import errno
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console

from corral.agent.probe import try_bind
from corral.checks.context import DEFAULT_MIN_FREE_GB
from corral.cluster.model import Cluster, Host
from corral.errors import ConfigError, CorralError, LaunchError
from corral.job.agents import start_agents
from corral.job.output import LogSink, say
from corral.job.states import JobState, NodeState
from corral.job.summary import attempts_table, print_report
from corral.job.supervisor import EXIT_INTERRUPTED, JobResult, Supervisor
from corral.plan.render import master_index, plan_job
from corral.plan.spec import DEFAULT_RDZV_TIMEOUT, LAUNCHERS, JobSpec, Launcher, NodeCommand
from corral.recovery.health import DEFAULT_HOST_TIMEOUT
from corral.recovery.keeper import CheckpointKeeper
from corral.recovery.restart import AttemptLog, RestartPolicy, decide
from corral.transport.base import NodeProcess, Transport
from corral.transport.choose import transport_for
from corral.transport.options import SshOptions


@dataclass
class LaunchOptions:
    """Everything ``corral run`` / ``corral plan`` was given."""

    cluster: Cluster
    command: list[str]
    ssh: SshOptions = field(default_factory=SshOptions)
    launcher: str = "torchrun"
    python: str | None = None
    nproc_per_node: str | None = None
    master_addr: str | None = None
    master_port: int = 29500
    workdir: str | None = None
    env: list[str] = field(default_factory=list)
    nccl_interface: str | None = None
    gloo_interface: str | None = None
    timeout: float | None = None
    checkpoint_dir: str | None = None
    run_dir: str = "runs"
    grace: float = 10.0
    rdzv_timeout: float = DEFAULT_RDZV_TIMEOUT
    job_id: str | None = None
    preflight: bool = True  # run the pre-flight checklist first (--no-preflight skips it)
    smoke_test: bool = False  # include the collective smoke test in the pre-flight
    min_free_gb: float = DEFAULT_MIN_FREE_GB
    consistency_threshold: float = 1.0
    exclude_divergent: bool = False
    code_dir: str | None = None
    sync: bool = False  # push the code tree (corral sync) before the pre-flight
    sync_script: str | None = None  # a user sync script run before the pre-flight
    max_restarts: int = 0  # restarts after a failed rank, a lost host or a hang
    restart_backoff: float = 1.0  # seconds before the first restart (doubled each time)
    min_nodes: int | None = None  # fewest hosts to restart on (None: all of them)
    host_timeout: float = DEFAULT_HOST_TIMEOUT  # silence after which a host is lost
    hang_timeout: float | None = None  # seconds without progress (None: auto, see hang.py)
    replicate_checkpoints: bool = False  # keep a copy of each new checkpoint here
    stream: Any = None  # bytes sink for job output (tests); default stdout
    console: Console | None = None  # where corral's own messages go; default stderr


@dataclass
class Prepared:
    """A validated spec and its plan."""

    spec: JobSpec
    commands: list[NodeCommand]
    job_dir: Path
    attempt: int = 0


def new_job_id() -> str:
    """A sortable, unique job id such as ``20261122-031502-7f3a``."""
    return time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(2)


def parse_env(items: list[str]) -> dict[str, str]:
    """``K=V`` strings to a dict; ConfigError naming the bad item."""
    env: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"{item!r} is not KEY=VALUE", option="--env")
        if not key.replace("_", "a").isalnum() or key[0].isdigit():
            raise ConfigError(f"{key!r} is not a valid environment variable name", option="--env")
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
    """``--nproc-per-node``: an int >= 1, 'auto' (GPUs or slots), or None (slots)."""
    if value is None:
        return None
    if value == "auto":
        gpus = _count_local_gpus() if cluster.is_local else 0
        return gpus or None
    try:
        number = int(value)
    except ValueError:
        raise ConfigError(
            f"{value!r} is not a number or 'auto'", option="--nproc-per-node"
        ) from None
    if number < 1:
        raise ConfigError(f"must be at least 1 (got {number})", option="--nproc-per-node")
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
            from corral.checks.hostside import describe_holders, port_holders

            holders = port_holders(port)
            why = "already in use" + (" by " + describe_holders(holders) if holders else "")
        raise LaunchError(
            f"master port {port} on {host} is {why}; pass another --master-port, "
            "or --master-port 0 to pick a free one"
        ) from error


def prepare(opts: LaunchOptions, *, dry_run: bool = False, attempt: int = 0) -> Prepared:
    """Validate options, resolve what must be resolved, and plan every node."""
    if not opts.command:
        raise ConfigError("no script given: corral run [OPTIONS] -- SCRIPT [ARGS...]")
    if opts.launcher not in LAUNCHERS:
        raise ConfigError(
            f"unknown launcher {opts.launcher!r}; choose one of {', '.join(LAUNCHERS)}",
            option="--launcher",
        )
    cluster = opts.cluster
    script, *args = opts.command
    if cluster.is_local:
        if not os.path.isfile(script):
            raise ConfigError(f"script {script} not found (looked in {os.getcwd()})")
        script = os.path.abspath(script)
    run_dir = os.path.abspath(opts.run_dir)
    master_port = opts.master_port
    if master_port < 0 or master_port > 65535:
        raise ConfigError(f"{master_port} is not a TCP port", option="--master-port")
    if cluster.is_local and not dry_run:
        if master_port == 0:
            master_port = free_port()
        else:
            check_port_free(master_port)
    python = opts.python
    if python is None and cluster.is_local:
        python = sys.executable  # remote hosts: resolved by the launch probe
    checkpoint_dir = opts.checkpoint_dir
    if checkpoint_dir and cluster.is_local:
        checkpoint_dir = os.path.abspath(checkpoint_dir)
    workdir = opts.workdir
    if workdir and cluster.is_local:
        workdir = os.path.abspath(workdir)
        if not os.path.isdir(workdir):
            raise ConfigError(f"directory {workdir} does not exist", option="--workdir")
    launcher: Launcher = "torchrun" if opts.launcher == "torchrun" else "python"
    spec = JobSpec(
        script=script,
        args=tuple(args),
        launcher=launcher,
        job_id=opts.job_id or new_job_id(),
        python=python,
        nproc_per_node=parse_nproc(opts.nproc_per_node, cluster),
        master_addr=opts.master_addr,
        master_port=master_port,
        workdir=workdir,
        env=parse_env(opts.env),
        nccl_interface=opts.nccl_interface,
        gloo_interface=opts.gloo_interface,
        timeout=opts.timeout,
        checkpoint_dir=checkpoint_dir,
        # local:N shares one filesystem: the keeper keeps no replica there
        replicate_checkpoints=bool(
            opts.replicate_checkpoints and checkpoint_dir and not cluster.is_local
        ),
        rdzv_timeout=opts.rdzv_timeout,
        run_dir=run_dir,
    )
    commands = plan_job(spec, cluster, attempt)
    return Prepared(
        spec=spec, commands=commands, job_dir=Path(run_dir) / spec.job_id, attempt=attempt
    )


def make_transport(opts: LaunchOptions) -> Transport:
    """LocalTransport for ``local:N``; the SSH transport otherwise."""
    return transport_for(opts.cluster, opts.ssh)


def _agent_argv(spec: JobSpec) -> Any:
    def argv(host: Host) -> list[str]:
        return [host.python or spec.python or "python3", "-m", "corral.agent"]

    return argv


def job_json(prepared: Prepared, opts: LaunchOptions) -> dict[str, Any]:
    """What ``corral logs`` needs later to find the job's hosts again (no secrets)."""
    return {
        "job_id": prepared.spec.job_id,
        "hosts": [
            {
                "name": c.host.name,
                "address": c.host.address,
                "port": c.host.port,
                "user": c.host.user,
                "local": c.host.local,
                "python": c.host.python,
                "node_dir": c.env.get("CORRAL_NODE_DIR"),
            }
            for c in prepared.commands
        ],
        "ssh": {
            "user": opts.ssh.user,
            "key": opts.ssh.key,
            "port": opts.ssh.port,
            "config": opts.ssh.config,
            "password_env": opts.ssh.password_env,
        },
        "launcher": prepared.spec.launcher,
        "command": [prepared.spec.script, *prepared.spec.args],
    }


def _write_json(path: Path, data: Any) -> None:
    with contextlib.suppress(OSError):
        path.write_text(json.dumps(data, indent=2, default=str))


def result_json(result: JobResult) -> dict[str, Any]:
    """A JSON-able record of a finished job (``result.json``)."""
    return {
        "job_id": result.job_id,
        "state": result.state.value,
        "exit_code": result.exit_code,
        "started": result.started,
        "ended": result.ended,
        "reason": result.reason,
        "nodes": [
            {
                "host": n.host.name,
                "state": n.state.value,
                "detail": n.detail,
                "ranks": {str(r.rank): {"code": r.code, "pid": r.pid} for r in n.ranks.values()},
            }
            for n in result.nodes
        ],
        "failures": [
            {"host": f.host, "rank": f.rank, "code": f.code, "message": f.message, "time": f.time}
            for f in result.failures
        ],
        "attempts": result.attempts,
    }


async def start_remote(
    prepared: Prepared, opts: LaunchOptions, transport: Transport, *, check_port: bool = True
) -> tuple[Prepared, dict[str, NodeProcess]]:
    """Start and probe every SSH host's agent (interpreter, torch, workdir, master
    port unless ``check_port`` is False; port 0 is always resolved) and re-plan
    with what they found. Nothing is launched if a host is not ready."""
    spec = prepared.spec
    cluster = opts.cluster
    master_addr = spec.master_addr or cluster.hosts[0].address
    master = cluster.hosts[master_index(cluster, master_addr)]
    started = await start_agents(
        transport,
        cluster.hosts,
        python=opts.python,
        workdir=prepared.commands[0].cwd,  # --workdir, or this machine's current directory
        workdir_given=spec.workdir is not None,
        master=master,
        master_port=spec.master_port if check_port or spec.master_port == 0 else None,
        need_torch=spec.launcher == "torchrun",
    )
    resolved = Cluster(
        tuple(dataclasses.replace(h, python=started[h.name][1].python) for h in cluster.hosts),
        source=cluster.source,
    )
    if spec.master_port == 0:
        port = started[master.name][1].port
        assert port is not None
        spec = dataclasses.replace(spec, master_port=port)
    planned = Prepared(
        spec=spec,
        commands=plan_job(spec, resolved, prepared.attempt),
        job_dir=prepared.job_dir,
        attempt=prepared.attempt,
    )
    return planned, {name: proc for name, (proc, _) in started.items()}


async def run_job(opts: LaunchOptions) -> JobResult:
    """Prepare, sync and check (unless told not to), launch, supervise and report one job."""
    prepared = prepare(opts)
    transport = make_transport(opts)
    try:
        console = opts.console or Console(stderr=True)
        history = AttemptLog.load(prepared.job_dir)
        if history.records:
            opts = dataclasses.replace(opts, job_id=prepared.spec.job_id)
            prepared = prepare(opts, attempt=history.next_number)
        sync = await _sync(prepared, opts, console)
        started: dict[str, NodeProcess] = {}
        if opts.cluster.is_local:
            if opts.preflight:
                opts, prepared = await _checked(prepared, opts, transport, console, sync)
        elif opts.preflight:
            opts, prepared, started = await _checked_remote(
                prepared, opts, transport, console, sync
            )
        else:
            prepared, started = await start_remote(prepared, opts, transport)
        return await _run_attempts(prepared, opts, transport, started, history, console)
    finally:
        await transport.close()


async def _sync(prepared: Prepared, opts: LaunchOptions, console: Console) -> dict[str, Any] | None:
    """``--sync`` / ``--sync-script`` (SSH clusters): what the ``sync`` check reports."""
    if not (opts.sync or opts.sync_script) or opts.cluster.is_local:
        return None
    from corral.job.presync import sync_before_launch

    return await sync_before_launch(opts, prepared.spec, console)


async def _checked(
    prepared: Prepared,
    opts: LaunchOptions,
    transport: Transport,
    console: Console,
    sync: dict[str, Any] | None,
) -> tuple[LaunchOptions, Prepared]:
    """The pre-flight checklist (local nodes); the plan it leaves to launch."""
    from corral.job.preflight import apply, preflight

    outcome = await preflight(opts, prepared.spec, transport, console, sync=sync)
    cluster = apply(outcome, opts.cluster)
    if cluster == opts.cluster:
        return opts, prepared
    opts = dataclasses.replace(opts, cluster=cluster, job_id=prepared.spec.job_id)
    return opts, prepare(opts, attempt=prepared.attempt)


async def _checked_remote(
    prepared: Prepared,
    opts: LaunchOptions,
    transport: Transport,
    console: Console,
    sync: dict[str, Any] | None,
) -> tuple[LaunchOptions, Prepared, dict[str, NodeProcess]]:
    """The checklist and the agents' start-up at the same time (both are a Python
    start on every host): nothing is launched until the checklist passed. The
    checklist tests the master port, so the agents do not (port 0 excepted)."""
    from corral.job.preflight import apply, preflight

    checks = asyncio.ensure_future(preflight(opts, prepared.spec, transport, console, sync=sync))
    agents = asyncio.ensure_future(start_remote(prepared, opts, transport, check_port=False))
    done = await asyncio.gather(checks, agents, return_exceptions=True)
    outcome, started_agents = done
    if isinstance(outcome, BaseException) or isinstance(started_agents, BaseException):
        if not isinstance(started_agents, BaseException):
            await _abort_all(started_agents[1].values())
        error = outcome if isinstance(outcome, BaseException) else started_agents
        assert isinstance(error, BaseException)
        raise error
    planned, started = started_agents
    cluster = apply(outcome, opts.cluster)
    if cluster == opts.cluster:
        return opts, planned, started
    keep = {h.name for h in cluster.hosts}
    dropped = [name for name in started if name not in keep]
    await _abort_all(started.pop(name) for name in dropped)
    pythons = {c.host.name: c.host.python for c in planned.commands}
    resolved = Cluster(
        tuple(dataclasses.replace(h, python=pythons.get(h.name)) for h in cluster.hosts),
        source=cluster.source,
    )
    opts = dataclasses.replace(opts, cluster=cluster, job_id=planned.spec.job_id)
    replanned = Prepared(
        spec=planned.spec,
        commands=plan_job(planned.spec, resolved, planned.attempt),
        job_dir=planned.job_dir,
        attempt=planned.attempt,
    )
    return opts, replanned, started


async def _abort_all(procs: Any) -> None:
    """Tell agents that were started (and probed) to exit without launching."""
    from corral.job.agents import abort

    waiting = []
    for proc in procs:
        abort(proc)
        waiting.append(proc.wait())
    with contextlib.suppress(asyncio.TimeoutError):
        await asyncio.wait_for(asyncio.gather(*waiting, return_exceptions=True), 10)


async def _run_attempts(
    prepared: Prepared,
    opts: LaunchOptions,
    transport: Transport,
    started: dict[str, NodeProcess],
    history: AttemptLog,
    console: Console,
) -> JobResult:
    """Supervise attempt after attempt until one succeeds or no restart is allowed
    (see :mod:`corral.recovery.restart`); returns the last attempt's result."""
    policy = RestartPolicy(opts.max_restarts, opts.restart_backoff, opts.min_nodes)
    initial_hosts = len(opts.cluster.hosts)
    if history.records:
        say(
            console,
            f"job {prepared.spec.job_id}: {len(history.records)} earlier attempt(s) "
            f"on record; this is attempt {history.next_number}",
            style="bold",
        )
    keeper = CheckpointKeeper.create(prepared, opts, transport, console)
    restarts = 0
    placed: str | None = None
    if history.records:  # a rerun: rank 0 may now be a host without the checkpoint
        try:
            placed = await keeper.place(prepared)
        except CorralError as exc:
            say(console, f"warning: the latest checkpoint could not be placed: {exc}", "yellow")
    while True:
        world = sum(c.nproc for c in prepared.commands)
        hosts = [c.host.name for c in prepared.commands]
        record = history.start(hosts, world, placed)
        keeper.warm(prepared)
        result = await _supervise(prepared, opts, transport, started, keeper)
        record.finish(result)
        history.save()
        result.attempts = history.to_json()
        _write_json(prepared.job_dir / "result.json", result_json(result))
        if result.state != JobState.FAILED:
            break
        unreachable = await _unreachable(transport, opts.cluster, result)
        decision = decide(
            policy,
            result,
            restarts_done=restarts,
            hosts=hosts,
            unreachable=unreachable,
            initial_hosts=initial_hosts,
        )
        if not decision.restart:
            if opts.max_restarts:
                say(console, f"not restarting: {decision.reason}", style="bold red")
            break
        restarts += 1
        delay = policy.delay(restarts)
        say(
            console,
            f"attempt {record.number} failed: {record.cause}; {decision.reason} "
            f"(restart {restarts} of {policy.max_restarts}) in {delay:g} s",
            style="bold yellow",
        )
        if not await _backoff(delay):
            result.exit_code = EXIT_INTERRUPTED
            break
        cluster = Cluster(
            tuple(h for h in opts.cluster.hosts if h.name in decision.hosts),
            source=opts.cluster.source,
        )
        opts = dataclasses.replace(
            opts, cluster=cluster, job_id=prepared.spec.job_id, master_addr=_master(opts, cluster)
        )
        prepared = prepare(opts, attempt=history.next_number)
        started = {}
        try:
            if not cluster.is_local:
                prepared, started = await start_remote(prepared, opts, transport)
            placed = await keeper.place(prepared)
        except CorralError as exc:
            await _abort_all(started.values())
            say(console, f"not restarting: {exc}", style="bold red")
            break
    await keeper.close()
    if len(history.records) > 1:
        console.print(attempts_table(history.records))
    return result


def _master(opts: LaunchOptions, cluster: Cluster) -> str | None:
    """The master address for the next attempt: the one given, unless its host is gone."""
    if any(opts.master_addr in (h.address, h.name) for h in cluster.hosts):
        return opts.master_addr
    return None


async def _unreachable(transport: Transport, cluster: Cluster, result: JobResult) -> list[str]:
    """The connectivity check between attempts: hosts (not already lost) that do not
    answer an echo within the ping deadline."""
    if cluster.is_local:
        return []
    from corral.fleet.ping import failed_hosts, ping_hosts

    alive = [n.host for n in result.nodes if n.state != NodeState.LOST]
    if not alive:
        return []
    return failed_hosts(await ping_hosts(transport, alive))


async def _backoff(delay: float) -> bool:
    """Wait before a restart; False when Ctrl-C / SIGTERM came meanwhile."""
    if delay <= 0:
        return True
    loop = asyncio.get_running_loop()
    interrupted = asyncio.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, interrupted.set)
    try:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(interrupted.wait(), delay)
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signum)
    return not interrupted.is_set()


async def _supervise(
    prepared: Prepared,
    opts: LaunchOptions,
    transport: Transport,
    started: dict[str, NodeProcess],
    keeper: CheckpointKeeper,
) -> JobResult:
    spec = prepared.spec
    prepared.job_dir.mkdir(parents=True, exist_ok=True)
    _write_json(
        prepared.job_dir / "plan.json",
        {
            "job_id": spec.job_id,
            "launcher": spec.launcher,
            "nodes": [c.to_json() for c in prepared.commands],
        },
    )
    console = opts.console or Console(stderr=True)
    sink = LogSink(
        prepared.job_dir / "logs",
        [h.name for h in opts.cluster.hosts],
        stream=opts.stream,
        live=False if opts.stream is not None else None,
        console=opts.console,
    )
    world = sum(c.nproc for c in prepared.commands)
    attempt = f" (attempt {prepared.attempt})" if prepared.attempt else ""
    sink.message(
        f"job {spec.job_id}{attempt}: {len(prepared.commands)} nodes, {world} ranks, "
        f"launcher {spec.launcher}; logs in {prepared.job_dir / 'logs'}",
        style="bold",
    )
    _write_json(prepared.job_dir / "job.json", job_json(prepared, opts))
    supervisor = Supervisor(
        prepared.commands,
        transport,
        sink,
        job_id=spec.job_id,
        agent_argv=_agent_argv(spec),
        grace=opts.grace,
        timeout=opts.timeout,
        master_timeout=opts.rdzv_timeout,
        require_master=spec.launcher == "torchrun",
        started=started,
        heartbeat_timeout=opts.host_timeout,
        host_timeout=opts.host_timeout,
        hang_timeout=opts.hang_timeout,
        hang_dir=prepared.job_dir / "hang",
        on_report=keeper.on_report,
        holding=keeper.holding,
    )
    try:
        result = await supervisor.run()
    finally:
        sink.close()
    print_report(result, console)
    return result
