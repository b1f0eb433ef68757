"""``corral calibrate``: measure every rank's examples/s and the split they call for."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Annotated

import typer

from corral.calibrate.launch import measure
from corral.calibrate.measure import DEFAULT_SECONDS, CalibrateOptions, Calibrator
from corral.cli.calibration_view import CalibrationTerminal, print_calibration
from corral.cli.common import HostsOpt, load_hosts, ssh_flags
from corral.cli.options import (
    FLAG_DEFAULTS,
    EnvOpt,
    JobIdOpt,
    NprocOpt,
    PythonOpt,
    RunDirOpt,
    ScriptArg,
    WorkdirOpt,
)
from corral.console import make_console
from corral.errors import ConfigError
from corral.job.resolve import parse_env, parse_nproc
from corral.job.result import EXIT_INTERRUPTED
from corral.throughput.model import CalibrationFile, save_calibration
from corral.transport.options import SshOptions

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
MemCapOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--mem-cap",
        metavar="HOST=MB",
        help="Declare HOST's memory in MiB (repeatable): its ranks probe the largest "
        "micro-batch whose measured step peak fits under it (also: CORRAL_MEM_CAP_MB in "
        "a host's env). On a GPU the card's own out-of-memory is probed without it.",
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


@ssh_flags()
def calibrate(
    command: ScriptArg = None,
    hosts: HostsOpt = None,
    ssh: SshOptions = SshOptions(),  # noqa: B008 (the SSH flags, see ssh_flags)
    seconds: SecondsOpt = DEFAULT_SECONDS,
    nproc_per_node: NprocOpt = None,
    python: PythonOpt = None,
    workdir: WorkdirOpt = None,
    env: EnvOpt = None,
    threads: ThreadsOpt = None,
    mem_cap: MemCapOpt = None,
    run_dir: RunDirOpt = FLAG_DEFAULTS["run_dir"],
    job_id: JobIdOpt = None,
    as_json: JsonOpt = False,
    output: OutputOpt = None,
) -> None:
    """Measure every rank's throughput (examples/s) at once and the split it calls for.

    Without a script, every rank trains corral's reference model (sized to its device)
    for --seconds. With -- SCRIPT [ARGS], the script runs with CORRAL_CALIBRATE=1 and
    must call sdk.report(step, examples=N) each step; corral stops it after --seconds.
    A rank that probes the largest micro-batch it fits (sdk.probe_fit; the built-in
    workload does on a GPU or under --mem-cap) has it recorded in the "fits" column.
    The result is saved as runs/<job-id>/calibration.json and runs/calibration-latest.json,
    for corral run --calibration FILE.
    """
    cluster = load_hosts(hosts, ssh)
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
        mem_caps=_mem_caps(mem_cap or []),
    )
    console = make_console(stderr=as_json)
    calibrator = Calibrator(cluster, options, ssh=ssh)
    terminal = CalibrationTerminal(cluster, console, to_stderr=as_json)
    terminal.watch(calibrator)
    try:
        run = asyncio.run(measure(calibrator))
    finally:
        terminal.close()
    if run is None:
        raise typer.Exit(EXIT_INTERRUPTED)  # Ctrl-C
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


def _mem_caps(given: list[str]) -> dict[str, float]:
    """``HOST=MB`` pairs; ConfigError (``--mem-cap``) naming a malformed one."""
    caps: dict[str, float] = {}
    for item in given:
        host, sep, value = item.partition("=")
        try:
            mib = float(value)
        except ValueError:
            mib = 0.0
        if not sep or not host.strip() or not mib > 0 or mib == float("inf"):
            raise ConfigError(
                f"{item!r}: expected HOST=MB with a positive number of MiB", option="--mem-cap"
            )
        caps[host.strip()] = mib
    return caps


def register(app: typer.Typer) -> None:
    """Add ``calibrate`` to the root app."""
    app.command("calibrate", context_settings={"allow_interspersed_args": False})(calibrate)
