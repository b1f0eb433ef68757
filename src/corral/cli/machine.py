"""``corral machine``: the machines of ``corral serve`` (SSH hosts, or simulated
nodes on the server's own machine), registered, listed, checked and removed through
its API (:mod:`corral.client.machines`)."""

from __future__ import annotations

import sys
import time
from typing import Annotated, Any

import typer
from rich.table import Table
from rich.text import Text

from corral.cli.jobview import state_text
from corral.cli.remote import DEFAULT_SERVER, JsonOpt, ServerOpt, TokenFileOpt, connect, print_json
from corral.client import machines as api
from corral.console import make_console
from corral.errors import ConfigError
from corral.job.output import say
from corral.words import plural

ADD_HINT = "add one with `corral machine add NAME --host ADDR` (or `corral machine add --local`)"
_S = "SSH"
NamesArg = Annotated[
    list[str], typer.Argument(metavar="NAME...", help="Machine names.", show_default=False)
]


def _labels(pairs: list[str] | None) -> dict[str, str]:
    labels: dict[str, str] = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ConfigError(f"{pair!r} is not KEY=VALUE", option="--label")
        labels[key] = value
    return labels


def _where(m: dict[str, Any]) -> str:
    if m.get("local"):
        return "local (simulated)"
    where = str(m["host"]) + (f":{m['port']}" if m.get("port") else "")
    return f"{m['user']}@{where}" if m.get("user") else where


def _facts(m: dict[str, Any]) -> str:
    """What the last check saw: CPUs, GPUs, latency; or the error."""
    if m["status"] == "offline":
        return str(m.get("last_error") or "does not answer")
    if m["status"] == "unknown":
        return "never checked"
    caps = m.get("capabilities") or {}
    facts = [f"{caps.get('cpus', '?')} CPUs"]
    if caps.get("gpu_count"):
        facts.append(f"{caps['gpu_count']} GPUs")
    if m.get("latency_ms") is not None:
        facts.append(f"{m['latency_ms']:.0f} ms")
    if m.get("running_jobs"):
        facts.append("running " + ", ".join(m["running_jobs"]))
    return ", ".join(facts)


def _table(machines: list[dict[str, Any]]) -> Table:
    table = Table(title_justify="left")
    for column in ("name", "status", "address", "slots", "seen", "details"):
        table.add_column(column, overflow="fold")
    for m in machines:
        seen = m.get("last_seen")
        table.add_row(
            m["name"],
            state_text(str(m["status"])),
            _where(m),
            str(m["slots"]),
            "-" if seen is None else time.strftime("%H:%M:%S", time.localtime(seen)),
            _facts(m),
        )
    return table


def _line(m: dict[str, Any], verb: str) -> Text:
    text = Text(f"machine {m['name']} ({_where(m)}, {plural(m['slots'], 'slot')}) {verb}: ")
    text.append_text(state_text(str(m["status"])))
    text.append(f", {_facts(m)}")
    return text


def add(
    name: Annotated[
        str | None,
        typer.Argument(
            metavar="[NAME]",
            help="Its name (log prefixes show it); default for --local: local-0, local-1, "
            "... (as local:N names its nodes)",
            show_default=False,
        ),
    ] = None,
    host: Annotated[
        str | None,
        typer.Option(
            "--host",
            metavar="ADDR",
            help="Address or ssh alias (default: NAME).",
            rich_help_panel=_S,
        ),
    ] = None,
    ssh_user: Annotated[
        str | None, typer.Option("--ssh-user", metavar="USER", rich_help_panel=_S)
    ] = None,
    ssh_port: Annotated[
        int | None, typer.Option("--ssh-port", metavar="N", min=1, max=65535, rich_help_panel=_S)
    ] = None,
    ssh_key: Annotated[
        str | None,
        typer.Option(
            "--ssh-key",
            metavar="FILE",
            help="Private key, a path on the server.",
            rich_help_panel=_S,
        ),
    ] = None,
    ssh_password_env: Annotated[
        str | None,
        typer.Option(
            "--ssh-password-env",
            metavar="VAR",
            help="NAME of the server's environment variable holding the SSH password "
            "(never the password itself).",
            rich_help_panel=_S,
        ),
    ] = None,
    local: Annotated[
        bool,
        typer.Option("--local", help="A simulated node on the server's own machine (as local:N)."),
    ] = False,
    slots: Annotated[
        int, typer.Option("--slots", metavar="N", min=1, help="Ranks it runs by default.")
    ] = 1,
    label: Annotated[
        list[str] | None,
        typer.Option("--label", metavar="KEY=VALUE", help="A label (repeatable)."),
    ] = None,
    python: Annotated[
        str | None,
        typer.Option("--python", metavar="PATH", help="Its interpreter (default: found there)."),
    ] = None,
    no_check: Annotated[
        bool, typer.Option("--no-check", help="Do not check it (connect, capabilities) now.")
    ] = False,
    as_json: JsonOpt = False,
    server: ServerOpt = DEFAULT_SERVER,
    token_file: TokenFileOpt = None,
) -> None:
    """Register a machine: an SSH host (NAME --host ADDR), or a simulated node on the
    server's machine (--local); then check it.

    The check connects, reads its CPUs and GPUs and says whether it is online; a machine
    that does not answer stays registered (corral machine check NAME tries again).
    """
    if not local and not name:
        raise ConfigError(
            "a machine needs a name: corral machine add NAME --host ADDR (or --local for a "
            "simulated node on the server's machine)",
            option="NAME",
        )
    ssh = {"host": host, "user": ssh_user, "port": ssh_port, "key_path": ssh_key}
    ssh["password_env"] = ssh_password_env
    if local and any(v is not None for v in ssh.values()):
        given = [k for k, v in ssh.items() if v is not None]
        raise ConfigError(
            f"a local machine is a simulated node on the server: {', '.join(given)} do not apply",
            option="--local",
        )
    body: dict[str, Any] = {"slots": slots, "labels": _labels(label), "local": local}
    body.update({k: v for k, v in {"name": name, "python": python, **ssh}.items() if v})
    with connect(server, token_file) as client:
        machine = api.add(client, body)
        if not local and not no_check:
            machine = api.check(client, [machine["id"]])[0]
    if as_json:
        print_json(machine)
        return
    console = make_console()
    console.print(_line(machine, "added"), soft_wrap=True)
    if machine["status"] == "offline":
        say(console, f"corral machine check {machine['name']} tries again", "yellow")


def list_machines(
    as_json: JsonOpt = False,
    server: ServerOpt = DEFAULT_SERVER,
    token_file: TokenFileOpt = None,
) -> None:
    """List the server's machines: status (as last checked), address, slots, what they
    have or why they do not answer."""
    with connect(server, token_file) as client:
        machines = api.list_machines(client)
    if as_json:
        print_json(machines)
    elif not machines:
        say(make_console(), f"no machines: {ADD_HINT}", "yellow")
    else:
        make_console(stderr=False).print(_table(machines))


def check(
    names: Annotated[
        list[str] | None,
        typer.Argument(
            metavar="[NAME]...", help="Machine names (default: all).", show_default=False
        ),
    ] = None,
    as_json: JsonOpt = False,
    server: ServerOpt = DEFAULT_SERVER,
    token_file: TokenFileOpt = None,
) -> None:
    """Check machines now (connect, CPUs, GPUs, load), every one by default, in parallel.

    Exit code: 0 when every machine checked answers, 1 when one does not.
    """
    with connect(server, token_file) as client:
        machines = api.check(client, names)
    if as_json:
        print_json(machines)
    elif not machines:
        say(make_console(), f"no machines: {ADD_HINT}", "yellow")
    else:
        make_console(stderr=False).print(_table(machines))
    raise typer.Exit(1 if any(m["status"] == "offline" for m in machines) else 0)


def remove(
    names: NamesArg,
    server: ServerOpt = DEFAULT_SERVER,
    token_file: TokenFileOpt = None,
) -> None:
    """Remove machines (one a job runs on is refused: stop the job first)."""
    with connect(server, token_file) as client:
        for name in names:
            api.remove(client, name)
            sys.stdout.write(f"removed machine {name}\n")


machine_app = typer.Typer(
    name="machine",
    help="Register, list, check and remove the machines of a corral server (corral serve).",
    no_args_is_help=True,
    rich_markup_mode="rich",
)


def register(app: typer.Typer) -> None:
    """Add the ``machine`` group (add, list, check, rm) to ``app``."""
    machine_app.command("add")(add)
    machine_app.command("list")(list_machines)
    machine_app.command("check")(check)
    machine_app.command("rm")(remove)
    app.add_typer(machine_app, name="machine")
