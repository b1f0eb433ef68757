"""``corral sync [CLUSTER] [SRC] [--dest DIR] [--delete]``: push the code tree to every host.

One rsync per host, all in parallel, over the same SSH settings as corral's
own transport; the files are the code tree the consistency check hashes
(``.gitignore`` / ``.corralignore`` honoured). On a terminal each host gets a
live progress bar on stderr (plain lines otherwise); a summary table follows.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import Coroutine
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TaskProgressColumn, TextColumn
from rich.table import Table
from rich.text import Text

from corral.cli.common import (
    HostsOpt,
    load_hosts,
    require_hosts,
    ssh_flags,
)
from corral.cluster import Cluster
from corral.console import make_console
from corral.signals import stop_on_signals
from corral.sync.push import (
    DEFAULT_FANOUT,
    HostSync,
    SyncReport,
    normalize_dest,
    summary_line,
    sync_tree,
)
from corral.sync.rsync_output import RsyncProgress
from corral.sync.script import ScriptResult, run_sync_script
from corral.transport.options import SshOptions

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130

SrcArg = Annotated[
    str,
    typer.Argument(help="The code tree to push (default: the current directory).", metavar="[SRC]"),
]
DestOpt = Annotated[
    str | None,
    typer.Option(
        "--dest",
        metavar="DIR",
        envvar="CORRAL_SYNC_DEST",
        help="Directory on the hosts (created if missing; default: SRC's absolute path). "
        "A relative path is relative to the remote home.",
        show_default=False,
    ),
]
DeleteOpt = Annotated[
    bool,
    typer.Option(
        "--delete",
        help="Remove files on the hosts that the tree does not have (files the hosts' "
        ".gitignore/.corralignore exclude are kept).",
    ),
]
ScriptOpt = Annotated[
    str | None,
    typer.Option(
        "--sync-script",
        metavar="FILE",
        envvar="CORRAL_SYNC_SCRIPT",
        help="Your own script, run here first: a non-zero exit stops the sync (exit 1); "
        "a missing script is a warning.",
        show_default=False,
    ),
]
CompressOpt = Annotated[
    bool, typer.Option("--compress", "-z", help="Compress on the wire (slow links only).")
]
ChecksumOpt = Annotated[
    bool,
    typer.Option(
        "--checksum", help="Compare file contents, not size and modification time (slower)."
    ),
]
JsonOpt = Annotated[
    bool, typer.Option("--json", help="No live output; print the report as JSON on stdout.")
]
FanoutOpt = Annotated[
    int, typer.Option("--fanout", "-f", min=1, help="At most this many hosts at once.")
]
ConnectTimeoutOpt = Annotated[
    float | None,
    typer.Option(
        "--connect-timeout",
        metavar="SECONDS",
        help="Seconds to connect to a host (default: the ssh config's ConnectTimeout, else 10).",
        show_default=False,
    ),
]
PythonOpt = Annotated[
    str | None,
    typer.Option(
        "--python",
        metavar="PATH",
        help="Interpreter on the hosts for --delete (default: this interpreter's path, "
        "else python3).",
        show_default=False,
    ),
]


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f}"


class PlainDisplay:
    """One line per host when it is done (stderr is not a terminal)."""

    def __init__(self, console: Console) -> None:
        self.console = console

    def started(self, host: str) -> None:
        """Nothing to show until the host is done."""

    def progress(self, host: str, progress: RsyncProgress, phase: str) -> None:
        """Nothing to show until the host is done."""

    def finished(self, result: HostSync) -> None:
        """``[host] ok: N files, X MB sent, S s`` or the error."""
        if result.ok:
            deleted = f", {result.deleted} deleted" if result.deleted else ""
            text = (
                f"[{result.host}] ok: {result.files_transferred} files, "
                f"{_mb(result.bytes_sent)} MB sent{deleted}, {result.seconds:.2f} s"
            )
            self.console.print(text, markup=False, highlight=False, soft_wrap=True)
        else:
            self.console.print(
                Text(f"[{result.host}] {result.status}: {result.error}", style="red"),
                soft_wrap=True,
            )


class LiveDisplay:
    """A rich progress bar per host (files checked of the list; bytes sent, rate)."""

    def __init__(self, console: Console, hosts: list[str]) -> None:
        width = max((len(h) for h in hosts), default=4)
        self.bars = Progress(
            TextColumn(f"{{task.fields[host]:<{width}}}", markup=False),
            BarColumn(),
            TaskProgressColumn(),
            TextColumn("{task.fields[info]}"),
            console=console,
            transient=True,
        )
        self.tasks: dict[str, TaskID] = {
            h: self.bars.add_task("", total=None, host=h, info="waiting") for h in hosts
        }

    def __enter__(self) -> LiveDisplay:
        self.bars.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.bars.stop()

    def started(self, host: str) -> None:
        """The host's rsync is starting."""
        self.bars.update(self.tasks[host], info="connecting")

    def progress_info(self, progress: RsyncProgress, phase: str) -> str:
        """The text beside the bar."""
        if phase == "deleting":
            return "deleting extra files"
        rate = f", {progress.rate}" if progress.rate else ""
        return f"{progress.files_changed} files, {_mb(progress.bytes)} MB{rate}"

    def progress(self, host: str, progress: RsyncProgress, phase: str) -> None:
        """Move the host's bar."""
        total = progress.files_total or None
        self.bars.update(
            self.tasks[host],
            total=total,
            completed=progress.files_checked,
            info=self.progress_info(progress, phase),
        )

    def finished(self, result: HostSync) -> None:
        """Fill the bar (or mark the failure)."""
        task = self.tasks[result.host]
        if result.ok:
            self.bars.update(task, total=1, completed=1, info="done")
        else:
            self.bars.update(task, total=1, completed=0, info=f"[red]{result.status}[/]")


def _summary(report: SyncReport, console: Console) -> None:
    table = Table(show_edge=False, pad_edge=False, box=None, header_style="bold")
    table.add_column("host")
    table.add_column("files", justify="right")
    table.add_column("MB sent", justify="right")
    if report.delete:
        table.add_column("deleted", justify="right")
    table.add_column("seconds", justify="right")
    table.add_column("status")
    for h in report.hosts:
        style = "green" if h.ok else "red"
        row = [h.host, str(h.files_transferred), _mb(h.bytes_sent)]
        if report.delete:
            row.append(str(h.deleted))
        row.append(f"{h.seconds:.2f}")
        table.add_row(*row, Text(h.status, style=style))
    console.print(table)
    for h in report.hosts:
        if h.error is not None:
            cause = h.cause if h.cause and h.cause.lower() not in h.error.lower() else None
            line = f"  {h.host}: {h.error}" + (f" ({cause})" if cause else "")
            console.print(Text(line, style="red"), soft_wrap=True)
    for warning in report.warnings:
        console.print(Text(f"warning: {warning}", style="yellow"), soft_wrap=True)
    style = "bold green" if report.ok else "bold red"
    console.print(Text(summary_line(report), style=style), soft_wrap=True)


async def interruptible(work: Coroutine[Any, Any, int]) -> int | None:
    """Run ``work``; Ctrl-C or SIGTERM cancels it (its processes are stopped and
    reaped on the way out) and gives None. A second signal does not cut that short."""
    task = asyncio.current_task()
    assert task is not None
    interrupted = False

    def stop() -> None:
        nonlocal interrupted
        if not interrupted:
            interrupted = True
            task.cancel()

    with stop_on_signals(stop):
        try:
            return await work
        except asyncio.CancelledError:
            if interrupted:
                return None
            raise


async def sync_cluster(
    cluster: Cluster,
    src: str,
    dest: str | None,
    ssh: SshOptions,
    *,
    hosts_spec: str = "",
    delete: bool = False,
    sync_script: str | None = None,
    compress: bool = False,
    checksum: bool = False,
    as_json: bool = False,
    fanout: int = DEFAULT_FANOUT,
    connect_timeout: float | None = None,
    python: str | None = None,
    console: Console | None = None,
) -> int:
    """The whole ``corral sync``: sync script, parallel push, summary; the exit code."""
    console = console or make_console()
    script: ScriptResult | None = None
    if sync_script is not None:

        def echo(line: str) -> None:
            console.print(line, markup=False, highlight=False, soft_wrap=True)

        root = os.path.abspath(os.path.expanduser(src))
        script = await run_sync_script(
            sync_script,
            hosts_spec=hosts_spec,
            host_names=[h.name for h in cluster.hosts],
            src=root,
            dest=normalize_dest(dest, root),
            on_line=None if as_json else echo,
        )
        if script.status == "missing" and not as_json:
            console.print(Text(f"warning: {script.message}", style="yellow"), soft_wrap=True)
        if script.blocks:
            if as_json:
                doc = {"ok": False, "script": script.to_json(), "hosts": []}
                typer.echo(json.dumps(doc, indent=2))
            console.print(
                Text("error: ", style="bold red") + Text(f"{script.message}; nothing was pushed"),
                soft_wrap=True,
            )
            return EXIT_FAILED
    listener: PlainDisplay | LiveDisplay | None = None
    with contextlib.ExitStack() as stack:
        if not (as_json or cluster.is_local):
            if console.is_terminal:
                hosts = [h.name for h in cluster.hosts]
                listener = stack.enter_context(LiveDisplay(console, hosts))
            else:
                listener = PlainDisplay(console)
        report = await sync_tree(
            cluster,
            src,
            dest,
            ssh,
            delete=delete,
            compress=compress,
            checksum=checksum,
            fanout=fanout,
            connect_timeout=connect_timeout,
            python=python,
            listener=listener,
        )
    report.script = script
    if as_json:
        typer.echo(json.dumps(report.to_json(), indent=2))
    elif report.local:
        console.print(
            f"{cluster.size} local nodes share this machine's filesystem: nothing to push",
            markup=False,
        )
    else:
        _summary(report, console)
    return report.exit_code


@ssh_flags()
def sync(
    src: SrcArg = ".",
    hosts: HostsOpt = None,
    ssh: SshOptions = SshOptions(),  # noqa: B008 (the SSH flags, see ssh_flags)
    dest: DestOpt = None,
    delete: DeleteOpt = False,
    sync_script: ScriptOpt = None,
    compress: CompressOpt = False,
    checksum: ChecksumOpt = False,
    as_json: JsonOpt = False,
    fanout: FanoutOpt = DEFAULT_FANOUT,
    connect_timeout: ConnectTimeoutOpt = None,
    python: PythonOpt = None,
) -> None:
    """Push the code tree SRC to every host in parallel (rsync over SSH).

    The files are those the code-consistency check hashes: .gitignore and
    .corralignore are honoured. Every successful host is recorded (with the
    tree's digest) for `corral check`. Exit codes: 0 every host synced; 1 a host
    failed or the sync script failed; 2 a host was unreachable or bad options.
    """
    spec = require_hosts(hosts)
    cluster = load_hosts(spec, ssh)
    code = asyncio.run(
        interruptible(
            sync_cluster(
                cluster,
                src,
                dest,
                ssh,
                hosts_spec=spec,
                delete=delete,
                sync_script=sync_script,
                compress=compress,
                checksum=checksum,
                as_json=as_json,
                fanout=fanout,
                connect_timeout=connect_timeout,
                python=python,
            )
        )
    )
    if code is None:
        make_console().print("[bold red]interrupted[/]: every rsync was stopped")
        raise typer.Exit(EXIT_INTERRUPTED)
    if code:
        raise typer.Exit(code)


def register(app: typer.Typer) -> None:
    """Add ``sync`` to the root app."""
    app.command("sync")(sync)
