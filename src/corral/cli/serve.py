"""``corral serve``: the REST API and the web page over a persistent store, and
``corral serve user add|list|revoke|limit``: its users, ``corral serve audit``: its
audit log, and ``corral serve gc``: old jobs' events and run dirs trimmed.

Jobs dispatched through it run in their own supervisor processes, so stopping or
restarting the server never stops training (it re-attaches on start).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer

from corral.client.token import is_loopback_host
from corral.console import make_console
from corral.errors import ConfigError
from corral.paths import token_path

_T = TypeVar("_T")
_S = "Server"
_M = "Machines"
#: corral.api.hardening.MAX_REQUEST_BYTES (not imported here: it drags in FastAPI)
MAX_REQUEST_BYTES = 4 * 1024 * 1024


def serve(
    ctx: typer.Context,
    host: Annotated[
        str,
        typer.Option(
            "--host",
            metavar="ADDR",
            envvar="CORRAL_SERVE_HOST",
            help="Address to bind (loopback by default).",
            rich_help_panel=_S,
        ),
    ] = "127.0.0.1",
    port: Annotated[
        int,
        typer.Option(
            "--port",
            metavar="PORT",
            envvar="CORRAL_SERVE_PORT",
            min=1,
            max=65535,
            rich_help_panel=_S,
        ),
    ] = 8765,
    db: Annotated[
        str | None,
        typer.Option(
            "--db",
            metavar="URL",
            envvar="CORRAL_DB",
            help="sqlite:///PATH (default: ~/.local/share/corral/corral.db) or "
            "postgresql+psycopg://USER@HOST:PORT/DB.",
            rich_help_panel=_S,
        ),
    ] = None,
    run_dir: Annotated[
        str,
        typer.Option(
            "--run-dir",
            metavar="DIR",
            envvar="CORRAL_RUN_DIR",
            help="Where jobs' logs and results go (as for corral run).",
            rich_help_panel=_S,
        ),
    ] = "runs",
    token_file: Annotated[
        str | None,
        typer.Option(
            "--token-file",
            metavar="FILE",
            envvar="CORRAL_TOKEN_FILE",
            help="The API token (made on first start, mode 0600). Default: "
            "~/.local/share/corral/token.",
            rich_help_panel=_S,
        ),
    ] = None,
    print_token: Annotated[
        bool,
        typer.Option(
            "--print-token",
            help="Print the API token (making it if needed) and exit.",
            rich_help_panel=_S,
        ),
    ] = False,
    tls_cert: Annotated[
        str | None, typer.Option("--tls-cert", metavar="FILE", rich_help_panel=_S)
    ] = None,
    tls_key: Annotated[
        str | None, typer.Option("--tls-key", metavar="FILE", rich_help_panel=_S)
    ] = None,
    insecure_http: Annotated[
        bool,
        typer.Option(
            "--insecure-http",
            help="Serve plain HTTP on a non-loopback address (the token and every job's "
            "data in clear text): only on a network you trust.",
            rich_help_panel=_S,
        ),
    ] = False,
    forwarded_allow_ips: Annotated[
        str | None,
        typer.Option(
            "--forwarded-allow-ips",
            metavar="IPS",
            envvar="CORRAL_FORWARDED_ALLOW_IPS",
            help="Behind a TLS proxy: the proxy addresses (comma-separated, or *) whose "
            "X-Forwarded-Proto/-For are trusted (https there makes the session cookie "
            "Secure). Default: none.",
            rich_help_panel=_S,
        ),
    ] = None,
    max_request_bytes: Annotated[
        int,
        typer.Option(
            "--max-request-bytes",
            metavar="BYTES",
            envvar="CORRAL_MAX_REQUEST_BYTES",
            min=1024,
            help="Largest request body accepted (a larger one is a 413).",
            rich_help_panel=_S,
        ),
    ] = MAX_REQUEST_BYTES,
    plugins_dir: Annotated[
        str | None,
        typer.Option(
            "--plugins-dir",
            metavar="DIR",
            help="Plugins a job may name (DIR/NAME/main.py).",
            rich_help_panel=_S,
        ),
    ] = None,
    ssh_config: Annotated[
        str | None,
        typer.Option(
            "--ssh-config",
            metavar="FILE",
            envvar="CORRAL_SSH_CONFIG",
            help="OpenSSH config used to reach machines.",
            rich_help_panel=_M,
        ),
    ] = None,
    accept_new_host_keys: Annotated[
        bool,
        typer.Option(
            "--accept-new-host-keys",
            help="Trust a machine's host key on first connection.",
            rich_help_panel=_M,
        ),
    ] = False,
    insecure_no_host_key_check: Annotated[
        bool,
        typer.Option(
            "--insecure-no-host-key-check",
            help="Skip host key verification (unsafe).",
            rich_help_panel=_M,
        ),
    ] = False,
    public_url: Annotated[
        str | None,
        typer.Option(
            "--public-url",
            metavar="URL",
            envvar="CORRAL_PUBLIC_URL",
            help="The server's address as its users reach it, for the job links in "
            "notifications (default: the address it serves on).",
            rich_help_panel=_S,
        ),
    ] = None,
    health_interval: Annotated[
        float,
        typer.Option(
            "--health-interval",
            metavar="SECONDS",
            min=0,
            help="Check every machine's health and load this often (0: only when asked).",
            rich_help_panel=_M,
        ),
    ] = 30.0,
    max_queued: Annotated[
        int,
        typer.Option(
            "--max-queued",
            metavar="N",
            min=0,
            max=1_000_000,
            help="Jobs one user may have queued at once (one more is refused with 429); "
            "per user: corral serve user limit NAME --queued N.",
            rich_help_panel=_S,
        ),
    ] = 1000,
    tracking_allow: Annotated[
        list[str] | None,
        typer.Option(
            "--tracking-allow",
            metavar="PATH|URL",
            help="Where users' tracking targets may write or connect besides their job's "
            "run dir (repeatable): an absolute path, or a URL prefix such as "
            "http://mlflow:5000. Admins are not held to it.",
            rich_help_panel=_S,
        ),
    ] = None,
) -> None:
    """Serve the REST API: machines, planning, dispatch, status, logs, queue.

    Every route but /healthz needs `Authorization: Bearer <token>` of a user; the
    server's own token (the user admin's) is made on first start and shown by
    --print-token; `corral serve user add` makes more.
    """
    if ctx.invoked_subcommand is not None:
        return
    token_path, token = _server_token(token_file)
    if print_token:
        sys.stdout.write(token + "\n")
        return
    if bool(tls_cert) != bool(tls_key):
        raise ConfigError("give both --tls-cert and --tls-key", option="--tls-cert")
    for path, option in ((tls_cert, "--tls-cert"), (tls_key, "--tls-key")):
        if path and not Path(path).is_file():
            raise ConfigError(f"{path} not found", option=option)
    if plugins_dir and not Path(plugins_dir).is_dir():
        raise ConfigError(f"{plugins_dir} is not a directory", option="--plugins-dir")
    if not is_loopback_host(host) and not tls_cert and not insecure_http:
        raise ConfigError(
            f"serving on {host} without TLS would send the token and every job's data in "
            "clear text: give --tls-cert/--tls-key, or serve on 127.0.0.1 behind a TLS "
            "proxy (--forwarded-allow-ips) or an SSH tunnel, or accept it with --insecure-http",
            option="--host",
        )

    import uvicorn

    from corral.api.app import create_app
    from corral.api.services import Services
    from corral.service.settings import ServerSettings
    from corral.service.trust import parse_allow
    from corral.store import open_store

    store = open_store(db)
    settings = ServerSettings(
        run_dir=Path(run_dir).expanduser().resolve(),
        ssh_config=ssh_config,
        accept_new_host_keys=accept_new_host_keys,
        insecure_no_host_key_check=insecure_no_host_key_check,
        plugins_dir=Path(plugins_dir).resolve() if plugins_dir else None,
        health_interval=health_interval,
        max_queued=max_queued,
        tracking_allow=parse_allow(tracking_allow or ()),
        public_url=public_url or f"{'https' if tls_cert else 'http'}://{host}:{port}",
    )
    app = create_app(Services.build(store, settings), token, max_request_bytes=max_request_bytes)
    console = make_console()
    scheme = "https" if tls_cert else "http"
    if not is_loopback_host(host) and not tls_cert:
        console.print(
            f"warning: serving on {host} without TLS: the token and every job's data cross "
            "the network in clear text (use --tls-cert/--tls-key, or an SSH tunnel)",
            style="bold yellow",
            markup=False,
            soft_wrap=True,
        )
    console.print(
        f"corral serve: {scheme}://{host}:{port} (store {store.url}; token in {token_path}, "
        "shown by `corral serve --print-token`)",
        markup=False,
        soft_wrap=True,
    )
    _log_to_stderr()
    try:
        uvicorn.run(
            app,
            host=host,
            port=port,
            ssl_certfile=tls_cert,
            ssl_keyfile=tls_key,
            proxy_headers=bool(forwarded_allow_ips),
            forwarded_allow_ips=forwarded_allow_ips or "",
            log_level="warning",
            access_log=False,
        )
    finally:
        store.close()


def _server_token(token_file: str | None) -> tuple[Path, str]:
    """The token file's path and the server's token (made when missing)."""
    from corral.service.tokenfile import load_or_create_token

    path = token_path(token_file)
    return path, load_or_create_token(path)


_DB = Annotated[
    str | None,
    typer.Option("--db", metavar="URL", envvar="CORRAL_DB", help="The server's store."),
]
_TOKEN_FILE = Annotated[
    str | None,
    typer.Option(
        "--token-file",
        metavar="FILE",
        envvar="CORRAL_TOKEN_FILE",
        help="The server's token file (its token is the user admin's).",
    ),
]
_NAME = Annotated[str, typer.Argument(metavar="NAME", help="The user's name.")]


class _Users:
    """The user service over the store, the server's admin made first; the changes
    made inside are audited as the command ``corral serve <command>``."""

    def __init__(self, db: str | None, token_file: str | None, command: str = "") -> None:
        from corral.service.audit import RequestAudit, open_request
        from corral.service.users import UserService
        from corral.store import open_store

        self.store = open_store(db)
        self.users = UserService(self.store)
        self.users.ensure_admin(_server_token(token_file)[1])
        self.audit = open_request(RequestAudit("CLI", f"corral serve {command}".strip()))

    def __enter__(self) -> Any:
        self.audit.__enter__()
        return self.users

    def __exit__(self, *exc: object) -> None:
        self.audit.__exit__(None, None, None)
        self.store.close()


def user_add(
    name: _NAME,
    role: Annotated[
        str, typer.Option("--role", metavar="admin|user|viewer", help="What they may do.")
    ] = "user",
    db: _DB = None,
    token_file: _TOKEN_FILE = None,
) -> None:
    """Add a user and print their token (shown this once: only its hash is stored)."""
    from pydantic import ValidationError

    from corral.service.users import Role, UserIn

    roles = [r.value for r in Role]
    if role not in roles:
        raise ConfigError(f"unknown role {role!r}: one of {', '.join(roles)}", option="--role")
    try:
        body = UserIn(name=name, role=Role(role))
    except ValidationError as exc:
        raise ConfigError(
            f"invalid user name {name!r}: letters, digits, '.', '_', '-' (at most 64)",
            option="NAME",
        ) from exc
    with _Users(db, token_file, f"user add {name}") as users:
        created = _service_call(lambda: users.add(body, by=_cli_actor()))
    console = make_console(stderr=True)
    console.print(
        f"added {created.name} ({created.role.value}); their token, shown this once:",
        markup=False,
    )
    sys.stdout.write(created.token + "\n")


def user_list(db: _DB = None, token_file: _TOKEN_FILE = None) -> None:
    """List the users, their roles and limits (never a token)."""
    import time

    with _Users(db, token_file) as users:
        rows = users.list_users()
    console = make_console(stderr=False)
    for u in rows:
        limits = ", ".join(
            f"{what} {n}" for what, n in (("jobs", u.max_jobs), ("machines", u.max_machines)) if n
        )
        revoked = (
            f"  revoked {time.strftime('%Y-%m-%d %H:%M', time.localtime(u.revoked))}"
            if u.revoked
            else ""
        )
        line = f"{u.name:<20} {u.role.value:<7} {'limit ' + limits if limits else ''}{revoked}"
        console.print(line.rstrip(), markup=False)


def user_revoke(name: _NAME, db: _DB = None, token_file: _TOKEN_FILE = None) -> None:
    """Revoke a user's token (their jobs stay theirs; the web sessions end)."""
    with _Users(db, token_file, f"user revoke {name}") as users:
        _service_call(lambda: users.revoke(name, by=_cli_actor()))
    make_console(stderr=False).print(f"revoked {name}", markup=False)


def user_limit(
    name: _NAME,
    jobs: Annotated[
        str | None,
        typer.Option("--jobs", metavar="N|none", help="Running jobs at most (none: no limit)."),
    ] = None,
    machines: Annotated[
        str | None,
        typer.Option(
            "--machines",
            metavar="M|none",
            help="Machines their running jobs hold at most (none: no limit).",
        ),
    ] = None,
    queued: Annotated[
        str | None,
        typer.Option(
            "--queued",
            metavar="Q|default",
            help="Jobs they may have queued (default: the server's --max-queued).",
        ),
    ] = None,
    db: _DB = None,
    token_file: _TOKEN_FILE = None,
) -> None:
    """Set a user's limits: only the ones given change, the others stay as they are."""
    from corral.service.users import LimitsIn

    given = {
        field: _limit_value(value, option, clear)
        for field, value, option, clear in (
            ("jobs", jobs, "--jobs", "none"),
            ("machines", machines, "--machines", "none"),
            ("queued", queued, "--queued", "default"),
        )
        if value is not None
    }
    if not given:
        raise ConfigError("give --jobs, --machines or --queued", option="--jobs")
    body = LimitsIn.model_validate(given)
    with _Users(db, token_file, f"user limit {name}") as users:
        out = _service_call(lambda: users.set_limits(name, body, by=_cli_actor()))
    queued_cap = "server default" if out.max_queued is None else out.max_queued
    make_console(stderr=False).print(
        f"{out.name}: jobs {out.max_jobs if out.max_jobs is not None else 'unlimited'}, "
        f"machines {out.max_machines if out.max_machines is not None else 'unlimited'}, "
        f"queued {queued_cap}",
        markup=False,
    )


def _limit_value(value: str, option: str, clear: str) -> int | None:
    """A limit option's value: a count from 0 to 1,000,000, or ``clear`` (None)."""
    if value.strip().lower() == clear:
        return None
    try:
        number = int(value)
    except ValueError:
        number = -1
    if not 0 <= number <= 1_000_000:
        raise ConfigError(
            f"{option} {value!r}: a whole number from 0 to 1000000, or {clear}", option=option
        )
    return number


def audit(
    user: Annotated[
        str | None, typer.Option("--user", metavar="NAME", help="Only this user's entries.")
    ] = None,
    limit: Annotated[int, typer.Option("--limit", metavar="N", min=1, max=1000)] = 50,
    offset: Annotated[int, typer.Option("--offset", metavar="N", min=0)] = 0,
    as_json: Annotated[bool, typer.Option("--json", help="The page as JSON.")] = False,
    db: _DB = None,
) -> None:
    """Show the audit log, newest first: who changed what, before and after."""
    import json
    import time

    from corral.service.audit import AuditLog
    from corral.store import open_store

    with open_store(db) as store:
        page = AuditLog(store).page(user=user, limit=limit, offset=offset)
    if as_json:
        sys.stdout.write(page.model_dump_json(indent=2) + "\n")
        return
    console = make_console(stderr=False)
    for e in page.entries:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(e.time))
        what = e.action or f"{e.method} {e.path}"
        target = f" {e.target}" if e.target else ""
        change = ""
        if e.before is not None or e.after is not None:
            change = f"  {json.dumps(e.before)} -> {json.dumps(e.after)}"
        count = f" x{e.count}" if e.count > 1 else ""
        line = f"{when}  {e.user or '-':<16} {what}{target}  [{e.status}]{count}"
        console.print(line + change, markup=False, soft_wrap=True)
    console.print(f"{len(page.entries)} of {page.total} entries", markup=False)


def _cli_actor() -> str:
    from corral.service.audit import cli_actor

    return cli_actor()


def gc(
    older_than: Annotated[
        str | None,
        typer.Option(
            "--older-than",
            metavar="AGE",
            help="Trim jobs that ended longer ago than this: 30d, 12h, 90m, 2w (needed).",
        ),
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="List what would be deleted; delete nothing.")
    ] = False,
    db: _DB = None,
    run_dir: Annotated[
        str,
        typer.Option(
            "--run-dir",
            metavar="DIR",
            envvar="CORRAL_RUN_DIR",
            help="The server's run dir (only job dirs under it are deleted).",
        ),
    ] = "runs",
) -> None:
    """Delete the stored events and run dirs of jobs that ended before AGE ago (never a
    running, queued or planned job; the job's row and summary stay)."""
    import time

    from corral.errors import ServiceError
    from corral.service.gc import collect, parse_age
    from corral.store import open_store

    if older_than is None:
        raise ConfigError("give --older-than AGE (e.g. 30d)", option="--older-than")
    try:
        age = parse_age(older_than)
    except ServiceError as exc:
        raise ConfigError(str(exc), option="--older-than") from exc
    from corral.service.audit import RequestAudit, open_request

    with open_store(db) as store, open_request(RequestAudit("CLI", "corral serve gc")):
        report = collect(store, Path(run_dir).expanduser(), age, dry_run=dry_run, by=_cli_actor())
    console = make_console(stderr=False)
    for j in report.jobs:
        ended = time.strftime("%Y-%m-%d %H:%M", time.localtime(j.ended))
        where = f"{j.run_dir} ({j.bytes / 2**20:.1f} MiB)" if j.run_dir else "no run dir"
        note = f"  kept: {j.kept}" if j.kept else ""
        console.print(
            f"{j.job_id}  {j.state:<9} ended {ended}  {j.events} events  {where}{note}",
            markup=False,
            soft_wrap=True,
        )
    verb = "would delete" if dry_run else "deleted"
    console.print(
        f"{verb} {report.events} events and {report.run_dirs} run dirs "
        f"({report.bytes / 2**20:.1f} MiB) of {len(report.jobs)} jobs that ended before "
        f"{time.strftime('%Y-%m-%d %H:%M', time.localtime(report.cutoff))}",
        markup=False,
        soft_wrap=True,
    )


def _service_call(call: Callable[[], _T]) -> _T:
    """A service's refusal (unknown user, duplicate) as a one-line ConfigError."""
    from corral.errors import ServiceError

    try:
        return call()
    except ServiceError as exc:
        raise ConfigError(str(exc), option="NAME") from exc


def _log_to_stderr() -> None:
    """The server's own INFO lines (jobs re-attached or lost at start, failures of its
    background rounds) on stderr."""
    import logging

    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s corral serve: %(message)s"))
    logger = logging.getLogger("corral.serve")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)


def register(app: typer.Typer) -> None:
    """Add ``serve``, ``serve user ...`` and ``serve gc`` to the root app."""
    serve_app = typer.Typer(
        invoke_without_command=True, no_args_is_help=False, rich_markup_mode="rich"
    )
    serve_app.callback()(serve)
    user_app = typer.Typer(help="The server's users: roles, tokens, limits.", no_args_is_help=True)
    user_app.command("add")(user_add)
    user_app.command("list")(user_list)
    user_app.command("revoke")(user_revoke)
    user_app.command("limit")(user_limit)
    serve_app.add_typer(user_app, name="user")
    serve_app.command("audit")(audit)
    serve_app.command("gc")(gc)
    app.add_typer(serve_app, name="serve")
