"""``corral notify``: where a corral server (corral serve) pushes its jobs' events:
webhooks (signed JSON) and chat or mail through apprise, over its API (admin).

A secret never goes on the command line: a webhook's shared secret and an apprise
URL (it holds the service's credentials) are read from an environment variable or
a file.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from corral.cli.remote import DEFAULT_SERVER, JsonOpt, ServerOpt, TokenFileOpt, connect, print_json
from corral.client import notify as api
from corral.console import make_console
from corral.errors import ConfigError

EVENT_HELP = (
    "An event it wants (repeatable; default: all): started, queued_started, finished, "
    "failed, hang, host_lost, restarted, healed."
)
EventsOpt = Annotated[
    list[str] | None, typer.Option("--events", "--event", metavar="EVENT", help=EVENT_HELP)
]
IdArg = Annotated[str, typer.Argument(metavar="ID", help="The target's id.", show_default=False)]


def _secret(env: str | None, file: str | None, what: str, env_opt: str, file_opt: str) -> str:
    """The value of environment variable ``env`` or the content of ``file``."""
    if bool(env) == bool(file):
        raise ConfigError(f"give the {what} with {env_opt} VAR or {file_opt} FILE", option=env_opt)
    if env:
        value = os.environ.get(env, "")
        if not value:
            raise ConfigError(f"environment variable {env} is not set or empty", option=env_opt)
        return value.strip()
    assert file is not None
    try:
        value = Path(file).expanduser().read_text().strip()
    except OSError as exc:
        raise ConfigError(f"cannot read {file}: {exc.strerror}", option=file_opt) from exc
    if not value:
        raise ConfigError(f"{file} is empty", option=file_opt)
    return value


def _body(events: list[str] | None, **fields: str) -> dict[str, Any]:
    body: dict[str, Any] = dict(fields)
    if events:
        body["events"] = [e for item in events for e in item.split(",") if e]
    return body


def add_webhook(
    url: Annotated[str, typer.Argument(metavar="URL", help="http(s) URL the events go to.")],
    secret_env: Annotated[
        str | None,
        typer.Option(
            "--secret-env", metavar="VAR", help="Environment variable holding the secret."
        ),
    ] = None,
    secret_file: Annotated[
        str | None, typer.Option("--secret-file", metavar="FILE", help="File holding the secret.")
    ] = None,
    events: EventsOpt = None,
    as_json: JsonOpt = False,
    server: ServerOpt = DEFAULT_SERVER,
    token_file: TokenFileOpt = None,
) -> None:
    """Add a webhook: each event POSTed as JSON, signed with the shared secret
    (X-Corral-Signature: sha256=HMAC of the body), retried with backoff."""
    secret = _secret(secret_env, secret_file, "shared secret", "--secret-env", "--secret-file")
    with connect(server, token_file) as client:
        hook = api.add(client, "webhook", _body(events, url=url, secret=secret))
    _added(hook, as_json)


def add_chat(
    url_env: Annotated[
        str | None,
        typer.Option(
            "--url-env", metavar="VAR", help="Environment variable holding the apprise URL."
        ),
    ] = None,
    url_file: Annotated[
        str | None, typer.Option("--url-file", metavar="FILE", help="File holding the apprise URL.")
    ] = None,
    events: EventsOpt = None,
    as_json: JsonOpt = False,
    server: ServerOpt = DEFAULT_SERVER,
    token_file: TokenFileOpt = None,
) -> None:
    """Add a chat or mail target: an apprise URL (slack://, discord://, msteams://,
    mailto://, ...), one line per event with the job page's link."""
    url = _secret(url_env, url_file, "apprise URL", "--url-env", "--url-file")
    with connect(server, token_file) as client:
        hook = api.add(client, "chat", _body(events, url=url))
    _added(hook, as_json)


def _added(hook: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print_json(hook)
        return
    sys.stdout.write(f"added {hook['kind']} {hook['id']} ({hook['url']}): {_events(hook)}\n")


def _events(hook: dict[str, Any]) -> str:
    return ", ".join(hook["events"])


def _lister(kind: str) -> Any:
    def list_targets(
        as_json: JsonOpt = False,
        server: ServerOpt = DEFAULT_SERVER,
        token_file: TokenFileOpt = None,
    ) -> None:
        with connect(server, token_file) as client:
            hooks = api.targets(client, kind)
        if as_json:
            print_json(hooks)
            return
        table = Table(title_justify="left")
        for column in ("id", "url", "events", "pending"):
            table.add_column(column, overflow="fold")
        for h in hooks:
            table.add_row(h["id"], h["url"], _events(h), str(h["pending"]))
        make_console(stderr=False).print(table)

    list_targets.__doc__ = f"List the server's {kind} targets (no secrets)."
    return list_targets


def _remover(kind: str) -> Any:
    def remove(
        hook_id: IdArg, server: ServerOpt = DEFAULT_SERVER, token_file: TokenFileOpt = None
    ) -> None:
        with connect(server, token_file) as client:
            api.remove(client, kind, hook_id)
        sys.stdout.write(f"removed {kind} {hook_id}\n")

    remove.__doc__ = f"Remove a {kind} target and its delivery log."
    return remove


def _logger(kind: str) -> Any:
    def deliveries(
        hook_id: IdArg,
        limit: Annotated[int, typer.Option("--limit", metavar="N", min=1, max=1000)] = 50,
        as_json: JsonOpt = False,
        server: ServerOpt = DEFAULT_SERVER,
        token_file: TokenFileOpt = None,
    ) -> None:
        with connect(server, token_file) as client:
            log = api.deliveries(client, kind, hook_id, limit)
        if as_json:
            print_json(log)
            return
        table = Table(title_justify="left")
        for column in ("id", "time", "event", "job", "state", "tries", "status", "error"):
            table.add_column(column, overflow="fold")
        for d in log:
            when = time.strftime("%m-%d %H:%M:%S", time.localtime(d["last_try"] or d["created"]))
            status = "-" if d["status_code"] is None else str(d["status_code"])
            table.add_row(str(d["id"]), when, d["event"], d["job_id"] or "-", d["state"],
                          str(d["attempts"]), status, d["last_error"] or "")  # fmt: skip
        make_console(stderr=False).print(table)

    deliveries.__doc__ = f"A {kind} target's delivery log, newest first."
    return deliveries


ADDRESS_KINDS = ("loopback", "private", "link_local")


def addresses(
    allow: Annotated[
        list[str] | None,
        typer.Option(
            "--allow",
            metavar="KIND",
            help="Allow this kind of address besides public ones (repeatable): loopback, "
            "private, link_local (169.254.0.0/16, fe80::/10, cloud metadata). Replaces "
            "the rule.",
        ),
    ] = None,
    public_only: Annotated[
        bool, typer.Option("--public-only", help="Allow public addresses only.")
    ] = False,
    as_json: JsonOpt = False,
    server: ServerOpt = DEFAULT_SERVER,
    token_file: TokenFileOpt = None,
) -> None:
    """Show or set which addresses webhooks may reach (default: public, loopback and
    private; link-local and metadata addresses only when allowed here)."""
    kinds = [k for item in allow or [] for k in item.replace("-", "_").split(",") if k]
    unknown = sorted(set(kinds) - set(ADDRESS_KINDS))
    if unknown:
        raise ConfigError(
            f"unknown address kind {', '.join(unknown)}: choose from {', '.join(ADDRESS_KINDS)}",
            option="--allow",
        )
    if public_only and kinds:
        raise ConfigError("give --allow KIND or --public-only, not both", option="--public-only")
    with connect(server, token_file) as client:
        if kinds or public_only:
            rule = api.set_address_rule(client, kinds)
        else:
            rule = api.address_rule(client)
    if as_json:
        print_json(rule)
        return
    allowed = ", ".join(["public", *rule["allow"]])
    print(f"notifications may reach: {allowed} addresses")


notify_app = typer.Typer(
    name="notify",
    help="Webhooks and chat/mail notifications of a corral server's job events (corral serve).",
    no_args_is_help=True,
    rich_markup_mode="rich",
)


def register(app: typer.Typer) -> None:
    """Add the ``notify`` group (webhook and chat: add, list, rm, log; addresses) to
    ``app``."""
    webhook = typer.Typer(help="Webhooks: signed JSON POSTs.", no_args_is_help=True)
    chat = typer.Typer(help="Chat and mail through apprise URLs.", no_args_is_help=True)
    webhook.command("add")(add_webhook)
    chat.command("add")(add_chat)
    for group, kind in ((webhook, "webhook"), (chat, "chat")):
        group.command("list")(_lister(kind))
        group.command("rm")(_remover(kind))
        group.command("log")(_logger(kind))
    notify_app.add_typer(webhook, name="webhook")
    notify_app.add_typer(chat, name="chat")
    notify_app.command("addresses")(addresses)
    app.add_typer(notify_app, name="notify")
