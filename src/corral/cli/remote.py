"""What the clients of ``corral serve`` (``corral job``, ``corral machine``) share:
the server and token options, and the connection."""

from __future__ import annotations

import json
import sys
from typing import Annotated, Any

import typer

from corral.client import DEFAULT_SERVER, Client, plain_http_warning, read_token
from corral.console import make_console
from corral.job.output import say

__all__ = [
    "DEFAULT_SERVER",
    "JobArg",
    "JsonOpt",
    "ServerOpt",
    "TokenFileOpt",
    "connect",
    "print_json",
]
_C = "Server"
ServerOpt = Annotated[
    str,
    typer.Option(
        "--server",
        metavar="URL",
        envvar="CORRAL_SERVER",
        help="The corral serve to talk to.",
        rich_help_panel=_C,
    ),
]
TokenFileOpt = Annotated[
    str | None,
    typer.Option(
        "--token-file",
        metavar="FILE",
        envvar="CORRAL_TOKEN_FILE",
        help="File holding the server's token (default: $CORRAL_TOKEN, else "
        "~/.local/share/corral/token).",
        rich_help_panel=_C,
    ),
]
JobArg = Annotated[str, typer.Argument(metavar="JOB", help="The job id.", show_default=False)]
JsonOpt = Annotated[bool, typer.Option("--json", help="Machine-readable output.")]


def print_json(data: Any) -> None:
    """``data`` as indented JSON on stdout."""
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")


def connect(server: str, token_file: str | None) -> Client:
    """A client of ``server`` with the token; a warning first when the token would
    travel in the clear."""
    token = read_token(token_file)
    warning = plain_http_warning(server)
    if warning:
        say(make_console(), f"warning: {warning}", "yellow")
    return Client(server, token)
