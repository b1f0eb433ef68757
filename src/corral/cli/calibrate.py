"""``corral calibrate``: measure every rank's examples/s and the split they call for."""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from corral.calibrate.measure import (
    DEFAULT_SECONDS,
    CalibrateOptions,
    CalibrationRun,
    Calibrator,
)
from corral.calibrate.model import Calibration, CalibrationFile, save_calibration
from corral.cli.common import (
    AcceptNewHostKeysOpt,
    HostsOpt,
    InsecureNoHostKeyCheckOpt,
    SshConfigOpt,
    SshKeyOpt,
    SshPasswordEnvOpt,
    SshPortOpt,
    SshUserOpt,
    require_hosts,
)
from corral.cli.run import EnvOpt, JobIdOpt, NprocOpt, PythonOpt, RunDirOpt, ScriptArg, WorkdirOpt
from corral.cluster import load_cluster
from corral.cluster.model import Cluster
from corral.console import make_console
from corral.job.events import Finished, JobEvent, Message, Subscriber
from corral.job.output import TerminalOutput
from corral.job.resolve import parse_env, parse_nproc
from corral.job.result import EXIT_INTERRUPTED
from corral.job.states import JobState
from corral.job.summary import print_finished
from corral.transport.options import SshOptions

_BAR = 30

SecondsOpt = Annotated[
    float,
    typer.Option(
        "--seconds",
        metavar="SECONDS",
        envvar="CORRAL_CALIBRATE_SECONDS",
        help="How long every rank is measured once all have started (the first 10% is "
        "warm-up, not counted).",
    ),
]
ThreadsOpt = Annotated[
    int | None,
    typer.Option(
        "--threads",
        metavar="N",
        help="torch CPU threads per rank of the built-in workload (default: the host's "
        "cores over its ranks).",
    ),
]
JsonOpt = Annotated[
    bool, typer.Option("--json", help="Print the calibration file's JSON on stdout.")
]
OutputOpt = Annotated[
    str | None,
    typer.Option(
        "--output",
        "-o",
        metavar="FILE",
        help="Also save the calibration file here.",
    ),
]


def _bar(share: float, top: float) -> str:
    return "█" * max(1, round(_BAR * share / top)) if top > 0 else ""


def print_calibration(calibration: Calibration, console: Console) -> None:
    """The table (host, rank, examples/s, share, bar), a total row per host with
    several ranks, then the notes."""
    what = "script " + " ".join(calibration.script) if calibration.script else "built-in workload"
    table = Table(
        title=f"calibration {calibration.job_id} ({calibration.seconds:g} s, {what})",
        title_justify="left",
    )
    table.add_column("host")
    for column in ("rank", "ex/s", "share"):
        table.add_column(column, justify="right")
    table.add_column("", no_wrap=True)
    top = max(r.share for r in calibration.ranks)
    for host in calibration.hosts:
        ranks = calibration.host_ranks(host)
        for rank in ranks:
            table.add_row(
                host,
                str(rank.rank),
                f"{rank.examples_per_s:.1f}",
                f"{rank.share:.3f}",
                _bar(rank.share, top),
            )
        if len(ranks) > 1:
            table.add_row(
                f"{host} total",
                "",
                f"{calibration.measured_performance.get(host, 0.0):.1f}",
                f"{calibration.workload_distribution.get(host, 0.0):.3f}",
                "",
                style="bold",
            )
    console.print(table)
    console.print(calibration.calibration_notes, markup=False, soft_wrap=True)


def _subscriber(calibrator: Calibrator, output: TerminalOutput, console: Console) -> Subscriber:
    """The terminal's subscriber, quiet about the stop that ends the measurement."""

    def on_event(event: JobEvent) -> None:
        if calibrator.stopping and isinstance(event, Message):
            return  # the teardown that ends every calibration is not news
        if isinstance(event, Finished):
            output.close()
            if event.state == JobState.FAILED and not calibrator.stopping:
                print_finished(event, console)
            return
        output.on_event(event)

    return on_event


async def _drive(calibrator: Calibrator) -> CalibrationRun:
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, calibrator.interrupt)
    try:
        return await calibrator.run()
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signum)


def run_calibration(
    cluster: Cluster,
    options: CalibrateOptions,
    ssh: SshOptions,
    console: Console,
    *,
    to_stderr: bool = False,
) -> CalibrationRun:
    """Measure ``cluster`` with the job's output on the terminal (``corral calibrate``
    and ``corral run --calibration auto``); Ctrl-C exits 130."""
    calibrator = Calibrator(cluster, options, ssh=ssh)
    terminal = TerminalOutput(
        [h.name for h in cluster.hosts], stream=sys.stderr.buffer if to_stderr else None
    )
    calibrator.subscribe(_subscriber(calibrator, terminal, console))
    try:
        run = asyncio.run(_drive(calibrator))
    except Exception:
        terminal.close()
        if calibrator.interrupted:
            raise typer.Exit(EXIT_INTERRUPTED) from None
        raise
    terminal.close()
    return run


def calibrate(
    command: ScriptArg = None,
    hosts: HostsOpt = None,
    ssh_user: SshUserOpt = None,
    ssh_key: SshKeyOpt = None,
    ssh_port: SshPortOpt = None,
    ssh_password_env: SshPasswordEnvOpt = None,
    ssh_config: SshConfigOpt = None,
    accept_new_host_keys: AcceptNewHostKeysOpt = False,
    insecure_no_host_key_check: InsecureNoHostKeyCheckOpt = False,
    seconds: SecondsOpt = DEFAULT_SECONDS,
    nproc_per_node: NprocOpt = None,
    python: PythonOpt = None,
    workdir: WorkdirOpt = None,
    env: EnvOpt = None,
    threads: ThreadsOpt = None,
    run_dir: RunDirOpt = "runs",
    job_id: JobIdOpt = None,
    as_json: JsonOpt = False,
    output: OutputOpt = None,
) -> None:
    """Measure every rank's throughput (examples/s) at once and the split it calls for.

    Without a script, every rank trains corral's reference model (sized to its device)
    for --seconds. With -- SCRIPT [ARGS], the script runs with CORRAL_CALIBRATE=1 and
    must call sdk.report(step, examples=N) each step; corral stops it after --seconds.
    The result is saved as runs/<job-id>/calibration.json and runs/calibration-latest.json,
    for corral run --calibration FILE.
    """
    ssh = SshOptions(
        user=ssh_user,
        key=ssh_key,
        port=ssh_port,
        password_env=ssh_password_env,
        config=ssh_config,
        accept_new_host_keys=accept_new_host_keys,
        insecure_no_host_key_check=insecure_no_host_key_check,
    )
    cluster = load_cluster(require_hosts(hosts), ssh_user=ssh.user, ssh_port=ssh.port)
    options = CalibrateOptions(
        seconds=seconds,
        command=tuple(command or ()),
        nproc_per_node=parse_nproc(nproc_per_node, cluster),
        python=python,
        workdir=workdir,
        env=parse_env(env or []),
        run_dir=run_dir,
        job_id=job_id,
        threads=threads,
    )
    console = make_console(stderr=as_json)
    run = run_calibration(cluster, options, ssh, console, to_stderr=as_json)
    saved = [run.path, run.latest]
    if output:
        saved.append(save_calibration(run.calibration, Path(output)))
    if as_json:
        doc = CalibrationFile(hardware_calibration=run.calibration)
        sys.stdout.write(doc.model_dump_json(indent=2) + "\n")
        return
    print_calibration(run.calibration, console)
    console.print(f"saved {', '.join(str(p) for p in saved)}", style="dim", markup=False)
    console.print(
        f"use it: corral run --calibration {run.path} ... (same --hosts)",
        style="dim",
        markup=False,
    )


def register(app: typer.Typer) -> None:
    """Add ``calibrate`` to the root app."""
    app.command("calibrate", context_settings={"allow_interspersed_args": False})(calibrate)
