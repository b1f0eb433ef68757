"""``corral ping [CLUSTER] [--timeout S] [--json]``: list the hosts that do not answer.

Every host is pinged at once (``echo`` over a fresh SSH connection, or a local
process for ``local:N``) with a hard deadline per host. A table (host, status,
``ssh echo`` time, cause) goes to stderr; stdout gets the names of the hosts that
did not answer, one per line (``corral ping --hosts f | xargs ...``), or with
``--json`` one JSON document.

The ``ssh echo`` time is the whole round trip of one ``echo`` over a new
connection (TCP and SSH handshakes, authentication, the remote shell), so it is
far larger than the network round-trip time ``corral check`` reports for its
connectivity check over an established connection.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from corral.cli.common import (
    HostsOpt,
    load_hosts,
    ssh_flags,
)
from corral.cluster import Cluster
from corral.console import make_console
from corral.errors import ConfigError
from corral.fleet.ping import DEFAULT_PING_TIMEOUT, PingResult, failed_hosts, ping_hosts
from corral.transport.choose import transport_for
from corral.transport.options import SshOptions

EXIT_OK = 0
EXIT_FAILED = 1

TimeoutOpt = Annotated[
    float,
    typer.Option(
        "--timeout",
        metavar="SECONDS",
        envvar="CORRAL_PING_TIMEOUT",
        help="Hard deadline per host in seconds, covering connect, auth and the command.",
    ),
]
JsonOpt = Annotated[
    bool,
    typer.Option(
        "--json",
        help='Print {"hosts": {name: {"ok", "ssh_echo_ms", "rtt_ms", "error", "cause"}}, '
        '"failed": [...], "ok": [...]} on stdout instead of the table and the failed names. '
        "ssh_echo_ms is echo over a new SSH connection, login included (not the network "
        "round trip); rtt_ms is the same value under its former name.",
    ),
]


def _entry(result: PingResult) -> dict[str, object]:
    """One host's JSON entry: ``ssh_echo_ms`` first, ``rtt_ms`` kept as its alias."""
    entry = result.to_dict()
    return {"ok": entry.pop("ok"), "ssh_echo_ms": entry["rtt_ms"], **entry}


def to_json(results: Mapping[str, PingResult]) -> str:
    """The ``--json`` document."""
    doc = {
        "hosts": {name: _entry(r) for name, r in results.items()},
        "failed": failed_hosts(results),
        "ok": [name for name, r in results.items() if r.ok],
    }
    return json.dumps(doc, indent=2)


def print_table(results: Mapping[str, PingResult], console: Console) -> None:
    """The host/status/ssh echo/cause table, each failure's full message, and a summary
    line."""
    table = Table(show_edge=False, pad_edge=False, box=None, header_style="bold")
    table.add_column("host")
    table.add_column("status")
    table.add_column("ssh echo", justify="right")
    table.add_column("cause")
    for name, r in results.items():
        table.add_row(
            name,
            Text("ok" if r.ok else "failed", style="green" if r.ok else "red"),
            "-" if r.rtt_ms is None else f"{r.rtt_ms:.1f} ms",
            r.cause or "",
        )
    console.print(table)
    for r in results.values():
        if r.error is not None:
            console.print(Text(f"  {r.error}", style="red"), soft_wrap=True)
    ok = sum(r.ok for r in results.values())
    style = "bold green" if ok == len(results) else "bold red"
    console.print(Text(f"{ok}/{len(results)} hosts answered", style=style))


async def ping_cluster(
    cluster: Cluster,
    ssh: SshOptions,
    *,
    timeout: float = DEFAULT_PING_TIMEOUT,
) -> dict[str, PingResult]:
    """Ping every host of ``cluster`` over a fresh transport, closed afterwards."""
    hosts = list(cluster.hosts)
    # The transport stops connecting at the deadline too, so nothing outlives the ping.
    transport = transport_for(
        cluster, ssh, connect_timeout=timeout, max_concurrency=max(64, len(hosts))
    )
    try:
        return await ping_hosts(transport, hosts, timeout=timeout)
    finally:
        await transport.close()


@ssh_flags()
def ping(
    hosts: HostsOpt = None,
    ssh: SshOptions = SshOptions(),  # noqa: B008 (the SSH flags, see ssh_flags)
    timeout: TimeoutOpt = DEFAULT_PING_TIMEOUT,
    as_json: JsonOpt = False,
) -> None:
    """List the hosts that do not answer (echo over SSH, with a deadline per host).

    The table goes to stderr; stdout gets the failed host names, one per line (or
    the --json document). Its "ssh echo" column is the time of one echo over a new
    SSH connection, login included: not the network round trip `corral check`
    reports. Exit codes: 0 every host answered; 1 some did not; 2 bad options or
    hostfile.
    """
    if not timeout > 0:
        raise ConfigError(f"invalid timeout {timeout:g}: expected seconds > 0", option="--timeout")
    cluster = load_hosts(hosts, ssh)
    results = asyncio.run(ping_cluster(cluster, ssh, timeout=timeout))
    failed = failed_hosts(results)
    if as_json:
        typer.echo(to_json(results))
    else:
        print_table(results, make_console())
        for name in failed:
            typer.echo(name)
    if failed:
        raise typer.Exit(EXIT_FAILED)


def register(app: typer.Typer) -> None:
    """Add ``ping`` to the root app."""
    app.command("ping")(ping)
