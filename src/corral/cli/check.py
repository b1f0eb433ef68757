"""``corral check [CLUSTER] [LAUNCH] [--json] [-- SCRIPT]``: the pre-flight checklist.

Every check runs on every host in parallel; one line per check (the failing or
warning hosts named, the reason, the fix) goes to stderr, the check x host
matrix with ``--wide``, or the JSON report to stdout with ``--json``.
Exit 0 when nothing failed (warnings included), 1 when a check failed,
2 for bad options.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Annotated

import typer

from corral.checks.context import (
    DEFAULT_LINKS_MIN_RATIO,
    DEFAULT_LINKS_SECONDS,
    DEFAULT_SMOKE_TIMEOUT,
    ChecklistOptions,
    validate_links,
)
from corral.checks.links import print_links
from corral.checks.render import print_report
from corral.checks.runner import run_checklist
from corral.checks.shared_data import validate_path
from corral.cli.common import (
    HostsOpt,
    load_hosts,
    ssh_flags,
)
from corral.cli.options import (
    CHECKS_PANEL,
    FLAG_DEFAULTS,
    CheckpointOpt,
    CodeDirOpt,
    ExcludeOpt,
    GlooOpt,
    LauncherOpt,
    LinksMinGbsOpt,
    LinksMinRatioOpt,
    LinksWarnOpt,
    MasterAddrOpt,
    MasterPortOpt,
    MinFreeOpt,
    NcclOpt,
    NprocOpt,
    PythonOpt,
    RunDirOpt,
    SharedDataPathOpt,
    ThresholdOpt,
    WorkdirOpt,
)
from corral.console import make_console
from corral.contract import BACKEND_ENV
from corral.defaults import DEFAULT_CONNECT_TIMEOUT
from corral.diagnose.gpu import job_backend
from corral.errors import ConfigError
from corral.harness.config import harness_target
from corral.job.resolve import parse_nproc
from corral.plan.spec import LAUNCHERS
from corral.transport.options import SshOptions

ScriptArg = Annotated[
    list[str] | None,
    typer.Argument(
        help="The script the job would run, after `--` (its arguments are ignored).",
        show_default=False,
        metavar="[-- SCRIPT [ARGS]...]",
    ),
]
SmokeTimeoutOpt = Annotated[
    float,
    typer.Option(
        "--smoke-timeout",
        metavar="SECONDS",
        help="Deadline of the collective smoke test, in seconds.",
        rich_help_panel=CHECKS_PANEL,
    ),
]
LinksSecondsOpt = Annotated[
    float,
    typer.Option(
        "--links-seconds",
        metavar="SECONDS",
        help="Time budget of the link matrix's measurements, all pairs together (each "
        "direction of a pair gets a share, at most 0.5 s).",
        rich_help_panel=CHECKS_PANEL,
    ),
]
ConnectTimeoutOpt = Annotated[
    float,
    typer.Option(
        "--connect-timeout",
        metavar="SECONDS",
        envvar="CORRAL_CONNECT_TIMEOUT",
        help="Seconds to wait for each host's SSH connection.",
        rich_help_panel=CHECKS_PANEL,
    ),
]


def checklist_options(
    *,
    hosts: str | None,
    ssh: SshOptions,
    command: list[str] | None,
    launcher: str,
    python: str | None,
    nproc_per_node: str | None,
    master_addr: str | None,
    master_port: int,
    workdir: str | None,
    nccl_interface: str | None,
    gloo_interface: str | None,
    checkpoint_dir: str | None,
    min_free_gb: float,
    consistency_threshold: float,
    exclude_divergent: bool,
    code_dir: str | None,
    smoke: bool,
    smoke_timeout: float,
    connect_timeout: float,
    shared_data_path: str | None = None,
    harness: bool = False,
    links: bool = False,
    links_min_ratio: float = DEFAULT_LINKS_MIN_RATIO,
    links_min_gbs: float = 0.0,
    links_warn_only: bool = False,
    links_seconds: float = DEFAULT_LINKS_SECONDS,
) -> ChecklistOptions:
    """Validated ChecklistOptions from the command line (with ``harness``, the
    command is ``PLUGIN_DIR_OR_SCRIPT [ARGS]`` as for ``corral run --harness``)."""
    if launcher not in LAUNCHERS:
        raise ConfigError(
            f"unknown launcher {launcher!r}; choose one of {', '.join(LAUNCHERS)}",
            option="--launcher",
        )
    if not 0.0 < consistency_threshold <= 1.0:
        raise ConfigError(
            f"must be in (0, 1] (got {consistency_threshold:g})", option="--consistency-threshold"
        )
    if min_free_gb < 0:
        raise ConfigError(f"must be >= 0 (got {min_free_gb:g})", option="--min-free-gb")
    if not 0 <= master_port <= 65535:
        raise ConfigError(f"{master_port} is not a TCP port", option="--master-port")
    validate_path(shared_data_path)
    validate_links(links_min_ratio, links_min_gbs, links_seconds)
    cluster = load_hosts(hosts, ssh)
    return ChecklistOptions(
        cluster=cluster,
        ssh=ssh,
        launcher=launcher,
        python=python,
        workdir=workdir,
        code_dir=code_dir,
        script=_script(command, harness),
        master_addr=master_addr,
        master_port=master_port,
        nproc_per_node=parse_nproc(nproc_per_node, cluster),
        backend=job_backend(os.environ, where=BACKEND_ENV),
        nccl_interface=nccl_interface,
        gloo_interface=gloo_interface,
        checkpoint_dir=checkpoint_dir,
        min_free_gb=min_free_gb,
        consistency_threshold=consistency_threshold,
        exclude_divergent=exclude_divergent,
        smoke=smoke,
        smoke_timeout=smoke_timeout,
        connect_timeout=connect_timeout,
        shared_data_path=shared_data_path,
        harness=harness,
        links=links,
        links_min_ratio=links_min_ratio,
        links_min_gbs=links_min_gbs,
        links_fail=not links_warn_only,
        links_seconds=links_seconds,
    )


def _script(command: list[str] | None, harness: bool) -> str | None:
    """The script the code checks look at: the command's first word, or under
    ``--harness`` the plugin's ``main.py`` when it names a plugin directory."""
    if not command:
        return None
    return harness_target(command[0])[1] if harness else command[0]


@ssh_flags()
def check(
    command: ScriptArg = None,
    hosts: HostsOpt = None,
    ssh: SshOptions = SshOptions(),  # noqa: B008 (the SSH flags, see ssh_flags)
    launcher: LauncherOpt = "torchrun",
    python: PythonOpt = None,
    nproc_per_node: NprocOpt = None,
    master_addr: MasterAddrOpt = None,
    master_port: MasterPortOpt = FLAG_DEFAULTS["master_port"],
    workdir: WorkdirOpt = None,
    nccl_interface: NcclOpt = None,
    gloo_interface: GlooOpt = None,
    checkpoint_dir: CheckpointOpt = None,
    run_dir: RunDirOpt = FLAG_DEFAULTS["run_dir"],
    min_free_gb: MinFreeOpt = FLAG_DEFAULTS["min_free_gb"],
    consistency_threshold: ThresholdOpt = FLAG_DEFAULTS["consistency_threshold"],
    exclude_divergent: ExcludeOpt = FLAG_DEFAULTS["exclude_divergent"],
    code_dir: CodeDirOpt = None,
    shared_data_path: SharedDataPathOpt = None,
    harness: Annotated[
        bool,
        typer.Option(
            "--harness",
            help="Check for `corral run --harness -- PLUGIN_DIR_OR_SCRIPT ...`: Accelerate "
            "must be on every host whatever the launcher, and the plugin's main.py is "
            "the script the code checks compare.",
        ),
    ] = False,
    smoke: Annotated[
        bool,
        typer.Option(
            "--smoke-test/--no-smoke-test",
            help="Run the collective smoke test (a real all-reduce over every rank).",
            rich_help_panel=CHECKS_PANEL,
        ),
    ] = True,
    smoke_timeout: SmokeTimeoutOpt = DEFAULT_SMOKE_TIMEOUT,
    links: Annotated[
        bool,
        typer.Option(
            "--links",
            help="Measure the link matrix over the training network: bandwidth and round "
            "trip of every host pair, a ring figure (NCCL bus bandwidth where every host "
            "has a GPU), naming the host behind slow links.",
            rich_help_panel=CHECKS_PANEL,
        ),
    ] = False,
    links_min_ratio: LinksMinRatioOpt = FLAG_DEFAULTS["links_min_ratio"],
    links_min_gbs: LinksMinGbsOpt = FLAG_DEFAULTS["links_min_gbs"],
    links_warn_only: LinksWarnOpt = FLAG_DEFAULTS["links_warn_only"],
    links_seconds: LinksSecondsOpt = DEFAULT_LINKS_SECONDS,
    connect_timeout: ConnectTimeoutOpt = DEFAULT_CONNECT_TIMEOUT,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
    wide: Annotated[
        bool, typer.Option("--wide", help="Show every check on every host (a check x host table).")
    ] = False,
) -> None:
    """Run the pre-flight checklist on every host: connectivity, hardware, software
    versions, code consistency, network (master port, reachability, interfaces),
    checkpoint dir, clock skew, stale processes, a collective smoke test, sync status;
    with --shared-data-path, that the path is one filesystem on every host.

    With --links, the link matrix too: every host pair's bandwidth and round trip
    over the training network (a host x host heatmap), naming the host behind
    slow links.

    Exit 0 when no check failed, 1 when one did, 2 for bad options.
    """
    opts = checklist_options(
        hosts=hosts,
        ssh=ssh,
        command=command,
        launcher=launcher,
        python=python,
        nproc_per_node=nproc_per_node,
        master_addr=master_addr,
        master_port=master_port,
        workdir=workdir,
        nccl_interface=nccl_interface,
        gloo_interface=gloo_interface,
        checkpoint_dir=checkpoint_dir,
        min_free_gb=min_free_gb,
        consistency_threshold=consistency_threshold,
        exclude_divergent=exclude_divergent,
        code_dir=code_dir,
        smoke=smoke,
        smoke_timeout=smoke_timeout,
        connect_timeout=connect_timeout,
        shared_data_path=shared_data_path,
        harness=harness,
        links=links,
        links_min_ratio=links_min_ratio,
        links_min_gbs=links_min_gbs,
        links_warn_only=links_warn_only,
        links_seconds=links_seconds,
    )
    outcome = asyncio.run(run_checklist(opts, run_dir=run_dir))
    report = outcome.report
    if as_json:
        doc = report.to_json()
        doc["excluded"] = outcome.excluded
        doc["interfaces"] = outcome.interfaces
        doc["phases_s"] = {k: round(v, 4) for k, v in outcome.phases.items()}
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
    else:
        console = make_console()
        print_report(console, report, wide=wide)
        print_links(console, report)
    raise typer.Exit(1 if report.failed else 0)


def register(app: typer.Typer) -> None:
    """Add ``check`` to the root app."""
    app.command("check", context_settings={"allow_interspersed_args": False})(check)
