"""``corral exec [CLUSTER] -- COMMAND...``: one shell command on every node in parallel.

First every host is connected at once; if any cannot be reached they are listed
with the cause and nothing runs (exit 2). Then the command runs everywhere in
parallel, each output line prefixed ``[host]`` (remote stdout to stdout, remote
stderr to stderr, lines never split), and a summary table goes to stderr.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Sequence
from typing import IO, Annotated

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from corral.cli.common import (
    HostsOpt,
    load_hosts,
    ssh_flags,
)
from corral.cluster import Cluster, Host
from corral.console import make_console
from corral.errors import ConfigError, TransportError
from corral.fleet.fanout import (
    HostResult,
    Stream,
    check_connectivity,
    run_on_hosts,
    unreachable_summary,
)
from corral.transport.base import Transport
from corral.transport.choose import transport_for
from corral.transport.options import SshOptions

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_UNREACHABLE = 2

_COLORS = (36, 35, 32, 33, 34, 91, 96, 95, 92, 93, 94)  # ANSI foreground codes

CommandArg = Annotated[
    list[str],
    typer.Argument(
        help="Shell command line (after `--`), run by each host's login shell: words are "
        "joined with spaces as `ssh host CMD` does, so quote once for the remote shell, "
        "e.g. corral exec -- 'echo $HOSTNAME'.",
        show_default=False,
        metavar="COMMAND...",
    ),
]
TimeoutOpt = Annotated[
    float | None,
    typer.Option(
        "--timeout",
        metavar="SECONDS",
        envvar="CORRAL_EXEC_TIMEOUT",
        help="Per-host limit in seconds; on expiry the host's processes are killed and the "
        "host counts as failed.",
        show_default=False,
    ),
]
JsonOpt = Annotated[
    bool,
    typer.Option(
        "--json",
        help="No live output; print every host's result (with its "
        "captured output) as JSON on stdout.",
    ),
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
FanoutOpt = Annotated[
    int,
    typer.Option("--fanout", "-f", min=1, help="At most this many SSH handshakes at once."),
]

_JSON_CAPTURE_LIMIT = 16 << 20


class LinePrinter:
    """Writes whole-line chunks prefixed ``[host] `` with one write per chunk."""

    def __init__(
        self,
        hosts: Sequence[Host],
        *,
        stdout: IO[bytes] | None = None,
        stderr: IO[bytes] | None = None,
        color: bool | None = None,
    ) -> None:
        self.out = stdout if stdout is not None else sys.stdout.buffer
        self.err = stderr if stderr is not None else sys.stderr.buffer
        if color is None:
            color = sys.stdout.isatty() and "NO_COLOR" not in os.environ
        width = max((len(h.name) for h in hosts), default=0)
        self._prefix: dict[str, bytes] = {}
        for i, h in enumerate(hosts):
            label = f"[{h.name}]".ljust(width + 2) if color else f"[{h.name}]"
            if color:
                label = f"\x1b[{_COLORS[i % len(_COLORS)]}m{label}\x1b[0m"
            self._prefix[h.name] = (label + " ").encode()

    def __call__(self, host: Host, stream: Stream, data: bytes) -> None:
        prefix = self._prefix.get(host.name) or f"[{host.name}] ".encode()
        body = data[:-1] if data.endswith(b"\n") else data
        target = self.out if stream == "stdout" else self.err
        target.write(prefix + body.replace(b"\n", b"\n" + prefix) + b"\n")
        target.flush()


def _summary(results: Sequence[HostResult], console: Console) -> None:
    table = Table(show_edge=False, pad_edge=False, box=None, header_style="bold")
    table.add_column("host")
    table.add_column("result")
    table.add_column("exit", justify="right")
    table.add_column("time", justify="right")
    for r in results:
        style = "green" if r.ok else "red"
        table.add_row(
            r.host,
            Text(r.status, style=style),
            "-" if r.exit_code is None else str(r.exit_code),
            f"{r.duration:.2f}s",
        )
    console.print(table)
    for r in results:
        if r.error is not None:
            console.print(Text(f"  {r.error}", style="red"), soft_wrap=True)
    ok = sum(r.ok for r in results)
    style = "bold green" if ok == len(results) else "bold red"
    console.print(Text(f"{ok}/{len(results)} hosts succeeded", style=style))


def make_transport(
    cluster: Cluster, ssh: SshOptions, *, connect_timeout: float | None = None, fanout: int = 64
) -> Transport:
    """LocalTransport for ``local:N``, else an SshTransport for the CLUSTER options."""
    return transport_for(cluster, ssh, connect_timeout=connect_timeout, max_concurrency=fanout)


async def exec_on_cluster(
    cluster: Cluster,
    command: str,
    ssh: SshOptions,
    *,
    timeout: float | None = None,
    as_json: bool = False,
    connect_timeout: float | None = None,
    fanout: int = 64,
    console: Console | None = None,
) -> int:
    """The whole ``corral exec``: connectivity check, parallel run, summary; the exit code."""
    console = console or make_console()
    hosts = list(cluster.hosts)
    transport = make_transport(cluster, ssh, connect_timeout=connect_timeout, fanout=fanout)
    try:
        unreachable = await check_connectivity(transport, hosts)
        if unreachable:
            return _report_unreachable(hosts, unreachable, command, as_json, console)
        cwd = os.getcwd() if cluster.is_local else None
        if as_json:
            results = await run_on_hosts(
                transport,
                hosts,
                command,
                timeout=timeout,
                cwd=cwd,
                capture_limit=_JSON_CAPTURE_LIMIT,
            )
        else:
            results = await run_on_hosts(
                transport, hosts, command, timeout=timeout, cwd=cwd, on_output=LinePrinter(hosts)
            )
    finally:
        await transport.close()
    ok = sum(r.ok for r in results)
    if as_json:
        doc = {
            "command": command,
            "succeeded": ok,
            "total": len(results),
            "hosts": [r.to_dict() for r in results],
        }
        typer.echo(json.dumps(doc, indent=2))
    else:
        _summary(results, console)
    return EXIT_OK if ok == len(results) else EXIT_FAILED


def _report_unreachable(
    hosts: Sequence[Host],
    errors: dict[str, TransportError],
    command: str,
    as_json: bool,
    console: Console,
) -> int:
    if as_json:
        doc = {
            "command": command,
            "succeeded": 0,
            "total": len(hosts),
            "unreachable": [
                {"host": name, "cause": e.cause, "error": str(e)} for name, e in errors.items()
            ],
            "hosts": [],
        }
        typer.echo(json.dumps(doc, indent=2))
    for error in errors.values():
        console.print(Text("error: ", style="bold red") + Text(str(error)), soft_wrap=True)
    console.print(
        Text(f"{unreachable_summary(errors)}; nothing was run", style="bold red"), soft_wrap=True
    )
    return EXIT_UNREACHABLE


@ssh_flags()
def exec_(
    command: CommandArg,
    hosts: HostsOpt = None,
    ssh: SshOptions = SshOptions(),  # noqa: B008 (the SSH flags, see ssh_flags)
    timeout: TimeoutOpt = None,
    as_json: JsonOpt = False,
    connect_timeout: ConnectTimeoutOpt = None,
    fanout: FanoutOpt = 64,
) -> None:
    """Run a shell command on every node in parallel, output prefixed [host].

    Every host is connected first; unreachable hosts are listed with the cause and
    nothing runs. Exit codes: 0 every host succeeded; 1 the command failed, timed out
    or lost its connection on some host; 2 a host was unreachable or bad options.
    On local:N clusters each node runs the command here, in the current directory.
    """
    if not command:
        raise ConfigError("no command given: expected `corral exec [OPTIONS] -- COMMAND...`")
    if timeout is not None and timeout <= 0:
        raise ConfigError(f"invalid timeout {timeout:g}: expected seconds > 0", option="--timeout")
    cluster = load_hosts(hosts, ssh)
    code = asyncio.run(
        exec_on_cluster(
            cluster,
            " ".join(command),
            ssh,
            timeout=timeout,
            as_json=as_json,
            connect_timeout=connect_timeout,
            fanout=fanout,
        )
    )
    if code:
        raise typer.Exit(code)


def register(app: typer.Typer) -> None:
    """Add ``exec`` to the root app."""
    app.command("exec", context_settings={"allow_interspersed_args": False})(exec_)
