"""``corral serve``: the REST API and the web page over a persistent store.

Jobs dispatched through it run in their own supervisor processes, so stopping or
restarting the server never stops training (it re-attaches on start).
"""

from __future__ import annotations

import ipaddress
import sys
from pathlib import Path
from typing import Annotated

import typer

from corral.console import make_console
from corral.errors import ConfigError

_S = "Server"
_M = "Machines"
#: corral.api.hardening.MAX_REQUEST_BYTES (not imported here: it drags in FastAPI)
MAX_REQUEST_BYTES = 4 * 1024 * 1024


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def serve(
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
) -> None:
    """Serve the REST API: machines, planning, dispatch, status, logs, queue.

    Every route but /healthz needs `Authorization: Bearer <token>`; the token is made
    on first start and shown by --print-token.
    """
    from corral.api.auth import default_token_file, load_or_create_token

    token_path = Path(token_file).expanduser() if token_file else default_token_file()
    token = load_or_create_token(token_path)
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
    if not _loopback(host) and not tls_cert and not insecure_http:
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
    from corral.store import open_store

    store = open_store(db)
    settings = ServerSettings(
        run_dir=Path(run_dir).expanduser().resolve(),
        ssh_config=ssh_config,
        accept_new_host_keys=accept_new_host_keys,
        insecure_no_host_key_check=insecure_no_host_key_check,
        plugins_dir=Path(plugins_dir).resolve() if plugins_dir else None,
        health_interval=health_interval,
    )
    app = create_app(Services.build(store, settings), token, max_request_bytes=max_request_bytes)
    console = make_console()
    scheme = "https" if tls_cert else "http"
    if not _loopback(host) and not tls_cert:
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
    """Add ``serve`` to the root app."""
    app.command("serve")(serve)
