"""``corral run`` (launch + supervise) and ``corral plan`` (the dry run)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import sys
from typing import TYPE_CHECKING, Annotated

import typer

from corral.cli.common import HostsOpt, load_hosts, ssh_flags
from corral.cli.options import (
    NO_FLAGS,
    CalibrationOpt,
    CalibrationSecondsOpt,
    JobFlags,
    ScriptArg,
    job_flags,
)
from corral.cluster.model import Cluster, Host
from corral.console import make_console
from corral.contract import JOB_CONFIG_ENV
from corral.errors import ConfigError
from corral.job.describe import JobDescription, describe
from corral.job.schema import JobOptions
from corral.transport.options import SshOptions

if TYPE_CHECKING:
    from rich.console import Console

    from corral.job.build import Policies
    from corral.job.events import Checked, Finished
    from corral.job.headstart import HeadStart
    from corral.job.resolve import Prepared
    from corral.plan.spec import JobSpec

# What only `corral plan`, a calibration or a pre-flight report print is imported
# where it is used. `corral run` on local:N starts its nodes' agents before it
# imports the engine (corral.job.headstart): the engine loads while they start.


def _show_checked(event: Checked, console: Console) -> None:
    """The pre-flight report: every problem when it blocks, warnings, the verdict."""
    from corral.checks.render import print_report as print_checklist
    from corral.checks.render import problems, verdict
    from corral.checks.result import Status

    report = event.report
    if event.blocking:
        print_checklist(console, report)
        return
    if report.overall_status is Status.WARN:
        problems(console, report)
    console.print(verdict(report, "pre-flight "))


def _weighted(
    description: JobDescription,
    calibration: str | None,
    console: Console,
    *,
    dry_run: bool = False,
    seconds: float = 30.0,
) -> JobDescription:
    """``description`` with the ranks' workload weights from ``--calibration FILE|auto``
    (:func:`~corral.job.build.weigh`; ``auto``: calibrate now, in a dry run it is only
    noted), the weights printed."""
    if not calibration:
        return description
    from corral.calibrate.launch import AUTO, weigh_now
    from corral.job.build import weigh
    from corral.job.result import EXIT_INTERRUPTED
    from corral.plan.display import fits_line, overheads_line, weights_line

    if calibration != AUTO:
        weighing = weigh(description, calibration)
    elif dry_run:
        console.print(
            "--calibration auto: the weights are measured at launch (the built-in "
            "calibration on these hosts); `corral calibrate` shows them now",
            style="dim",
            markup=False,
        )
        return description
    else:
        from corral.cli.calibration_view import CalibrationTerminal, print_calibration

        terminal = CalibrationTerminal(description.cluster, console)
        try:
            measured = asyncio.run(weigh_now(description, seconds=seconds, watch=terminal.watch))
        finally:
            terminal.close()
        if measured is None:
            raise typer.Exit(EXIT_INTERRUPTED)
        weighing = measured
        if weighing.measured is not None:
            print_calibration(weighing.measured, console)
    console.print(weights_line(weighing.ranks), markup=False)
    ranks = zip(weighing.ranks, weighing.fits, strict=True)
    fits = fits_line((host, local, fit) for (host, local, _), fit in ranks)
    if fits is not None:
        console.print(fits, markup=False)
    pairs = zip(weighing.ranks, weighing.overheads, strict=True)
    fixed = overheads_line((host, local, k) for (host, local, _), k in pairs)
    if fixed is not None:
        console.print(fixed, markup=False)
    return weighing.description


@ssh_flags()
@job_flags("run")
def run(
    command: ScriptArg = None,
    hosts: HostsOpt = None,
    ssh: SshOptions = SshOptions(),  # noqa: B008 (the SSH flags, see ssh_flags)
    flags: JobFlags = NO_FLAGS,  # the job's flags, see job_flags
    calibration: CalibrationOpt = None,
    calibration_seconds: CalibrationSecondsOpt = 30.0,
) -> None:
    """Launch SCRIPT on every node and supervise it; the exit code is the job's result.

    Exit codes: 0 success; the failing rank's own code; 128+N when it was killed by
    signal N; 124 --timeout; 125 a hang was detected; 130 interrupted; 255 a host was
    lost; 3 the job could not start; 2 bad options or hostfile. With --max-restarts,
    the code of the last attempt.
    """
    cluster = load_hosts(hosts, ssh)
    options = flags.options(command, cluster)
    if cluster.is_local and options.preflight and not calibration:
        from corral.cli.entry import run_on, take
        from corral.job.ids import new_job_id

        early = take(len(cluster.hosts), options.python, options.job_id)
        job_id = options.job_id or (early.job_id if early else new_job_id())
        options = dataclasses.replace(options, job_id=job_id)
        if early is not None:  # the agents the entry point started: on the loop they run on
            raise typer.Exit(run_on(early, _head_started(options, cluster, ssh, early.head)))
        raise typer.Exit(asyncio.run(_head_started(options, cluster, ssh)))
    if not any(h.local for h in cluster.hosts) and not calibration:
        raise typer.Exit(asyncio.run(_ssh_head_started(options, cluster, ssh)))
    _validated(options, calibration)  # its errors before a calibration is measured for it
    console = make_console(stderr=False)
    description = describe(options, cluster, ssh)
    description = _weighted(description, calibration, console, seconds=calibration_seconds)
    raise typer.Exit(asyncio.run(_supervise(description)))


def _validated(options: JobOptions, calibration: str | None) -> tuple[JobSpec, Policies]:
    """The job's spec and policies; ConfigError for what its options refuse."""
    from corral.job.build import build_job

    built = build_job(options)
    if options.rebalance and not calibration:
        raise ConfigError("needs --calibration FILE|auto", option="--rebalance")
    return built


async def _head_started(
    options: JobOptions, cluster: Cluster, ssh: SshOptions, head: HeadStart | None = None
) -> int:
    """Run the job of ``options`` on ``local:N`` with every node's agent started
    before the engine is imported (``head``: started by the entry point, before the
    CLI loaded, :mod:`corral.cli.entry`) and sent its node's plan once the options are
    validated (:mod:`corral.job.headstart`); its exit code. An agent the job does not
    use, the job refused or ended, is ended."""
    from corral.job.headstart import HeadStart, head_plans

    spawn_now = head is None
    head = HeadStart() if head is None else head
    try:
        if spawn_now:
            await head.spawn(cluster, options.python, str(options.job_id), options.launcher_name)
        spec, made = _validated(options, None)
        if not made.recovery.in_place:  # in place, each node is planned as its own group
            head.prestart(head_plans(spec, cluster))  # their launchers start, held at gates
        return await _supervise(describe(options, cluster, ssh), head)
    finally:
        await head.close()


async def _ssh_head_started(options: JobOptions, cluster: Cluster, ssh: SshOptions) -> int:
    """Run the job of ``options`` on SSH hosts with every host's agent started (its
    connection opened, torchrun started warm) while the engine's modules load on a
    thread (:meth:`corral.job.headstart.HeadStart.spawn_remote`); its exit code."""
    from corral.job.headstart import SshHeadStart
    from corral.job.ids import new_job_id
    from corral.transport.ssh import SshTransport

    options = dataclasses.replace(options, job_id=options.job_id or new_job_id())
    head = SshHeadStart(SshTransport(ssh))
    try:
        head.spawn_remote(cluster, options.python, str(options.job_id), options.launcher_name)
        await asyncio.to_thread(_load_engine)  # the connections open meanwhile
        _validated(options, None)
        return await _supervise(describe(options, cluster, ssh), head)
    finally:
        await head.close()


def _load_engine() -> None:
    """Import the engine's modules (on a thread: the event loop runs meanwhile)."""
    import corral.job.build
    import corral.job.engine
    import corral.job.output  # noqa: F401


async def _supervise(description: JobDescription, transport: HeadStart | None = None) -> int:
    """Run the job of ``description`` with its events on the terminal; its exit code."""
    from corral.job.build import drive, ready_job
    from corral.job.output import TerminalOutput

    job = ready_job(description, transport=transport)  # trackers, drift monitor first
    hosts = [h.name for h in description.cluster.hosts]
    output = TerminalOutput(hosts, on_finish=_print_finished, on_checked=_show_checked)
    job.subscribe(output.on_event)
    try:
        return (await drive(job)).exit_code
    finally:
        output.close()


def _print_finished(event: Finished, console: Console) -> None:
    """The job's summary (:func:`corral.job.summary.print_finished`)."""
    from corral.job.summary import print_finished

    print_finished(event, console)


@ssh_flags("user", "port")
@job_flags("plan")
def plan(
    command: ScriptArg = None,
    hosts: HostsOpt = None,
    ssh: SshOptions = SshOptions(),  # noqa: B008 (--ssh-user and --ssh-port, see ssh_flags)
    flags: JobFlags = NO_FLAGS,  # the job's flags, see job_flags
    calibration: CalibrationOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
) -> None:
    """Print the exact per-node command and environment `corral run` would use (dry run).

    Secret values (see --secret-env) are redacted. With --recovery in-place, each
    node's command is its own replica group's (spare hosts are listed, not planned).
    """
    from corral.job.build import job_spec
    from corral.job.engine import dry_run
    from corral.plan.display import python_note
    from corral.plan.inplace import LIGHTHOUSE_PLACEHOLDER, plan_inplace
    from corral.recovery.inplace import RecoveryPolicy
    from corral.remote.python import candidates

    cluster = load_hosts(hosts, ssh)
    options = flags.options(command, cluster)
    job_spec(options)  # its errors first
    console = make_console(stderr=as_json)
    described = _weighted(describe(options, cluster, ssh), calibration, console, dry_run=True)
    spec = job_spec(described.options)
    prepared = dry_run(spec, cluster)
    policy = RecoveryPolicy(options.recovery, options.spares, options.ft_join_timeout)
    policy.check(spec.launcher, len(cluster.hosts), options.min_nodes)
    spare_hosts: tuple[Host, ...] = ()
    if policy.in_place:
        commands, spare_hosts = plan_inplace(
            spec,
            cluster,
            spares=options.spares,
            min_replicas=policy.min_replicas(options.min_nodes),
        )
        prepared = dataclasses.replace(prepared, commands=commands)
    if as_json:
        doc: dict[str, object] = {
            "job_id": prepared.spec.job_id,
            "launcher": prepared.spec.launcher,
            "nodes": [c.to_json(redact=True) for c in prepared.commands],
        }
        if prepared.spec.workload_weights:
            doc["workload_weights"] = list(prepared.spec.workload_weights)
        if prepared.spec.harness:
            doc["harness"] = {"mode": prepared.spec.harness, "config": _adjusted(prepared)}
        if policy.in_place:
            doc["recovery"] = {
                "mode": "in-place",
                "lighthouse": LIGHTHOUSE_PLACEHOLDER,
                "join_timeout_s": policy.join_seconds,
                "spares": [h.name for h in spare_hosts],
            }
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
        return
    console = make_console(stderr=False)
    print_plan(prepared, console)
    if policy.in_place:
        console.print(
            f"\nin-place recovery (torchft): each node is its own replica group, the "
            f"Lighthouse runs on the coordinator ({LIGHTHOUSE_PLACEHOLDER}, join timeout "
            f"{policy.join_seconds:g} s: --ft-join-timeout); spare hosts: "
            f"{', '.join(h.name for h in spare_hosts) or 'none'}"
            + (
                "; on local:N each group's store gets its own free port" if cluster.is_local else ""
            ),
            markup=False,
            soft_wrap=True,
        )
    note = python_note(prepared.commands, candidates(None)) if options.python is None else None
    if note is not None:
        console.print(note, style="dim", markup=False)


def _adjusted(prepared: Prepared) -> dict[str, object] | None:
    """The harness's config as the plan adjusted it (None without one)."""
    raw = prepared.commands[0].env.get(JOB_CONFIG_ENV) if prepared.commands else None
    return None if raw is None else dict(json.loads(raw))


def print_plan(prepared: Prepared, console: Console) -> None:
    """A table (node, host, ranks, cwd), then per node its env as ``K=V`` lines and
    the command as one copy-pasteable shell line (one per rank for the python
    launcher). Secret values are redacted."""
    from rich.table import Table

    from corral.plan.display import command_lines, node_env, reference_line

    spec = prepared.spec
    table = Table(
        title=f"plan for job {spec.job_id} ({spec.launcher}, {len(prepared.commands)} nodes)",
        title_justify="left",
    )
    for column in ("node", "host", "ranks", "cwd"):
        table.add_column(column, overflow="fold")
    for cmd in prepared.commands:
        ranks = (
            ", ".join(str(r.rank) for r in cmd.ranks)
            if cmd.ranks
            else f"{cmd.nproc} (assigned at rendezvous)"
        )
        table.add_row(str(cmd.node_rank), cmd.host.name, ranks, cmd.cwd)
    console.print(table)
    for cmd in prepared.commands:
        console.print(f"\nnode {cmd.node_rank} ({cmd.host.name}) env:", style="bold", markup=False)
        for key, value in node_env(cmd).items():
            console.print(f"  {key}={value}", markup=False, soft_wrap=True)
        for run in command_lines(cmd):
            console.print(f"node {cmd.node_rank} {run.label}:", style="bold", markup=False)
            console.print(run.line, markup=False, soft_wrap=True)
        reference = reference_line(cmd)
        if reference is not None:
            console.print(
                f"node {cmd.node_rank} as {spec.launcher} would start it (for reference; "
                "corral starts the ranks above itself, so each rank's exit code is its own):",
                style="bold",
                markup=False,
            )
            console.print(reference, markup=False, soft_wrap=True)
    config = _adjusted(prepared)
    if config is not None:
        console.print(
            f"\nharness config (--config_file adjusted for {prepared.world_size} ranks; "
            "rank, local_rank, is_main_process and, for ranks other than 0, "
            "output_dir/rank-N are added on each rank):",
            style="bold",
            markup=False,
        )
        console.print(json.dumps(config, indent=2), markup=False, soft_wrap=True)


def register(app: typer.Typer) -> None:
    """Add ``run`` and ``plan`` to the root app."""
    ctx = {"allow_interspersed_args": False}
    app.command("run", context_settings=ctx)(run)
    app.command("plan", context_settings=ctx)(plan)
