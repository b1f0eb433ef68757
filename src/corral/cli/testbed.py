"""``corral testbed up N | down | status``: a simulated N-host cluster on this machine."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from corral.console import make_console
from corral.testbed import MAX_INSTANCES, Testbed, TestbedStatus, default_state_dir

StateDirOpt = Annotated[
    Path | None,
    typer.Option(
        "--state-dir",
        metavar="DIR",
        envvar="CORRAL_TESTBED_DIR",
        help="Where the testbed's hostfile, ssh_config, keys and state live "
        "[default: $XDG_CACHE_HOME/corral/testbed or ~/.cache/corral/testbed].",
        show_default=False,
    ),
]

InstanceOpt = Annotated[
    int,
    typer.Option(
        "--instance",
        min=0,
        max=MAX_INSTANCES - 1,
        help="Which of this machine's testbeds (each its own namespaces, bridge crlbrI, subnet, "
        "lock and default state dir ~/.cache/corral/testbed-I; 0 is the usual one).",
    ),
]

testbed_app = typer.Typer(
    name="testbed",
    help="Simulated N-host cluster on this machine: network namespaces with their own sshd "
    "(Linux, root).",
    no_args_is_help=True,
)


def _testbed(state_dir: Path | None, instance: int = 0) -> Testbed:
    return Testbed(state_dir or default_state_dir(instance), instance=instance)


@testbed_app.command("up")
def up(
    n: Annotated[int, typer.Argument(help="Number of hosts (tb1..tbN).", min=1)],
    state_dir: StateDirOpt = None,
    subnet: Annotated[
        str | None,
        typer.Option(
            "--subnet",
            help="Private IPv4 subnet for the hosts [default: 10.77.I.0/24, I the instance].",
            show_default=False,
        ),
    ] = None,
    slots: Annotated[
        int, typer.Option("--slots", min=1, help="Slots per host written to the hostfile.")
    ] = 1,
    instance: InstanceOpt = 0,
) -> None:
    """Create hosts tb1..tbN, each with its own network namespace, hostname and sshd."""
    out = make_console(stderr=False)
    tb = _testbed(state_dir, instance)
    result = tb.up(n, subnet=subnet, slots=slots)
    if result.already_up:
        out.print(f"testbed already up: {len(result.hosts)} hosts in {tb.state_dir} (no change)")
    else:
        out.print(f"testbed up: {len(result.hosts)} hosts in {result.seconds:.2f} s")
    for h in result.hosts:
        out.print(f"  {h.name}  {h.address}")
    d = tb.state_dir
    out.print(
        "\nUse it with:\n"
        f"  corral run --hosts {d}/hostfile --ssh-config {d}/ssh_config -- SCRIPT ...\n"
        f"  corral exec --hosts {d}/hostfile --ssh-config {d}/ssh_config -- hostname\n"
        f"  ssh -F {d}/ssh_config {result.hosts[0].name}\n"
        "Remove it with:\n"
        f"  corral testbed down{'' if d == default_state_dir() else f' --state-dir {d}'}",
        soft_wrap=True,
    )


@testbed_app.command("down")
def down(state_dir: StateDirOpt = None, instance: InstanceOpt = 0) -> None:
    """Remove everything `up` created (processes, namespaces, links, bridge, files)."""
    out = make_console(stderr=False)
    tb = _testbed(state_dir, instance)
    result = tb.down()
    if not result.removed:
        out.print(f"no testbed in {tb.state_dir}; nothing to do")
        for other in Testbed.all_running():
            if other.state_dir != tb.state_dir:
                out.print(f"(a testbed is up in {other.state_dir}: use --state-dir)")
        return
    out.print(f"testbed down: removed {', '.join(result.removed)}", soft_wrap=True)


def _table(st: TestbedStatus) -> Table:
    table = Table(title=f"testbed {st.state_dir} ({st.subnet}, bridge {st.bridge})")
    for col in ("host", "address", "netns", "holder", "sshd", "link", "ssh :22"):
        table.add_column(col)

    def mark(ok: bool) -> str:
        return "[green]ok[/]" if ok else "[red]no[/]"

    for h in st.hosts:
        table.add_row(
            h.name,
            h.address,
            mark(h.netns),
            mark(h.holder),
            mark(h.sshd),
            "[green]up[/]" if h.link_up else "[red]down[/]",
            "[green]answers[/]" if h.ssh_answers else "[red]no answer[/]",
        )
    return table


@testbed_app.command("status")
def status(
    state_dir: StateDirOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    instance: InstanceOpt = 0,
) -> None:
    """Show each host, its address and whether its sshd answers. Exit 1 unless healthy."""
    out = make_console(stderr=False)
    st = _testbed(state_dir, instance).status()
    if as_json:
        typer.echo(json.dumps(st.to_dict(), indent=2))
    elif not st.exists:
        out.print(f"no testbed in {st.state_dir}")
        if st.other_state_dir:
            out.print(f"(a testbed is up in {st.other_state_dir}: use --state-dir)")
    else:
        out.print(_table(st))
        if st.healthy:
            out.print(f"[green]healthy[/]: {len(st.hosts)} hosts")
        else:
            out.print("[red]not healthy[/]: " + "; ".join(st.problems()), soft_wrap=True)
    if not st.healthy:
        # SystemExit, not typer.Exit: the root app runs click with standalone_mode=False,
        # which turns typer.Exit into a return value.
        raise SystemExit(1)


def register(app: typer.Typer) -> None:
    """Add the ``testbed`` verb group to the root app."""
    app.add_typer(testbed_app, name="testbed")
