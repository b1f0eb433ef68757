"""The server's token (``CORRAL_TOKEN`` or a token file, never the command line) and
whether sending it to a server is safe."""

from __future__ import annotations

import ipaddress
import os
from urllib.parse import urlsplit

from corral.contract import SERVER_TOKEN_ENV as TOKEN_ENV
from corral.errors import ConfigError
from corral.paths import token_path


def read_token(token_file: str | None) -> str:
    """The token: from ``token_file`` when given, else ``CORRAL_TOKEN``, else the
    server's default token file."""
    token = None if token_file else os.environ.get(TOKEN_ENV, "").strip()
    if token:
        return token
    path = token_path(token_file)
    try:
        token = path.read_text().strip()
    except FileNotFoundError:
        raise ConfigError(
            f"no token: {path} does not exist; set CORRAL_TOKEN or --token-file (the "
            "server shows its token with `corral serve --print-token`)"
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}", option="--token-file") from exc
    if not token:
        raise ConfigError(f"{path} is empty", option="--token-file")
    return token


def is_loopback(url: str) -> bool:
    """Whether ``url`` names this machine (``localhost``, 127.0.0.0/8, ``::1``)."""
    return is_loopback_host(urlsplit(url).hostname or "")


def is_loopback_host(host: str) -> bool:
    """Whether the host name or address ``host`` is this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def plain_http_warning(url: str) -> str | None:
    """The warning for sending the token to ``url`` in the clear (plain http to
    another machine); None when it is https or this machine."""
    if urlsplit(url).scheme != "http" or is_loopback(url):
        return None
    return (
        f"sending the server's token over plain http to {urlsplit(url).hostname}: anyone on "
        "the path can read it and run jobs as the server's user (use https, e.g. behind a "
        "TLS proxy, or an SSH tunnel to 127.0.0.1)"
    )
